"""Writes as many 64 MiB files as it can, to fill the disk."""
total = 0
try:
    for i in range(1000):
        with open(f"fill{i}", "wb") as f:
            for _ in range(64):
                f.write(b"\0" * (1 << 20)); total += 1 << 20
except OSError:
    pass
def solve(): return 1 if total > (200 << 20) else 0
