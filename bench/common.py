"""What the benchmark scripts share: the environment of every GPU process, a free port, and step-time statistics.

Run a script as `python bench/NAME.py`: its own directory is then on `sys.path`, and `from common import ...` finds this file.
"""
from __future__ import annotations
import math, statistics, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))   # grpo_nb from this checkout
from grpo_nb.actors import GPU_SAFETY_ENV, free_port  # noqa: E402,F401  (one definition each, in the library; free_port is re-exported)

GPU_ENV:dict[str, str] = {**GPU_SAFETY_ENV, "PYTHONUNBUFFERED": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "TOKENIZERS_PARALLELISM": "false",
                          "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "DS_BUILD_OPS": "0"}
"The environment of every benchmark process: the library's GPU safety settings (NVLink multicast off, NCCL without cuMem), H100/H200 kernels only, no hub, Ray without tokens."

def step_stats(xs:list[float]) -> dict:
    "Mean, median and p90 (nearest rank) of a list of step times; None each for an empty list."
    if not xs: return {"mean": None, "median": None, "p90": None}
    s = sorted(xs)
    return {"mean": statistics.fmean(s), "median": statistics.median(s), "p90": s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]}
