"""Tries to raise its resource limits back to unlimited."""
import resource
raised = []
for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_DATA"):
    res = getattr(resource, name)
    try:
        resource.setrlimit(res, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)); raised.append(name)
    except (ValueError, OSError):
        pass
print(raised)
def solve(): return 1 if raised else 0
