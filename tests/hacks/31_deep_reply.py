"""Writes its own reply: a list nested a million levels deep, then one with a bad tag, an int with a non-ASCII digit
and a 5000-digit int, straight onto the reply channel, then stops answering.
# tests: ["assert add(2, 3) == 5", "assert add(10, 20) == 30"]
"""
import os, time
_n = [0]
def add(a, b):
    _n[0] += 1
    lines = [b'{"v": ' + b"[" * 1000000 + b"]" * 1000000 + b', "m": []}', b'{"v": ["obj", "x"], "m": []}',
             '{"v": ["i", "²"], "m": []}'.encode(), b'{"v": ["i", "' + b"9" * 5000 + b'"], "m": []}']
    for line in lines: os.write(6, line + b"\n")
    time.sleep(30)
