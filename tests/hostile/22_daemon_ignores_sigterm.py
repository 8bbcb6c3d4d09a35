"""Double-forks a daemon in its own session that ignores SIGTERM and lives forever; the program itself exits."""
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        while True: time.sleep(0.05)
    os._exit(0)
def solve(): return 0
