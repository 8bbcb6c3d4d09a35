"""Sleeps far past the deadline (no CPU used, so only the wall clock can stop it)."""
import time
time.sleep(3600)
def solve(): return 1
