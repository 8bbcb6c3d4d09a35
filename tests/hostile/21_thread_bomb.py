"""Starts threads until it cannot, each sleeping forever."""
import threading, time
n = 0
try:
    while n < 100000:
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start(); n += 1
except RuntimeError:
    pass
print(n)
def solve(): return 1 if n > 1000 else 0
