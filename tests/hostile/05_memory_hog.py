"""Allocates 16 GiB at once."""
x = bytearray(16 << 30)
def solve(): return 1
