"""Unbounded recursion with the recursion limit lifted, through C code (json of a deeply nested dict): the C stack overflows."""
import json, sys
sys.setrecursionlimit(10 ** 8)
nested = {}
for _ in range(10 ** 5):
    nested = {"a": nested}
json.dumps(nested)
def solve(): return 1
