"""A 7B policy on 4 GPUs, run by `grpo_nb train` from the presets in configs/, with every sync checked bit for bit.

    python bench/scale_4gpu.py --models Qwen2.5-7B,OLMo-2-7B --layouts split,colocated --out bench/results/scale_4gpu.json
    python bench/scale_4gpu.py --smoke --out /tmp/scale_smoke.json      # CPU, tiny model, split layout with TP=2 (here)

Each (model, layout) is one run of `grpo_nb train scale-7b-4gpu-<layout>` on a random-init model of the named shape
(built here from `grpo_nb.memory.ARCHS`: there is no model hub on the GPU machines), with a word-level tokenizer and
random 512-token prompts; the preset's work per step (16 prompts x G=8, 1,024 generated tokens) and
`rollout.verify_every=1`, so after every sync each engine worker's parameters are compared with the learner's, cut
and packed as the worker holds them. While it runs, `nvidia-smi` is polled for every GPU's memory in use; its peak
is recorded next to `grpo_nb plan`'s prediction for the same GPU. After the run, the NCCL broadcast floor for the
synced bytes is timed between the learner's GPU and the engines' GPUs.

Record keys: model, layout, gpus, tp, learners, engines, step_s_all, step_mean_s, step_median_s, step_p90_s (over the
steps after the first two), mfu_per_learner_gpu, sync_s, sync_floor_s, exact_sync (true only when every sync of the
run was bit-identical on every TP worker), max_abs_logprob_diff, logprob_atol, peak_gib_measured, peak_gib_planned,
trl_backend, trl_step_mean_s, speedup_mean, device, rc, error (when it failed), time_split (mean seconds per phase).
"""
from __future__ import annotations
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, threading, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import free_port, step_stats as stats   # noqa: E402  (shared by the bench scripts: free ports, mean/median/p90)
from e2e_vs_trl import SAFE_ENV   # noqa: E402  (the environment every GPU run needs)

LAYOUTS = {"split": dict(gpus=4, learners=2, engines=1, tp=2), "colocated": dict(gpus=4, learners=4, engines=4, tp=1)}
SHAPE = dict(prompts=16, prompt_len=512, G=8, gen=1024, steps=10, warmup=2)
NO_FLOOR = False   # --no-floor
SMOKE = dict(prompts=2, prompt_len=8, G=2, gen=8, steps=4, warmup=1)


def build_model(name:str, out:Path, smoke:bool=False) -> Path:
    "A random-init model of the named shape (bf16 on a GPU) with a word-level tokenizer covering every id (`t<id>`)."
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from grpo_nb.memory import ARCHS, shape_to_hf
    if smoke:
        from grpo_nb.tiny import build_tiny_model
        return Path(build_tiny_model("tiny-untied", out, seed=0))
    if (out / "config.json").exists(): return out
    hf = shape_to_hf(ARCHS[name]) | {"max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    V = hf["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t3"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t2", unk_token="t3")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(out)
    cfg = AutoConfig.for_model(**hf)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    m.save_pretrained(out)
    del m
    return out


class MemoryPoller:
    "Peak memory in use of every GPU (MiB, as `nvidia-smi` reports it), polled every `every` seconds in a thread."
    def __init__(self, every:float=0.5):
        self.every, self.peak, self._stop = every, {}, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                for line in out.strip().splitlines():
                    i, used = (int(x) for x in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0), used)
            except (OSError, ValueError, subprocess.TimeoutExpired): pass
            self._stop.wait(self.every)
    def __enter__(self): self._t.start(); return self
    def __exit__(self, *a): self._stop.set(); self._t.join(5)


def planned_gib(preset:str, over:list[str], layout:str, gpus:int) -> list[float]:
    "`grpo_nb plan --config` of the run: the predicted memory of each GPU (learner GPUs first, then engine GPUs)."
    r = subprocess.run([sys.executable, "-m", "grpo_nb.cli", "plan", "--config", preset, "--json", *over],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    p = json.loads(r.stdout)
    if layout == "colocated": return [p["colocated"]["peak_bytes"] / 2**30] * gpus
    L = LAYOUTS[layout]["learners"]
    return [p["learner"]["total_bytes"] / 2**30] * L + [p["engine"]["budget_bytes"] / 2**30] * (gpus - L)


def _floor_worker(rank:int, world:int, port:int, devs:list[int], nbytes:int, iters:int, q):
    import torch, torch.distributed as dist
    dev = torch.device("cuda", devs[rank])
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    buf, tick, times = torch.empty(nbytes, dtype=torch.uint8, device=dev), torch.zeros(1, device=dev), []
    for i in range(iters + 1):
        dist.broadcast(tick, 0); torch.cuda.synchronize()   # lines the ranks up (a barrier would guess devices by rank)
        t0 = time.perf_counter(); dist.broadcast(buf, 0); torch.cuda.synchronize()
        if i: times.append(time.perf_counter() - t0)
    if rank == 0: q.put(statistics.median(times))
    dist.destroy_process_group()


def sync_floor(nbytes:int, devs:list[int], iters:int=5) -> float|None:
    "Median time of one NCCL broadcast of `nbytes` from `devs[0]` to the other GPUs: the floor of a sync of those bytes."
    import torch.multiprocessing as mp
    ctx, port = mp.get_context("spawn"), free_port()
    q = ctx.Queue()
    ps = [ctx.Process(target=_floor_worker, args=(r, len(devs), port, devs, nbytes, iters, q)) for r in range(len(devs))]
    for p in ps: p.start()
    for p in ps: p.join(120)
    for p in ps:
        if p.is_alive(): p.kill()
    return q.get(timeout=5) if not q.empty() else None


def run_one(model:str, layout:str, smoke:bool, tmp:Path, models_dir:Path, timeout:float, device:str, logs:Path|None=None, on_record=None) -> dict:
    L, sh = LAYOUTS[layout], (SMOKE if smoke else SHAPE)
    preset = f"scale-7b-4gpu-{layout}"
    model_dir = build_model(model, models_dir / model, smoke)
    V = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    import random
    rng = random.Random(0)
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(f"t{rng.randrange(10, V)}" for _ in range(sh["prompt_len"])), "answer": "0"}) + "\n"
                            for _ in range(256)) if not smoke else
                    "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(10)))
    over = [f"--model.name_or_path={model_dir}", f"--data.train_path={data}", f"--total_steps={sh['steps']}",
            f"--data.max_prompt_tokens={sh['prompt_len'] + 8}", f"--rollout.prompts_per_step={sh['prompts']}",
            f"--rollout.num_samples_per_prompt={sh['G']}", f"--rollout.max_new_tokens={sh['gen']}", "--reward.functions={arith: 1.0}",
            f"--logging.output_dir={tmp / 'run'}", "--logging.tensorboard=false", "--logging.progress_bar=false",
            "--checkpoint.every_steps=0", "--checkpoint.export_hf=false", "--checkpoint.resume=none"]
    if smoke:
        over += ["--cluster.device=cpu", "--cluster.gpus_per_node=0", "--cluster.gpu=", "--model.dtype=float32", "--model.gradient_checkpointing=false",
                 "--rollout.enforce_eager=true", "--rollout.kv_cache_mib=64", "--rollout.gpu_memory_utilization=0.5", "--learner.pack_length=0"]
    elif "H200" in device: over += ["--cluster.gpu=H200"]
    planned = planned_gib(preset, over, layout, L["gpus"]) if not smoke else []
    cmd = [sys.executable, "-m", "grpo_nb.cli", "train", preset, *over]
    t0, log = time.perf_counter(), tmp / "train.log"
    with open(log, "w") as f, MemoryPoller() as mem:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **SAFE_ENV})
        try: rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            import signal
            os.killpg(proc.pid, signal.SIGKILL); proc.wait(); rc = "timeout"
    mpath = tmp / "run" / "metrics.jsonl"
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True); shutil.copy(log, logs / f"scale_{model}_{layout}.log")
        if mpath.exists(): shutil.copy(mpath, logs / f"scale_{model}_{layout}_metrics.jsonl")
    recs = [json.loads(l) for l in mpath.read_text().splitlines()] if mpath.exists() else []
    recs = [r for r in recs if "time/step" in r]
    timed = recs[sh["warmup"]:]
    mean = lambda k, rs=timed: statistics.fmean(r[k] for r in rs if r.get(k) is not None) if any(r.get(k) is not None for r in rs) else None
    st = stats([r["time/step"] for r in timed])
    checked = [r for r in recs if "sync/exact" in r]
    out = {"model": model, "layout": layout, "gpus": L["gpus"], "tp": L["tp"], "learners": L["learners"], "engines": L["engines"],
           "smoke": smoke, "step_s_all": [r["time/step"] for r in recs], "timed_steps": len(timed),
           "step_mean_s": st["mean"], "step_median_s": st["median"], "step_p90_s": st["p90"],
           "mfu_per_learner_gpu": mean("mfu"), "sync_s": mean("time/sync"),
           "exact_sync": bool(checked) and len(checked) == len(recs) and all(r["sync/exact"] for r in checked),
           "syncs_checked": len(checked), "checksums_compared": max((r.get("sync/checksums_compared", 0) for r in checked), default=0),
           "max_abs_logprob_diff": max((r["sync/max_abs_logprob_diff"] for r in checked), default=None),
           "logprob_atol": max((r.get("sync/logprob_atol") or 0 for r in checked), default=None), "logprob_atol_form": "4u*max|z|*sqrt(L)",
           "peak_gib_measured": [mem.peak[i] / 1024 for i in sorted(mem.peak)][:L["gpus"]] if not smoke else [],
           "peak_gib_planned": planned, "learner_peak_allocated_gib": max((r.get("peak_gpu_mem_gib", 0) for r in recs), default=None),
           "time_split": {k: mean(k) for k in ("time/generation", "time/wait_rollout", "time/reward", "time/learner", "time/sync",
                                                 "time/verify", "time/sleep", "time/wake")},
           "trl_backend": None, "trl_step_mean_s": None, "speedup_mean": None,
           "rc": rc, "wall_s": time.perf_counter() - t0, "command": f"grpo_nb train {preset} " + " ".join(o for o in over if "/" not in o)}
    if rc != 0:
        out["error"] = f"grpo_nb train exited {rc}: " + "\n".join(l for l in log.read_text().splitlines() if "Warning" not in l)[-3000:]
    if on_record is not None: on_record(out)   # saved before the floor is timed
    if not smoke and recs and not NO_FLOOR:
        from grpo_nb.memory import ARCHS, param_counts
        nbytes = 2 * param_counts(ARCHS[model])["total"]
        devs = [0, 2, 3] if layout == "split" else [0, 1, 2, 3]
        try: out["sync_floor_s"] = sync_floor(nbytes, devs)
        except Exception as e: out["sync_floor_s"], out["floor_error"] = None, repr(e)[:500]
        out["sync_bytes"] = nbytes
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="Qwen2.5-7B", help="comma-separated names of grpo_nb.memory.ARCHS")
    ap.add_argument("--layouts", default="split", help=f"comma-separated, of {list(LAYOUTS)}")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, split layout with TP=2")
    ap.add_argument("--out", default="bench/results/scale_4gpu.json")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per run")
    ap.add_argument("--logs-dir", default=None, help="copy each run's train.log here")
    ap.add_argument("--no-floor", action="store_true", help="skip timing the NCCL floor")
    ap.add_argument("--steps", type=int, default=SHAPE["steps"], help="training steps per run (the first --warmup are not timed)")
    ap.add_argument("--warmup", type=int, default=SHAPE["warmup"], help="steps left out of the statistics")
    ap.add_argument("--models-dir", default="/tmp/scale_models", help="where the random-init models are built (and reused)")
    a = ap.parse_args()
    SHAPE.update(steps=a.steps, warmup=a.warmup)
    global NO_FLOOR
    NO_FLOOR = a.no_floor
    device = "cpu"
    if not a.smoke:
        import torch
        device = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    out = Path(a.out); res = {"records": [], "device": device}
    runs = [("tiny-untied", "split")] if a.smoke else [(m, l) for m in a.models.split(",") for l in a.layouts.split(",")]
    if out.exists():   # keep the records of other runs
        try: res["records"] = [r for r in json.loads(out.read_text()).get("records", []) if (r.get("model"), r.get("layout")) not in runs]
        except (json.JSONDecodeError, KeyError): pass
    for model, layout in runs:
        def save(rec, keep=list(res["records"])):
            rec["device"], rec["time"] = device, time.strftime("%Y-%m-%d %H:%M:%S")
            res["records"] = keep + [rec]
            out.parent.mkdir(parents=True, exist_ok=True); out.write_text(json.dumps(res, indent=1))
        with tempfile.TemporaryDirectory(prefix=f"scale-{layout}-") as d:
            try: rec = run_one(model, layout, a.smoke, Path(d), Path(a.models_dir), a.timeout, device, a.logs_dir and Path(a.logs_dir), save)
            except Exception: rec = {"model": model, "layout": layout, "error": traceback.format_exc()[-2000:]}
        save(rec)
        print(model, layout, {k: rec.get(k) for k in ("step_mean_s", "mfu_per_learner_gpu", "sync_s", "sync_floor_s", "exact_sync",
                                                      "max_abs_logprob_diff", "logprob_atol", "peak_gib_measured", "peak_gib_planned", "rc")},
              (rec.get("error") or "")[-1500:], flush=True)


if __name__ == "__main__":
    main()
