"""Reads stdin to the end, then tries the controlling terminal and the harness's descriptors."""
import os, sys
data = sys.stdin.read()
got = []
for fd in (0, 3):
    try: got.append(os.read(fd, 100))
    except OSError: pass
try: tty = os.open("/dev/tty", os.O_RDWR)
except OSError: tty = None
def solve(): return 1 if data or any(got) or tty is not None else 0
