#!/usr/bin/env python3
"""The self-correction trainer on one GPU: its measured peak memory against the planner's prediction, and its step time.

Runs `grpo_nb.self_correction.train` itself (sampling with a KV cache, micro-batched updates of policy, critic and
guidance, Polyak target, `MasterAdamW`) with models of the seed-004 shapes and random weights (`random:<shape>`:
memory depends on the shape, not on the weights; the GPU machines have no model hub). The peak is
torch.cuda.max_memory_allocated on the GPU from the end of step 1 to the end of the run (steps 2.. hold a whole
cycle: sampling, every role's update, the guidance's included), next to device_totals(sc_memory(cfg))["cuda:0"].
Step times: every step after the first, with mean, median and p90.
With --profile (on by default on GPUs) the last step of a run is profiled (torch.profiler, CUDA activity) and left out of the
step times; the record then holds the share of that step's wall time spent copying between the CPU and the GPUs
(`transfer_share`: Memcpy HtoD/DtoH) and between the GPUs (`gpu_gpu_share`: Memcpy PtoP/DtoD and NCCL kernels).
The overlap/offload configs (3-8) measure `overlap: threads` against `none`, and `optimizer_offload` on and off, on the
preset's two-GPU placement.

On a GPU node (repo on PYTHONPATH; torch and transformers, plus fastcore and pyyaml):
    python bench/sc_memory_gpu.py --out bench/results/sc_memory_gpu.json
On this CPU machine: python bench/sc_memory_gpu.py --smoke --out /tmp/sc_memory_smoke.json   (tiny models, no memory figures)

Each config runs in its own process with a time limit; the results file is rewritten after each one.
"""
import argparse, json, multiprocessing as mp, sys, time, traceback
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import step_stats  # shared by the bench scripts

ON_GPU = {"*": "cuda:0", "reference": "cpu", "target_critic": "cpu"}   # trained roles on the GPU, frozen ones in CPU memory
CONFIGS = [   # most important first
    ("1B policy and guidance, 0.5B critic, fp32 masters, all five on the GPU",
     dict(policy="random:Llama-3.2-1B", guidance="random:Llama-3.2-1B", critic="random:Qwen2.5-0.5B", optimizer_offload=False,
          placement={"*": "cuda:0"}, steps=3, episodes=8, max_new_tokens=64)),
    ("3B policy, 1B guidance, 0.5B critic, optimizer states in CPU memory",
     dict(policy="random:Llama-3.2-3B", guidance="random:Llama-3.2-1B", critic="random:Qwen2.5-0.5B", optimizer_offload=True)),
    ("seed004-score-2gpu: 3B policy and guidance, 1B critic, the preset's placement on 2 GPUs, optimizer states in CPU memory",
     dict(policy="random:Llama-3.2-3B", guidance="random:Llama-3.2-3B", critic="random:Llama-3.2-1B", optimizer_offload=True,
          placement={"policy": "cuda:0", "critic": "cuda:0", "guidance": "cuda:1", "reference": "cpu", "target_critic": "cpu"},
          steps=3, episodes=8, max_new_tokens=64)),
]
SEED2 = {"policy": "cuda:0", "critic": "cuda:0", "guidance": "cuda:1", "value": "cuda:1", "reference": "cpu", "target_critic": "cpu"}
for offload in (False, True):   # step time with and without overlap, with and without offload: 1B models, so both fit without offload
    for overlap in ("none", "threads"):
        CONFIGS.append((f"2 GPUs, 1B policy and guidance, 0.5B critic and value function, offload {'on' if offload else 'off'}, overlap {overlap}",
                        dict(policy="random:Llama-3.2-1B", guidance="random:Llama-3.2-1B", critic="random:Qwen2.5-0.5B", value_model="random:Qwen2.5-0.5B",
                             optimizer_offload=offload, overlap=overlap, placement=SEED2, steps=5, episodes=8, max_new_tokens=64, guidance_every=1)))
for overlap in ("none", "threads"):   # the seed004-score-2gpu preset whole: value function, fullgrad_coef, offload
    CONFIGS.append((f"seed004-score-2gpu with its value function and fullgrad_coef 0.01, overlap {overlap}",
                    dict(policy="random:Llama-3.2-3B", guidance="random:Llama-3.2-3B", critic="random:Llama-3.2-1B", value_model="random:Llama-3.2-1B",
                         optimizer_offload=True, overlap=overlap, fullgrad_coef=0.01, placement=SEED2, steps=4, episodes=8, max_new_tokens=64, guidance_every=1)))
COMMON = dict(placement=ON_GPU, steps=4, episodes=16, micro_batch=4, max_new_tokens=128, grad_ckpt=True, dtype="bfloat16",
              lr=1e-6, guidance_every=2, tau=0.005)
SMOKE = dict(policy="tiny-arith", guidance="tiny-arith", critic="tiny-1kv-tied", placement={"*": "cpu"}, steps=3, episodes=4,
             micro_batch=2, max_new_tokens=8, grad_ckpt=True, dtype="float32", value_model="tiny-1kv-tied", overlap="threads", fullgrad_coef=0.01)

def stats(xs:list) -> dict:
    "Mean, median and p90 of the step times, as every benchmark computes them (bench/common.py)."
    return {f"step_s_{k}": v for k, v in step_stats(xs).items()} if xs else {}

def shares(prof, step_s:float) -> dict:
    "Shares of one profiled step's wall time spent in CPU-GPU copies and in GPU-GPU copies or NCCL kernels (device time, seconds)."
    ev = prof.key_averages()
    t = lambda *keys: sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in ev
                          if any(k in e.key for k in keys)) / 1e6
    h2d, p2p = t("Memcpy HtoD", "Memcpy DtoH"), t("Memcpy PtoP", "Memcpy DtoD", "nccl", "ncclKernel")
    return {"profiled_step_s": step_s, "transfer_s": h2d, "gpu_gpu_s": p2p, "transfer_share": h2d / step_s, "gpu_gpu_share": p2p / step_s}

def one(name:str, kw:dict, q, profile:bool=True) -> None:
    "Run one config in this process and put its record on the queue."
    try:
        import torch
        from torch.profiler import ProfilerActivity, schedule
        from grpo_nb.self_correction import SCConfig, device_totals, sc_memory, train
        cfg = SCConfig(**kw)
        cuda = torch.cuda.is_available() and any(d != "cpu" for d in cfg.placement.values())
        devs = sorted({d for d in cfg.placement.values() if d.startswith("cuda")}) if cuda else []
        peak, prof = {}, None
        if profile and cuda and cfg.steps >= 3:   # the last step, left out of the step times
            prof = torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule(wait=cfg.steps - 1, warmup=0, active=1))
            prof.start()
        def on_step(step, models):
            for d in devs:
                torch.cuda.synchronize(d)
                if step == 1: torch.cuda.reset_peak_memory_stats(d)
                peak[d] = torch.cuda.max_memory_allocated(d)
            if prof is not None: prof.step()
        res = train(cfg, on_step=on_step, digests=False)
        if prof is not None: prof.stop()
        times = [m["step_s"] for m in res["metrics"][1:len(res["metrics"]) - (prof is not None)]]
        prof_rec = shares(prof, res["metrics"][-1]["step_s"]) if prof is not None else {}
        pred = device_totals(sc_memory(cfg))
        rec = {"name": name, "config": asdict(cfg), "device": torch.cuda.get_device_name() if cuda else "cpu",
               "step_s_all": times, **stats(times), "steps": len(res["metrics"]),
               "measured_bytes": peak.get("cuda:0"), "predicted_bytes": pred.get("cuda:0") if cuda else None,
               "measured_by_device": peak, "predicted_by_device": {d: pred.get(d) for d in devs},
               "predicted_host_bytes": pred.get("cpu"), "params": res["params"],
               "reward2": [m["reward2"] for m in res["metrics"]], "versions": {"torch": torch.__version__},
               "overlap": cfg.overlap, "optimizer_offload": cfg.optimizer_offload, "gpus": len(devs), **prof_rec}
    except Exception as e:
        rec = {"name": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    q.put(rec)

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results/sc_memory_gpu.json")
    p.add_argument("--smoke", action="store_true", help="tiny models on the CPU (checks the script, measures nothing)")
    p.add_argument("--limit-s", type=float, default=240, help="time limit of one config")
    p.add_argument("--only", type=int, nargs="*", help="indices of CONFIGS to run (default: all)")
    p.add_argument("--merge", action="store_true", help="keep the records of --out whose name is not run now")
    p.add_argument("--no-profile", action="store_true", help="do not profile the last step (transfer and GPU-GPU shares)")
    a = p.parse_args(argv)
    configs = [("smoke: tiny models on the CPU", {**SMOKE})] if a.smoke else [(n, {**COMMON, **kw}) for i, (n, kw) in enumerate(CONFIGS) if a.only is None or i in a.only]
    out, records = Path(a.out), []
    if a.merge and out.exists(): records = [r for r in json.loads(out.read_text())["records"] if r["name"] not in {n for n, _ in configs}]
    ctx = mp.get_context("spawn")
    for name, kw in configs:
        q = ctx.Queue(); proc = ctx.Process(target=one, args=(name, kw, q, not a.no_profile)); t0 = time.time(); proc.start()
        try: rec = q.get(timeout=a.limit_s)
        except Exception: rec = {"name": name, "error": f"no result within {a.limit_s:.0f} s (exit code {proc.exitcode})"}
        proc.join(10)
        if proc.is_alive(): proc.kill()
        rec["wall_s"] = round(time.time() - t0, 1)
        records.append(rec); print(json.dumps({k: v for k, v in rec.items() if k not in ("traceback", "config")}), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"bench": "sc_memory_gpu", "records": records}, indent=1))
    return 0 if all("error" not in r for r in records) else 1

if __name__ == "__main__": sys.exit(main())
