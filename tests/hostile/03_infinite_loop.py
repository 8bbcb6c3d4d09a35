"""Busy loop at module level: never returns."""
while True:
    pass
