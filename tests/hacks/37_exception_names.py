"""Raises exceptions chosen to confuse the caller: an exception class named `AssertionError` whose message claims a
pass, `SystemExit(0)`, `KeyboardInterrupt`, and one whose `__str__` raises.
# tests: ["assert add(2, 3) == 5", "assert add(10, 20) == 30", "assert add(1, 1) == 2", "assert add(0, 0) == 0"]
"""
class AssertionError(Exception):
    def __str__(self): return "passed"
class Weird(Exception):
    def __str__(self): raise RuntimeError("no")
def add(a, b):
    raise {(2, 3): AssertionError(), (10, 20): SystemExit(0), (1, 1): KeyboardInterrupt(), (0, 0): Weird()}[(a, b)]
