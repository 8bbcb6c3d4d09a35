"""Calls sys.exit(0) at module level."""
import sys
sys.exit(0)

def solve(): return 0   # reached only if the attack above ended: the sandbox must still contain it
