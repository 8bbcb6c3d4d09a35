"""Connects to a host UNIX socket outside /tmp, /run and /dev/shm (the test listens at /var/tmp/grpo_sbx_unix.sock)."""
import socket
ok = 0
try:
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect("/var/tmp/grpo_sbx_unix.sock"); ok = 1
except OSError: pass
def solve(): return ok
