"""Writes to stderr forever, bypassing Python's buffers."""
import os
while True:
    os.write(2, b"e" * 65536)

def solve(): return 0   # reached only if the attack above ended: the sandbox must still contain it
