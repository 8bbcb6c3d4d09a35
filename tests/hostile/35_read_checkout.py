"""Looks for the checkout, its data/, the virtual environment's packages and the project itself: none may be visible."""
import os, sys
found = []
for p in ["@REPO@", "@REPO@/data/mbpp_tiny.jsonl", "@REPO@/.venv", "/work", "/scratch", "/home", "/etc/passwd", "/etc/shadow"]:
    if os.path.exists(p): found.append(p)
for name in ("grpo_nb", "fastcore", "numpy", "torch", "pip"):
    try: __import__(name); found.append(name)
    except ImportError: pass
for d in sys.path + ["/usr/lib", "/usr/local/lib"]:   # site-packages directories may exist, but empty
    for root, dirs, files in os.walk(d):
        if root.endswith(("site-packages", "dist-packages")) and (dirs or files): found.append(root)
        if root.count("/") > d.count("/") + 1: dirs[:] = []
def solve(): return 1 if found else 0
