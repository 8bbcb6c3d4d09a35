"""Replaces itself with a process whose argv is a gigabyte."""
import os, sys
try:
    os.execv(sys.executable, [sys.executable, "-c", "pass"] + ["x" * 100000] * 10000)
except (OSError, MemoryError):
    pass
def solve(): return 0
