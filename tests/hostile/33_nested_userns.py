"""Creates a nested user namespace (a step towards capabilities inside the sandbox)."""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ok = 1 if libc.unshare(0x10000000) == 0 else 0   # CLONE_NEWUSER
def solve(): return ok
