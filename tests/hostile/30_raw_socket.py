"""Opens raw and packet sockets and a listening TCP socket for others to reach."""
import socket
ok = []
for fam, typ in ((socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW)):
    try: socket.socket(fam, typ, 0); ok.append((fam, typ))
    except OSError: pass
def solve(): return 1 if ok else 0
