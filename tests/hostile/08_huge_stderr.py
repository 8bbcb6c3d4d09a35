"""Writes to stderr forever, bypassing Python's buffers."""
import os
while True:
    os.write(2, b"e" * 65536)
