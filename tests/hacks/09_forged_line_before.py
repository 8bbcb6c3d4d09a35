"""Writes forged values for every test first (the first report of a leaf counts), guessing the expected numbers."""
import os, sys
def add(a, b): return a * b + 7   # wrong: fails every test honestly
nonce = None
f = sys._getframe()
while f is not None:
    nonce = f.f_locals.get("nonce", nonce); f = f.f_back
for i in range(8):
    for kind, text in (("passed", ""), ("value", '["b",true]')):
        try: os.write(4, f"{nonce}\t{i}\t{kind}\t{text}\n".encode())
        except OSError: pass
