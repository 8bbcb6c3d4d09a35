"""Pins memory in SysV shared memory segments (they outlive the process and escape its memory limit)."""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
pinned = 0
for _ in range(8):   # 8 x 64 MiB = 512 MiB, twice the test's 256 MiB limit
    sid = libc.shmget(0, 64 << 20, 0o1000 | 0o600)   # IPC_PRIVATE, IPC_CREAT
    if sid < 0: break
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value): break
    ctypes.memset(addr, 1, 64 << 20); libc.shmdt(ctypes.c_void_p(addr)); pinned += 64
def solve(): return 1 if pinned >= 512 else 0
