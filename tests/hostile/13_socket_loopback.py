"""Connects to a listener the test started on the host's loopback."""
import socket
ok = False
for host in ("127.0.0.1", "localhost"):
    try:
        socket.create_connection((host, @PORT@), timeout=1).close(); ok = True
    except OSError:
        pass
def solve(): return 1 if ok else 0
