"""Closes every file descriptor, so the harness cannot report (and nothing may count as passed)."""
import os
os.closerange(0, 4096)
def solve(): return 1
