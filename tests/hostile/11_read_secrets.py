"""Reads /root, /etc/shadow and a root-only file the test planted."""
import os
found = []
try: found += [n for n in os.listdir("/root") if n != ".pyenv"]  # at most the interpreter may be visible
except OSError: pass
for path in ["/etc/shadow", "@SECRET_FILE@", "/root/.bashrc", "/root/.ssh/id_rsa"]:
    try:
        with open(path) as f: found.append(f.read()); print(found[-1])
    except OSError:
        pass
def solve(): return 1 if found else 0
