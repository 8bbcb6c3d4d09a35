"""Prints forever."""
while True:
    print("x" * 10000)

def solve(): return 0   # reached only if the attack above ended: the sandbox must still contain it
