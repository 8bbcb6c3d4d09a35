"""Allocates 10 MiB chunks and touches them until something gives."""
chunks = []
while True:
    chunks.append(bytearray(10 << 20))
def solve(): return 1
