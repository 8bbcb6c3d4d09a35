"""Busy loop at module level: never returns."""
while True:
    pass

def solve(): return 0   # reached only if the attack above ended: the sandbox must still contain it
