"""Prints forever."""
while True:
    print("x" * 10000)
