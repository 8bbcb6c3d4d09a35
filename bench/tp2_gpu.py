"""Weight sync into tensor-parallel vLLM engines, checked after every sync, with `grpo_nb train` itself.

    python bench/tp2_gpu.py --layouts tp2,tp1x2 --out bench/results/tp2_gpu.json     # 4 GPUs (nvidia-h200-x4)
    python bench/tp2_gpu.py --layouts dry --out bench/results/tp2_gpu.json           # 2 GPUs: the same script, TP=1
    python bench/tp2_gpu.py --smoke --out /tmp/tp2_smoke.json                        # CPU, tiny model, here

Each layout is one run of `grpo_nb train` (Ray, DeepSpeed ZeRO-3 learners, real vLLM engines, one-step-off) on a
random-init Qwen2.5-1.5B-shaped policy (8 prompts x G=8 x 256 tokens a step, 10 steps):

  tp2    2 ZeRO-3 learners on GPUs 0-1, one vLLM engine with TP=2 on GPUs 2-3
  tp1x2  2 ZeRO-3 learners on GPUs 0-1, two vLLM engines with TP=1 on GPUs 2 and 3
  dry    1 ZeRO-3 learner on GPU 0, one vLLM engine with TP=1 on GPU 1 (the 2-GPU dry run of the same script)

`--rollout.verify_every=1` makes the trainer check, after every sync, that every parameter of every engine worker is
bit-identical to the learner's tensor packed and sliced the way that worker holds it (vLLM's fused q/k/v and gate/up,
its TP slice, its vocabulary shard), and report the largest difference of the engines' greedy log-probs from the
learner's forward on fixed prompts beside a tolerance derived from the dtype, the largest logit and the depth.
`--rollout.fault_skip_sync_step=5` skips the sync after step 5 on purpose: the check after it must find the stale
engine (`sync/stale_detected` = 1), re-sync it, and the run goes on.

Per layout the record holds every step's time, the sync phases as the trainer measures them (mean seconds of
`time/sync` and `sync/gather_s`, `sync/send_s`, `sync/load_s`; the phases overlap, since the trainer does not
synchronise them one by one), the largest engine-vs-learner log-prob difference seen, whether checksums were
compared, and whether the stale engine was detected. JSON keys: layout, tp, engines, learners, step_s_all, sync_s,
gather_s, send_s, load_s, max_abs_logprob_diff, checksums_match, exact_sync (true only when the check after every
sync found every worker bit-identical, the deliberately skipped sync's re-sync included), syncs_checked,
checksums_compared, stale_detected, device.
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import step_stats as stats, stop_group   # noqa: E402  (mean, median, p90; a process group ended TERM then KILL)
from e2e_vs_trl import SAFE_ENV, SMOKE_MODEL, build_model, prompts   # noqa: E402  (the same model and prompts builders)

MODEL_15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                 vocab_size=151936, tie_word_embeddings=True)   # the Qwen2.5-1.5B shape
LAYOUTS = {"tp2": dict(gpus=4, learners=2, engines=1, tp=2), "tp1x2": dict(gpus=4, learners=2, engines=2, tp=1),
           "dry": dict(gpus=2, learners=1, engines=1, tp=1)}
SHAPE = dict(prompts=8, prompt_len=128, G=8, gen=256, steps=10, skip=5)
SMOKE = dict(prompts=2, prompt_len=8, G=2, gen=8, steps=4, skip=2)


def run_layout(name:str, smoke:bool, tmp:Path, timeout:float) -> dict:
    L, sh = LAYOUTS[name], (SMOKE if smoke else SHAPE)
    model = SMOKE_MODEL if smoke else MODEL_15B
    model_dir = build_model(model, tmp / "model")
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts(model, sh, 256)))
    gpu = not smoke
    over = [f"--model.name_or_path={model_dir}", f"--data.train_path={data}", "--data.eval_path=", f"--total_steps={sh['steps']}",
            "--eval_every=0", f"--data.max_prompt_tokens={sh['prompt_len'] + 8}", "--rollout.backend=vllm",
            f"--rollout.prompts_per_step={sh['prompts']}", f"--rollout.num_samples_per_prompt={sh['G']}", f"--rollout.max_new_tokens={sh['gen']}",
            "--rollout.mode=one-step-off", f"--rollout.num_engines={L['engines']}", f"--rollout.tensor_parallel_size={L['tp']}",
            "--rollout.verify_every=1", f"--rollout.fault_skip_sync_step={sh['skip']}",
            "--learner.zero_stage=3", "--learner.num_mini_batches=1", f"--learner.pack_length={4096 if gpu else 0}",
            "--learner.learning_rate=1e-6", f"--model.gradient_checkpointing={str(gpu).lower()}",
            f"--cluster.device={'cuda' if gpu else 'cpu'}", f"--cluster.gpus_per_node={L['gpus'] if gpu else 0}",
            f"--cluster.learners_per_node=[{L['learners']}]", "--reward.functions={arith: 1.0}", f"--logging.output_dir={tmp / 'run'}",
            "--logging.tensorboard=false", "--logging.progress_bar=false", "--checkpoint.every_steps=0", "--checkpoint.at_end=false", "--checkpoint.export_hf=false",
            "--checkpoint.resume=none"]
    over += ["--rollout.gpu_memory_utilization=0.8"] if gpu else ["--model.dtype=float32", "--rollout.enforce_eager=true",
                                                                  "--rollout.kv_cache_mib=64", "--rollout.gpu_memory_utilization=0.5"]
    cmd = [sys.executable, "-m", "grpo_nb.cli", "train", "default", *over]
    t0 = time.perf_counter()
    log = tmp / "train.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **SAFE_ENV})
        try: rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc, 20); rc = "timeout"   # TERM first: the trainer stops Ray and frees the GPUs before the next run
    recs = [json.loads(l) for l in (tmp / "run" / "metrics.jsonl").read_text().splitlines()] if (tmp / "run" / "metrics.jsonl").exists() else []
    recs = [r for r in recs if "time/step" in r]
    mean = lambda k: statistics.fmean(r[k] for r in recs if k in r) if any(k in r for r in recs) else None
    checked = {r["step"]: r for r in recs if "sync/stale_detected" in r}
    out = {"layout": name, "tp": L["tp"], "engines": L["engines"], "learners": L["learners"], "smoke": smoke,
           "step_s_all": [r["time/step"] for r in recs], "step_stats": stats([r["time/step"] for r in recs[1:]]),
           "sync_s": mean("time/sync"), "gather_s": mean("sync/gather_s"), "send_s": mean("sync/send_s"), "load_s": mean("sync/load_s"),
           "verify_s": mean("time/verify"),
           "max_abs_logprob_diff": max((r["sync/max_abs_logprob_diff"] for r in checked.values() if "sync/max_abs_logprob_diff" in r), default=None),
           "checksums_match": (True if any(r["sync/checksums_compared"] for r in checked.values()) else None),
           "exact_sync": bool(checked) and len(checked) == len(recs) and all(r.get("sync/exact") for r in checked.values()),
           "syncs_checked": len(checked), "checksums_compared": max((r.get("sync/checksums_compared", 0) for r in checked.values()), default=0),
           "stale_detected": bool(checked.get(sh["skip"], {}).get("sync/stale_detected")) and
                             all(not r["sync/stale_detected"] for s, r in checked.items() if s != sh["skip"]),
           "steps_checked": sorted(checked), "rc": rc, "wall_s": time.perf_counter() - t0, "command": "grpo_nb train default " + " ".join(
               o for o in over if "/" not in o.split("=", 1)[-1][:1])}
    if rc != 0: out["error"] = f"grpo_nb train exited {rc}: " + "\n".join(l for l in log.read_text().splitlines() if "Warning" not in l)[-2500:]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", default="dry", help=f"comma-separated, of {list(LAYOUTS)}")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model (layout dry)")
    ap.add_argument("--out", default="bench/results/tp2_gpu.json")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per layout")
    a = ap.parse_args()
    device = "cpu"
    if not a.smoke:
        import torch
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out = Path(a.out); res = {"records": [], "device": device, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out.exists():   # keep the records of other layouts (a 4-GPU run next to the 2-GPU dry run)
        try: res["records"] = [r for r in json.loads(out.read_text()).get("records", []) if r["layout"] not in a.layouts.split(",")]
        except (json.JSONDecodeError, KeyError): pass
    for name in (["dry"] if a.smoke else a.layouts.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"tp2-{name}-") as d:
            try: rec = run_layout(name, a.smoke, Path(d), a.timeout)
            except Exception: rec = {"layout": name, "error": traceback.format_exc()[-2000:]}
        rec["device"] = device
        res["records"].append(rec)
        out.parent.mkdir(parents=True, exist_ok=True); out.write_text(json.dumps(res, indent=1))
        print(name, {k: rec.get(k) for k in ("step_stats", "sync_s", "max_abs_logprob_diff", "checksums_match", "stale_detected", "rc")},
              (rec.get("error") or "")[-800:], flush=True)


if __name__ == "__main__":
    main()
