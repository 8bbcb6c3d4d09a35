"""Reads a token the test planted in a 0700 directory under the caller's home (HOME of the service's user)."""
import glob
found = [p for p in glob.glob("/var/tmp/grpo-home-*/private/token") + glob.glob("/home/*/private/token") if open(p).read().startswith("HOME-TOKEN")]
def solve(): return 1 if found else 0
