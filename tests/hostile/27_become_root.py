"""Tries to become root and to gain capabilities."""
import os
try: os.setuid(0)
except OSError: pass
try: os.setgid(0)
except OSError: pass
def solve(): return 1 if os.getuid() == 0 or os.geteuid() == 0 else 0
