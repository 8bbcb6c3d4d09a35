"""Connects to an outside address (TEST-NET-1, never routed) over TCP and UDP, and lists interfaces."""
import socket
ok = False
try:
    socket.create_connection(("192.0.2.1", 80), timeout=1).close(); ok = True
except OSError:
    pass
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("192.0.2.1", 53)); ok = True
except OSError:
    pass
up = [name for _, name in socket.if_nameindex() if name != "lo"]
def solve(): return 1 if ok or up else 0
