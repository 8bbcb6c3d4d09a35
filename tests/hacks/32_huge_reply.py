"""Returns a 64 MB string, so the reply is larger than the receiver reads.
# tests: ["assert add(2, 3) == 5", "assert add(10, 20) == 30"]
"""
def add(a, b): return "5" * (64 << 20)
