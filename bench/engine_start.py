"""How long a `VllmEngine` takes to come up from a cold vLLM cache, with the model's class inspected in the engine's
process (`grpo_nb.rollout.register_in_process`, what the engine does) and without it (vLLM's own way: a fresh Python
process inspects the class, once per class and cache directory).

Each start is its own Python process with empty compile caches (`common.COLD_CACHES`: what a new machine, container or
vLLM version sees, and what `bench/e2e_vs_trl.py` gives every run), timed from before `VllmEngine(...)` until the engine is up;
the two modes alternate so that drift on the machine falls on both. Every start's seconds and their mean, median and
p90 per mode. Results: bench/results/engine_start.json (`--out` for another file).

    python bench/engine_start.py                     # CPU: the tiny policy, eager, fp32, 4 starts per mode
    python bench/engine_start.py --model DIR --device cuda --repeats 3   # a GPU node: any local HF checkpoint
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import COLD_CACHES, step_stats   # noqa: E402  (fresh compile caches; mean, median, p90)

MODES = {"in process": "the model's class inspected in the engine's process (what VllmEngine does)",
         "fresh process": "vLLM inspects the class in a fresh Python process (register_in_process switched off)"}


def _child(model:str, device:str, mode:str) -> None:
    "One start in this process: print its seconds as JSON."
    import grpo_nb.rollout as R
    if mode == "fresh process": R.register_in_process = lambda model: []
    kw = dict(enforce_eager=True, dtype="float32") if device == "cpu" else dict(gpu_memory_utilization=0.3)
    t0 = time.perf_counter()
    eng = R.VllmEngine(model, max_model_len=256, **kw)
    print(json.dumps({"seconds": time.perf_counter() - t0, "registered": eng.registered, "phases": eng.load_phases}))


def start_once(model:str, device:str, mode:str, timeout:float) -> dict:
    "One cold start in a subprocess with empty compile caches; its seconds, or why it has none."
    with tempfile.TemporaryDirectory(prefix="engine-start-") as cache:
        env = {**os.environ, **{var: str(Path(cache) / sub) for var, sub in COLD_CACHES.items()}, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, __file__, "--child", mode, "--model", model, "--device", device],
                           capture_output=True, text=True, timeout=timeout, env=env)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode or not lines: return {"mode": mode, "seconds": None, "error": (r.stderr or r.stdout)[-1500:]}
    return {"mode": mode, **json.loads(lines[-1])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="local HF checkpoint (default: the tiny policy, built if missing)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--repeats", type=int, default=4, help="cold starts per mode")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a start may take")
    ap.add_argument("--out", default=str(ROOT / "bench/results/engine_start.json"))
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.repeats < 1: ap.error(f"--repeats must be at least 1 (got {a.repeats})")
    if a.child: return _child(a.model, a.device, a.child)
    from grpo_nb.tiny import tiny_model_dir
    model = a.model or str(tiny_model_dir("tiny-arith"))
    if not (Path(model) / "config.json").exists(): ap.error(f"--model {model}: no config.json there. Fix: a local HF checkpoint directory")
    starts = [start_once(model, a.device, m, a.timeout) for _ in range(a.repeats) for m in MODES]   # alternating
    per = {m: step_stats([s["seconds"] for s in starts if s["mode"] == m and s["seconds"] is not None]) for m in MODES}
    import torch, vllm
    device = torch.cuda.get_device_name() if a.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    out = {"model": "tiny-arith" if not a.model else Path(model).name, "device": device, "vllm": vllm.__version__,
           "modes": MODES, "starts": starts, "stats": per, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(out, indent=1))
    for m in MODES: print(f"{m:>13}: " + " / ".join(f"{per[m][k]:.1f}" if per[m][k] is not None else "-" for k in ("mean", "median", "p90"))
                          + " s (mean / median / p90)")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
