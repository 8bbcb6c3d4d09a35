"""Where `grpo_nb train` spends its launch: the seconds from its process's start until it starts Ray (`startup/launch_s`
of a run's first metrics line), by part, with the prompts' token ids read from the cache (`warm`, a start that has seen
the same data and model before) and without them (`cold`, an empty prompt cache: the tokenizer's import and the
tokenizing, which a run does once Ray is up: timed apart, after the launch, as `after_ray_s`). The command runs as users
run it, in a process of its own, and stops where Ray would start. Each part is timed around the function that does it,
with nothing else changed: the import of torch, the rest of the trainer's imports, the config, the data (the rows, then
their tokens looked up in the cache), and the checks before Ray (layout, engine library, memory plan); what is left is
Python's own start and the command line.
The two modes alternate, so that drift on the machine falls on both; a cold launch gets a new, empty prompt cache (the
built tiny models are shared), and the warm ones share a cache filled by one untimed launch.

Each launch's parts and, per mode and part, their mean, median and p90. Results: bench/results/launch_profile.json
(`--out` for another file).

    python bench/launch_profile.py                               # the demo preset on this machine, 5 launches a mode
    python bench/launch_profile.py --config default --set model.name_or_path=DIR --set cluster.device=cuda   # a GPU node
"""
from __future__ import annotations
import argparse, json, os, platform, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import step_stats   # noqa: E402  (mean, median, p90)

PARTS = ("import torch", "other imports", "config", "data", "checks before Ray", "rest")
MODES = {"cold": "an empty prompt cache: the tokenizer is imported and the prompts tokenized",
         "warm": "the prompts' token ids read from the cache a launch before left"}


class _AtRay(Exception):
    "Raised where the run would start Ray: the launch ends there."


def _timed(fn, part:str, parts:dict):
    "`fn`, adding its seconds to `parts[part]`."
    def wrap(*a, **k):
        t = time.perf_counter()
        try: return fn(*a, **k)
        finally: parts[part] = parts.get(part, 0.0) + time.perf_counter() - t
    return wrap


def _child(argv:list[str]) -> None:
    "One launch in this process, each part timed; print the parts as JSON."
    parts, t = {}, time.perf_counter()
    import torch   # noqa: F401  (the trainer's first heavy import)
    parts["import torch"], t = time.perf_counter() - t, time.perf_counter()
    import grpo_nb.trainer as T
    parts["other imports"] = time.perf_counter() - t
    def at_ray(*a, **k): raise _AtRay()
    T.start_ray, T.load_config = at_ray, _timed(T.load_config, "config", parts)
    T.Run.load_data, T.Run.start = _timed(T.Run.load_data, "data", parts), _timed(T.Run.start, "checks before Ray", parts)
    run = {}
    T.Run.start = (lambda start: lambda self, *a, **k: (run.setdefault("run", self), start(self, *a, **k))[1])(T.Run.start)
    try: T.train_command(*argv)
    except _AtRay: pass
    launch_s = T.process_age_s()   # as the run's own `startup/launch_s` reads it
    parts["rest"] = launch_s - sum(parts.values())
    before = "transformers" in sys.modules
    t = time.perf_counter()
    r = run["run"]; r.wait_data()   # a cold cache's tokenizing, which a run starts once Ray is up: done here, after the launch
    print(json.dumps({"launch_s": launch_s, "parts_s": parts, "prompts_cached": r.prompts_cached, "transformers_before_ray": before,
                      "transformers_imported": "transformers" in sys.modules, "after_ray_s": time.perf_counter() - t}))


def launch_once(config:str, overrides:list[str], cache:Path, timeout:float) -> dict:
    "One launch in a subprocess with `cache` as its cache directory; its parts, or why it has none."
    with tempfile.TemporaryDirectory(prefix="launch-profile-") as td:
        argv = [config, f"--logging.output_dir={td}/run", "--checkpoint.resume=none", *overrides]
        env = {**os.environ, "GRPO_NB_CACHE": str(cache),
               "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
        r = subprocess.run([sys.executable, __file__, "--child", "--", *argv], capture_output=True, text=True, timeout=timeout, env=env)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode or not lines: return {"launch_s": None, "error": (r.stderr or r.stdout)[-1500:]}
    return json.loads(lines[-1])


def cache_like(root:Path) -> Path:
    "A new cache directory that shares the user's built tiny models but has no prompts."
    from grpo_nb.tiny import default_cache_dir
    d = Path(tempfile.mkdtemp(prefix="launch-cache-", dir=root))
    (default_cache_dir() / "tiny").mkdir(parents=True, exist_ok=True)
    (d / "tiny").symlink_to(default_cache_dir() / "tiny", target_is_directory=True)
    return d


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="demo", help="preset or YAML file (default: demo, the tiny policy on the CPU)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="a config override (repeatable)")
    ap.add_argument("--repeats", type=int, default=5, help="launches")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a launch may take")
    ap.add_argument("--out", default=str(ROOT / "bench/results/launch_profile.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a, rest = ap.parse_known_args(argv)
    if a.child: return _child([x for x in rest if x != "--"])
    if a.repeats < 1: ap.error(f"--repeats must be at least 1 (got {a.repeats})")
    overrides = [f"--{s.removeprefix('--')}" for s in a.set]
    with tempfile.TemporaryDirectory(prefix="launch-caches-") as root:
        warm = cache_like(Path(root))
        first = launch_once(a.config, overrides, warm, a.timeout)   # fills the warm cache; not counted
        if first.get("launch_s") is None: raise SystemExit(f"the first launch failed: {first['error'][-600:]}")
        runs = [{"mode": m, **launch_once(a.config, overrides, cache_like(Path(root)) if m == "cold" else warm, a.timeout)}
                for _ in range(a.repeats) for m in MODES]   # alternating
    ok = [r for r in runs if r.get("launch_s") is not None]
    stats = {m: {k: step_stats([r[k] if k in ("launch_s", "after_ray_s") else r["parts_s"].get(k) for r in ok if r["mode"] == m])
                 for k in ("launch_s", *PARTS, "after_ray_s")} for m in MODES}
    out = {"config": a.config, "overrides": overrides, "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "python": platform.python_version(), "parts": list(PARTS), "modes": MODES, "runs": runs, "stats": stats,
           "loadavg_1m_end": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(out, indent=1))
    for m in MODES:
        for k, st in stats[m].items():
            print(f"{m:>5} {k:>18}: " + " / ".join(f"{st[q]:.2f}" if st[q] is not None else "-" for q in ("mean", "median", "p90")) + " s (mean / median / p90)")
    print(f"wrote {a.out}" + (f"; {len(runs) - len(ok)} launch(es) failed: {next(r for r in runs if r.get('launch_s') is None)['error'][-300:]}" if len(ok) < len(runs) else ""))


if __name__ == "__main__":
    sys.exit(main())
