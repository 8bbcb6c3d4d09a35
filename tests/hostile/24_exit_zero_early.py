"""Exits with status 0 before any test runs, hoping that counts as passing."""
import os
os._exit(0)

def solve(): return 0   # reached only if the attack above ended: the sandbox must still contain it
