"""Does `learner.allocator=expandable` take effect on this GPU's PyTorch? `grpo_nb.colocate.use_allocator` and
`fixed_segments` as a learner uses them, checked from the CUDA allocator's own segment list (each segment says whether it
is expandable), not from the settings string:

  before        a segment reserved before the switch (the process's default allocator)
  expandable    a segment reserved after `use_allocator("expandable")`: expected expandable
  fixed         a segment reserved inside `fixed_segments()` (the colocated sync's shared buffers): expected not expandable
  after         a segment reserved after leaving `fixed_segments()`: expandable again

The JSON carries each segment's flag, the settings string each step reported, torch's version and the device.
Results: bench/results/allocator_gpu.json.

    python bench/allocator_check.py --out bench/results/allocator_gpu.json     # one GPU, a few seconds
"""
from __future__ import annotations
import argparse, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def new_segment_flags(torch, before:dict, nbytes:int) -> tuple[list, dict, object]:
    """Allocate `nbytes`; return the expandable flags of the segments that appeared or grew (an expandable segment grows in
    place), the segments now known (address: size), and the tensor (kept alive)."""
    t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    segs = torch.cuda.memory._snapshot()["segments"]
    now = {s["address"]: s["total_size"] for s in segs}
    return [bool(s.get("is_expandable", False)) for s in segs if before.get(s["address"], -1) < s["total_size"]], now, t


def check(nbytes:int=256 << 20) -> dict:
    "Each phase's new segments and the settings reported there."
    import torch
    from grpo_nb.colocate import _allocator_settings, fixed_segments, use_allocator
    torch.cuda.init()
    keep, out, seen = [], {}, {}
    def phase(name:str):
        nonlocal seen
        flags, seen, t = new_segment_flags(torch, seen, nbytes)
        keep.append(t)
        out[name] = {"new_segments_expandable": flags, "settings": _allocator_settings()[0]}
    phase("before")
    out["use_allocator_returned"] = use_allocator("expandable")
    phase("expandable")
    with fixed_segments(): phase("fixed")
    phase("after")
    want = {"expandable": True, "fixed": False, "after": True}   # each phase reserved at least one segment, all of this kind
    ok = all(out[k]["new_segments_expandable"] and all(f == v for f in out[k]["new_segments_expandable"]) for k, v in want.items())
    has_getter = hasattr(torch._C, "_accelerator_getAllocatorSettings")
    return {"ok": ok, "phases": out, "torch": torch.__version__, "torch_reports_settings": has_getter,
            "device": torch.cuda.get_device_name(), "bytes_per_allocation": nbytes}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/allocator_gpu.json"))
    a = p.parse_args(argv)
    r = check()
    a.out.write_text(json.dumps(r, indent=1) + "\n")
    print(json.dumps(r, indent=1))
    return 0 if r["ok"] else 1


if __name__ == "__main__": sys.exit(main())
