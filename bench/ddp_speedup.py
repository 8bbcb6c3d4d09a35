"""Speed-up of torchrun/DDP GRPO from 1 to 2 GPUs (the seed guide claims ~1.8-2x).

The same GRPO step (`python -m grpo_nb.ddp`: in-process sampling with transformers `generate`, rewards,
group advantages, forward/backward of the GRPO loss, DDP all-reduce, AdamW) runs under
`torchrun --nproc_per_node=1` and then `--nproc_per_node=2`, with the per-GPU batch fixed
(`ddp.batch_scaling=per_rank`): two GPUs do twice the work per step. The policy is a randomly
initialised Qwen2 of Qwen2.5-0.5B's shape (896 wide, 24 layers, 14 heads, 2 KV heads, vocabulary
151,936, tied embeddings), fp32 master weights under bf16 autocast. A random policy never emits
end-of-sequence, so every completion has exactly `max_new_tokens` tokens and the work per step is fixed.
Step times are read from the run's own metrics.jsonl (median of the steps after the warm-up ones).

GPU (2x H200, about 3 minutes; grpo_nb.config needs fastcore, carried as a wheel):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fastcore-*.whl && \
    PYTHONPATH=/tmp/site python3 bench/ddp_speedup.py --out bench/results/ddp_speedup.json
CPU smoke test (2 gloo ranks, tiny shape, about a minute here):
    python bench/ddp_speedup.py --smoke --out /tmp/ddp_speedup.json
The guide's CPU run (2 gloo ranks, ddp-tiny preset, a crash and a resume, then the same without the crash):
    python bench/ddp_speedup.py --cpu-run      # writes bench/results/ddp_cpu_run.json
Output: {"meta": {...}, "runs": [{"gpus": 1, ...}, {"gpus": 2, ...}], "speedup": {...}}.
"""
from __future__ import annotations
import argparse, datetime, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                 vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0)
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128,
             vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=512, rope_theta=10000.0)


def model_dir(shape:dict, out:Path) -> Path:
    "A weightless HF directory (config.json + the char tokenizer): grpo_nb.ddp initialises it at random."
    sys.path.insert(0, str(ROOT))
    from grpo_nb.tiny import build_tokenizer
    from transformers import Qwen2Config
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    Qwen2Config(**shape, head_dim=shape["hidden_size"] // shape["num_attention_heads"], rms_norm_eps=1e-6,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["Qwen2ForCausalLM"]).save_pretrained(out)
    return out


def run_config(model:Path, a) -> dict:
    "The ddp run's config: fixed per-GPU work, no evaluation, no checkpoints."
    return {
        "total_steps": a.warmup + a.steps, "eval_every": 0, "seed": 0,
        "model": {"name_or_path": str(model), "dtype": "auto", "gradient_checkpointing": False},
        "data": {"train_path": "builtin:arithmetic", "eval_path": ""},
        "rollout": {"backend": "transformers", "prompts_per_step": a.prompts, "num_samples_per_prompt": a.group,
                    "max_new_tokens": a.max_new_tokens, "temperature": 1.0},
        "learner": {"learning_rate": 1e-6, "zero_stage": 0, "micro_batch_size": a.micro,
                    "gradient_accumulation_steps": a.prompts * a.group // a.micro, "logprob_chunk": 1024, "tis_cap": None},
        "cluster": {"device": "cpu" if a.smoke else "cuda"},
        "reward": {"functions": {"arith": 1.0}},
        "logging": {"tensorboard": False, "progress_bar": False},
        "checkpoint": {"every_steps": 0},
        "ddp": {"batch_scaling": "per_rank", "save_final": False, **({"threads_per_rank": 1} if a.smoke else {})},
    }


def launch(gpus:int, cfg_path:Path, out:Path, a) -> dict:
    "torchrun with `gpus` processes; the run's per-step records and summary."
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1" if a.smoke else "4"}
    if not a.smoke: env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", "-m", "grpo_nb.ddp",
           str(cfg_path), f"--logging.output_dir={out}"]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=a.timeout)
    wall = time.time() - t0
    print(r.stdout[-1500:], r.stderr[-3000:] if r.returncode else "", sep="\n", flush=True)
    if r.returncode: raise SystemExit(f"torchrun with {gpus} process(es) failed (exit {r.returncode}); its output is above")
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    timed = recs[a.warmup:]
    med = lambda k: statistics.median(x[k] for x in timed)
    step_s = med("step_s")
    return {"gpus": gpus, "wall_s": round(wall, 1), "steps_timed": len(timed), "step_s": step_s, "step_s_all": [x["step_s"] for x in recs],
            "generate_s": med("generate_s"), "reward_s": med("reward_s"), "train_s": med("train_s"),
            "sequences_per_step": timed[0]["sequences"], "tokens_per_step": med("tokens"),
            "samples_per_s": timed[0]["sequences"] / step_s, "tokens_per_s": med("tokens") / step_s,
            "gpu_mem_gib": max((x.get("gpu_mem_gib", 0) for x in recs), default=0),
            "batch_plan": json.loads((out / "batch_plan.json").read_text())}


KEEP = ["step", "reward_mean", "loss", "grad_norm", "tokens", "sequences", "position", "eval/pass@1", "eval/problems", "step_s",
        "samples_per_s", "generate_s", "train_s", "world_size"]

def cpu_run(out_path:Path, steps:int=6, fail_at:int=5):
    "The guide's CPU run: ddp-tiny on 2 gloo ranks, crash at `fail_at`, resume; and an uninterrupted reference."
    t0, load = time.time(), os.getloadavg()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "grpo_nb.ddp", "ddp-tiny",
            f"--total_steps={steps}", "--checkpoint.every_steps=2", "--eval_every=2", "--data.eval_limit=32", "--logging.tensorboard=false"]
    def go(out, *extra):
        r = subprocess.run([*base, f"--logging.output_dir={out}", *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        print(" ".join(extra) or "reference", "-> exit", r.returncode, flush=True)
        return r
    read = lambda out: [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    with tempfile.TemporaryDirectory() as td:
        run, ref = Path(td) / "run", Path(td) / "ref"
        crashed = go(run, f"--ddp.fail_at_step={fail_at}")
        assert crashed.returncode != 0, crashed.stdout + crashed.stderr
        n_crashed, latest = len(read(run)), (run / "checkpoints" / "latest").read_text().split()[0]
        resumed = go(run, "--resume", "auto")
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        r2 = go(ref)
        assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
        recs, refs = read(run), read(ref)
        s_run, s_ref = (json.loads((d / "summary.json").read_text()) for d in (run, ref))
        plan = json.loads((run / "batch_plan.json").read_text())
    pick = lambda r, name: {"run": name, **{k: r.get(k) for k in KEEP}}
    same = all(a[k] == b[k] for a, b in zip(recs[n_crashed:], refs[n_crashed:]) for k in ("position", "reward_mean", "loss", "grad_norm"))
    out = {"meta": {"command": "python bench/ddp_speedup.py --cpu-run", "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {__import__('torch').__version__}",
                    "total_s": time.time() - t0, "load_average": round(load[0], 1), "total_steps": steps, "fail_at_step": fail_at,
                    "launch": " ".join(base[2:]), "date": datetime.datetime.now().isoformat(timespec="seconds")},
           "batch_plan": plan,
           "records": [pick(r, "crashed") for r in recs[:n_crashed]] + [pick(r, "resumed") for r in recs[n_crashed:]] + [pick(r, "reference") for r in refs],
           "checks": {"crashed_steps": [r["step"] for r in recs[:n_crashed]], "checkpoint_after_crash": latest,
                      "resumed_steps": [r["step"] for r in recs[n_crashed:]], "resumed_equals_reference": same,
                      "weights_identical": s_run["weights_identical"] and s_ref["weights_identical"],
                      "weights_equal_reference": s_run["weights_sha256"] == s_ref["weights_sha256"]}}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["checks"]), f"\nwrote {out_path} ({out['meta']['total_s']:.0f} s)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench/results/ddp_speedup.json"), help="where the JSON goes")
    p.add_argument("--smoke", action="store_true", help="tiny shape, CPU, gloo (checks the script, measures nothing useful)")
    p.add_argument("--gpus", default="1,2", help="process counts to compare")
    p.add_argument("--steps", type=int, default=None, help="timed steps (after the warm-up)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps")
    p.add_argument("--prompts", type=int, default=None, help="prompts per GPU per step")
    p.add_argument("--group", type=int, default=8, help="G, samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=None, help="completion length (all completions reach it)")
    p.add_argument("--micro", type=int, default=None, help="sequences per micro-batch")
    p.add_argument("--timeout", type=int, default=240, help="seconds for one torchrun")
    p.add_argument("--cpu-run", action="store_true", help="the guide's CPU run with a crash and a resume (writes bench/results/ddp_cpu_run.json unless --out)")
    a = p.parse_args(argv)
    if a.cpu_run:
        return cpu_run(Path(a.out) if "--out" in (sys.argv if argv is None else argv) else ROOT / "bench/results/ddp_cpu_run.json")
    d = dict(steps=2, warmup=1, prompts=2, max_new_tokens=8, micro=8) if a.smoke else dict(steps=4, warmup=2, prompts=8, max_new_tokens=256, micro=16)
    for k, v in d.items():
        if getattr(a, k) is None: setattr(a, k, v)
    import torch
    gpus = [int(g) for g in a.gpus.split(",")]
    if not a.smoke and torch.cuda.device_count() < max(gpus):
        raise SystemExit(f"needs {max(gpus)} GPUs, sees {torch.cuda.device_count()}; use --smoke on a machine without them")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        model = model_dir(SMOKE if a.smoke else QWEN2_05B, td / "model")
        cfg_path = td / "run.json"  # JSON is YAML
        cfg_path.write_text(json.dumps(run_config(model, a)))
        runs = [launch(g, cfg_path, td / f"run{g}", a) for g in gpus]
    base = runs[0]
    speedup = {f"{r['gpus']}v{base['gpus']}": {"samples_per_s": r["samples_per_s"] / base["samples_per_s"],
                                               "step_time_ratio": r["step_s"] / base["step_s"]} for r in runs[1:]}
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "smoke": a.smoke, "torch": torch.__version__,
            "python": platform.python_version(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not a.smoke else "cpu",
            "model": "Qwen2.5-0.5B shape, random init" if not a.smoke else "tiny shape (smoke)", "shape": SMOKE if a.smoke else QWEN2_05B,
            "per_gpu": {"prompts": a.prompts, "group": a.group, "max_new_tokens": a.max_new_tokens, "micro_batch": a.micro},
            "steps_timed": a.steps, "warmup_steps": a.warmup, "precision": "fp32 master weights, bf16 autocast" if not a.smoke else "fp32",
            "command": "python3 bench/ddp_speedup.py " + " ".join(sys.argv[1:] if argv is None else argv), "total_s": round(time.time() - t0, 1)}
    out = {"meta": meta, "runs": runs, "speedup": speedup}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    for r in runs:
        print(f"{r['gpus']} GPU(s): step {r['step_s']:.2f} s (generate {r['generate_s']:.2f}, train {r['train_s']:.2f}), "
              f"{r['samples_per_s']:.1f} samples/s, {r['tokens_per_s']:.0f} completion tokens/s")
    for k, v in speedup.items(): print(f"speed-up {k}: {v['samples_per_s']:.2f}x samples/s (step time ratio {v['step_time_ratio']:.2f})")
    print(f"wrote {a.out} ({meta['total_s']} s)")


if __name__ == "__main__": main()
