"""Rollout throughput of the engines users run: `grpo_nb.rollout.VllmEngine` (eager and with CUDA graphs) against
`grpo_nb.rollout.HFEngine` (dynamic and static KV cache), on one GPU, a random-init Qwen2.5-0.5B-shaped model,
128-token prompts and 256 generated tokens each (EOS ignored, so every sequence has the same length).

Each engine runs in its own subprocess (start-up included in the record), warms up once, then times `repeats`
`generate` calls for every batch size; records carry every call's time with mean, median and p90.
vLLM's engine core runs in the caller's process, as in the trainer's engine actors; `vllm-graphs-mp` runs it in a
process of its own (vLLM's default), to measure what that choice costs a step (`engine_core` in each record).
The engines decode their completions once at the end (`VllmEngine(detokenize="auto")`); `vllm-graphs-detok` has vLLM
detokenize as it generates, to measure what that costs.

    python bench/rollout_throughput.py --out bench/results/rollout_throughput.json      # on the GPU machine
    python bench/rollout_throughput.py --smoke                                          # CPU-sized, here
    python bench/rollout_throughput.py --engines vllm-graphs,vllm-graphs-mp --out rollout_engine_core.json   # the engine core, in or out of process
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from e2e_vs_trl import MODEL, SMOKE_MODEL, SAFE_ENV, build_model, stats   # one model builder for both benchmarks
from grpo_nb.results import throughput_table

ENGINES = {"vllm-graphs": ("vllm", dict(enforce_eager=False)), "vllm-eager": ("vllm", dict(enforce_eager=True)),
           "vllm-graphs-mp": ("vllm", dict(enforce_eager=False)),
           "vllm-graphs-detok": ("vllm", dict(enforce_eager=False, detokenize="engine")),
           "hf-static": ("transformers", dict(cache="static")), "hf-dynamic": ("transformers", dict(cache="dynamic"))}
ENGINE_CORE = {"vllm-graphs-mp": "1"}
"`VLLM_ENABLE_V1_MULTIPROCESSING` of each engine: vLLM's engine core in a process of its own (`vllm-graphs-mp`, vLLM's default) or, for the others, in the caller's process, as the trainer's engine actors run it (a faster start; whether the steps pay for it is what the pair measures)."


def child(name:str, smoke:bool, sizes:list[int], gen:int, prompt_len:int, repeats:int, budget_s:float, out:Path):
    import random, torch
    from grpo_nb.rollout import HFEngine, SamplingSpec, VllmEngine
    gpu = torch.cuda.is_available() and not smoke
    model = SMOKE_MODEL if smoke else MODEL
    tmp = Path(tempfile.mkdtemp(prefix="rt"))
    rec = {"engine": name, "device": torch.cuda.get_device_name(0) if gpu else "cpu", "smoke": smoke, "gen_tokens": gen,
           **({"engine_core": "own process" if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1" else "in process"} if ENGINES[name][0] == "vllm" else {}),
           "prompt_tokens": prompt_len, "model": model, "batches": []}
    try:
        d = build_model(model, tmp / "model")
        backend, kw = ENGINES[name]
        t0 = time.perf_counter()
        if backend == "vllm":
            eng = VllmEngine(str(d), dtype="bfloat16" if gpu else "float32", gpu_memory_utilization=0.8 if gpu else 0.5,
                             max_model_len=prompt_len + gen + 16, enable_prefix_caching=False,
                             **({} if gpu else {"kv_cache_memory_bytes": 256 << 20, "enforce_eager": True}) | ({"enforce_eager": kw["enforce_eager"]} if gpu else {}),
                             max_num_seqs=max(sizes), detokenize=kw.get("detokenize", "auto"))
        else:
            eng = HFEngine(str(d), device="cuda" if gpu else "cpu", dtype="bfloat16" if gpu else "float32", **kw)
        rec["startup_s"] = time.perf_counter() - t0
        rng = random.Random(0)
        prompt = lambda: [rng.randrange(10, model["vocab_size"]) for _ in range(prompt_len)]
        spec = lambda n, s: SamplingSpec(n=1, max_new_tokens=gen, temperature=1.0, seed=s, ignore_eos=True)
        sync = torch.cuda.synchronize if gpu else (lambda: None)
        eng.generate([prompt() for _ in range(min(sizes))], spec(1, 0)); sync()          # warm-up (CUDA graphs, caches, kernels)
        t_start = time.perf_counter()
        for n in sizes:
            times = []
            for r in range(repeats):
                if time.perf_counter() - t_start > budget_s: break
                ps = [prompt() for _ in range(n)]
                sync(); t = time.perf_counter()
                out_s = eng.generate(ps, spec(n, r + 1)); sync()
                times.append(time.perf_counter() - t)
                assert len(out_s) == n and all(len(s.completion_ids) == gen for s in out_s)
            st = stats(times)
            rec["batches"].append({"sequences": n, "times_s": times, **{f"{k}_s": v for k, v in st.items()},
                                   "tokens_per_s": n * gen / st["mean"] if st["mean"] else None,
                                   "skipped": "budget" if len(times) < repeats else None})
        if gpu: rec["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        eng.close()
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"[-3000:]; traceback.print_exc()
    out.write_text(json.dumps(rec, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default=",".join(ENGINES), help="which engines")
    ap.add_argument("--out", default="", help="results JSON")
    ap.add_argument("--smoke", action="store_true", help="CPU-sized run")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per batch size")
    ap.add_argument("--budget-s", type=float, default=60, help="per engine: stop timing new calls after this many seconds")
    ap.add_argument("--merge", action="store_true", help="keep the records of the other engines already in --out")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    unknown = [e for e in a.engines.split(",") if e not in ENGINES]
    if unknown: raise SystemExit(f"--engines: unknown {unknown}; use a comma-separated subset of {list(ENGINES)}")
    sizes, gen, plen = ([4, 8], 8, 8) if a.smoke else ([64, 512], 256, 128)
    if a.child:
        child(a.child, a.smoke, sizes, gen, plen, a.repeats, a.budget_s, Path(a.out)); return
    out = Path(a.out or ROOT / "bench" / "results" / ("rollout_throughput_smoke.json" if a.smoke else "rollout_throughput.json"))
    env = {**os.environ, **SAFE_ENV,
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    names = a.engines.split(",")
    kept = [r for r in json.loads(out.read_text()).get("records", []) if r.get("engine") not in names] if a.merge and out.exists() else []
    recs = []
    for name in names:
        tmp = Path(tempfile.mkdtemp()) / "r.json"
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", name, "--out", str(tmp), "--repeats", str(a.repeats), "--budget-s", str(a.budget_s)]
        run_env = {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": ENGINE_CORE.get(name, "0")}
        try: rc = subprocess.run(cmd + (["--smoke"] if a.smoke else []), env=run_env, timeout=a.budget_s + 240).returncode
        except subprocess.TimeoutExpired: rc = "timeout"
        rec = json.loads(tmp.read_text()) if tmp.exists() else {"engine": name, "error": f"exited {rc} without a record"}
        rec["wall_s"] = time.perf_counter() - t
        recs.append(rec)
        out.write_text(json.dumps({"records": kept + recs}, indent=1))
        print(f"[{time.strftime('%H:%M:%S')}] {name}: start-up {rec.get('startup_s')} {[(b['sequences'], b['mean_s']) for b in rec.get('batches', [])]} {rec.get('error', '')[:200]}", flush=True)
    print(throughput_table(out))


if __name__ == "__main__":
    main()
