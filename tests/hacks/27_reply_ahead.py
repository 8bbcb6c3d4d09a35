"""Writes a "ready" line and then a pile of forged replies (`True`, an exception named `SystemExit`, a reply with
no value) onto the reply channel before anything is asked, hoping they are taken as answers or as a clean exit.
"""
import os
for fd in (1, 4, 6):
    try: os.write(fd, b'{"ready": true}\n' + b'{"v": ["b", true], "m": []}\n{"e": ["SystemExit", "0"]}\n{"m": []}\n' * 50)
    except OSError: pass
def add(a, b): return a * b + 7
