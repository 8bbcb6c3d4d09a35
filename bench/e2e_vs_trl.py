"""End-to-end GRPO step time: grpo_nb against TRL's GRPOTrainer, same model, batch and generation length.

Part A (one GPU): a random-init Qwen2-0.5B-shaped policy, 8 prompts of 128 tokens × G=8 = 64 sequences a step,
256 generated tokens each, transformers generation on both sides.
  - TRL 1.16 `GRPOTrainer` (generation with HF `generate`, the training step under accelerate), timed per step by a callback;
  - grpo_nb colocated on the same GPU: our transformers engine (`grpo_nb.rollout.HFEngine`, bf16, static KV cache so
    the decode loop has no per-token cache reallocation), rewards, group advantages, our learner
    (`grpo_nb.learner`, DeepSpeed ZeRO-0 bf16, packed rows, chunked fp32 log-probs) and an in-GPU weight copy.
Part B (two GPUs): `grpo_nb.trainer.train` as users run it: Ray, learner on GPU 0, engine on GPU 1, weight sync over
NCCL, one-step off-policy (generation of step t+1 overlaps the learner's step t).

Each part runs in its own subprocess with a time limit, so one failure still writes the other's record.
Usage on the GPU machine (see the report / notebook for the exact commands):
    python bench/e2e_vs_trl.py --part A --out bench/results/e2e_vs_trl.json
    python bench/e2e_vs_trl.py --part B --out bench/results/e2e_vs_trl.json
    python bench/e2e_vs_trl.py --smoke            # CPU-sized, here
"""
from __future__ import annotations
import argparse, json, os, random, statistics, subprocess, sys, tempfile, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
            vocab_size=151936, tie_word_embeddings=True, prompts=8, prompt_len=128, G=8, gen=256, steps=5, warmup=2)
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128,
             vocab_size=512, tie_word_embeddings=True, prompts=2, prompt_len=8, G=2, gen=8, steps=2, warmup=1)


def build_model(shape:dict, out:Path) -> Path:
    "A random-init Qwen2 of `shape` plus a word-level tokenizer covering every id (`t<id>` tokens), saved as a HF directory."
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    V = shape["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)   # joins tokens with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t2", unk_token="t3")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(out)
    cfg = Qwen2Config(**{k: shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                                "intermediate_size", "vocab_size", "tie_word_embeddings")},
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def prompts(shape:dict, n:int, seed:int=0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"t{rng.randrange(10, shape['vocab_size'])}" for _ in range(shape["prompt_len"])) for _ in range(n)]


def toy_reward(completion:str) -> float:
    "Cheap, deterministic and not constant: the share of tokens with an even id."
    ids = [int(t[1:]) for t in completion.split() if t[1:].isdigit()]
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)


# ---------------------------------------------------------------- part A: TRL
def run_trl(shape:dict, model_dir:Path, device:str) -> dict:
    import torch, datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    import trl
    n_steps = shape["warmup"] + shape["steps"]
    ds = datasets.Dataset.from_list([{"prompt": p} for p in prompts(shape, shape["prompts"] * n_steps)])
    B = shape["prompts"] * shape["G"]
    want = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=B, num_generations=shape["G"], max_completion_length=shape["gen"],
                max_prompt_length=shape["prompt_len"], gradient_accumulation_steps=1, max_steps=n_steps, learning_rate=1e-6, beta=0.0,
                logging_steps=1, report_to=[], save_strategy="no", use_vllm=False, temperature=1.0, bf16=device == "cuda",
                use_cpu=device == "cpu", gradient_checkpointing=True, seed=0, shuffle_dataset=False, dataloader_num_workers=0)
    fields = set(GRPOConfig.__dataclass_fields__)
    args = GRPOConfig(**{k: v for k, v in want.items() if k in fields})
    times = []
    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if device == "cuda": torch.cuda.synchronize()
            self.t = time.perf_counter()
        def on_step_end(self, *a, **k):
            if device == "cuda": torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    tr = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [toy_reward(c) for c in completions]], args=args,
                     train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[Timer()])
    if device == "cuda": torch.cuda.reset_peak_memory_stats()
    tr.train()
    timed = times[shape["warmup"]:]
    return {"trl_version": trl.__version__, "trl_step_s": statistics.median(timed), "trl_step_s_all": times,
            "trl_args_dropped": sorted(set(want) - fields),
            "trl_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}


# ---------------------------------------------------------------- part A: ours, colocated on the same GPU
def _static_cache_generate(static:bool):
    "Our HF engine's generate, with a static KV cache when asked (the decode loop then reuses one cache buffer)."
    import grpo_nb.rollout as R
    base = R._hf_generate
    def gen(self, rows, spec, stop_ids):
        from transformers import GenerationConfig
        orig = GenerationConfig.__init__
        def init(gc, *a, **k):
            orig(gc, *a, **k)
            if static: gc.cache_implementation = "static"
        GenerationConfig.__init__ = init
        try: return base(self, rows, spec, stop_ids)
        finally: GenerationConfig.__init__ = orig
    R._hf_generate = gen


def run_ours_colocated(shape:dict, model_dir:Path, device:str, static_cache:bool=True) -> dict:
    import torch
    from grpo_nb.config import LearnerConfig
    from grpo_nb.learner import LearnerSpec, create_learner_group
    from grpo_nb.rollout import HFEngine, SamplingSpec
    from grpo_nb.trainer import make_train_batch
    _static_cache_generate(static_cache and device == "cuda")
    eng = HFEngine(str(model_dir), device=device, dtype="bfloat16" if device == "cuda" else "float32")
    L = LearnerConfig(learning_rate=1e-6, zero_stage=0, micro_batch_size=shape["prompts"] * shape["G"],
                      pack_length=8192 if device == "cuda" else 0, logprob_chunk=2048)
    spec = LearnerSpec(model=str(model_dir), learner=L, device=device, gradient_checkpointing=device == "cuda",
                       norm_len=shape["gen"], total_optimizer_steps=100, peak_flops=989e12 if device == "cuda" else None)
    group = create_learner_group(spec, 1, local=True)
    worker = group.actors[0]
    ps = [eng.tokenizer(p).input_ids for p in prompts(shape, shape["prompts"] * (shape["warmup"] + shape["steps"]))]
    times, parts = [], []
    if device == "cuda": torch.cuda.reset_peak_memory_stats()
    for step in range(shape["warmup"] + shape["steps"]):
        sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
        sync(); t0 = time.perf_counter()
        batch_p = ps[step * shape["prompts"]:(step + 1) * shape["prompts"]]
        S = eng.generate(batch_p, SamplingSpec(n=shape["G"], max_new_tokens=shape["gen"], temperature=1.0, seed=step, ignore_eos=True))
        t1 = time.perf_counter()
        rewards = [toy_reward(s.text) for s in S]
        batch, _ = make_train_batch([s.prompt_ids for s in S], [s.completion_ids for s in S], [s.logprobs for s in S], rewards, shape["G"])
        t2 = time.perf_counter()
        m = group.step(batch)
        sync(); t3 = time.perf_counter()
        with torch.no_grad():   # colocated weight sync: one device-to-device copy of every tensor
            eng.model.load_state_dict(worker.sync_module().state_dict(), strict=False)
        sync(); t4 = time.perf_counter()
        times.append(t4 - t0); parts.append({"gen": t1 - t0, "reward": t2 - t1, "learner": t3 - t2, "sync": t4 - t3, "mfu": m.get("mfu")})
    timed = parts[shape["warmup"]:]
    med = lambda k: statistics.median(p[k] for p in timed)
    out = {"ours_step_s": statistics.median(times[shape["warmup"]:]), "ours_step_s_all": times,
           "ours_split_s": {k: med(k) for k in ("gen", "reward", "learner", "sync")}, "ours_static_cache": static_cache and device == "cuda",
           "ours_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
           "ours_learner_mfu": statistics.median(p["mfu"] for p in timed) if timed[0]["mfu"] is not None else None}
    group.shutdown()
    return out


# ---------------------------------------------------------------- part B: our trainer, learner GPU 0 + engine GPU 1, async
def run_ours_two_gpu(shape:dict, model_dir:Path, device:str, tmp:Path) -> dict:
    from grpo_nb.config import load_config
    from grpo_nb.trainer import read_metrics, train
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts(shape, 256)))
    n = shape["warmup"] + shape["steps"]
    B = shape["prompts"] * shape["G"]
    gpu = device == "cuda"
    over = [f"--model.name_or_path={model_dir}", f"--data.train_path={data}", "--data.eval_path=", f"--total_steps={n}", "--eval_every=0",
            f"--data.max_prompt_tokens={shape['prompt_len'] + 8}", "--rollout.backend=transformers", f"--rollout.prompts_per_step={shape['prompts']}",
            f"--rollout.num_samples_per_prompt={shape['G']}", f"--rollout.max_new_tokens={shape['gen']}", "--rollout.mode=one-step-off",
            "--learner.zero_stage=0", f"--learner.micro_batch_size={B}", f"--learner.pack_length={8192 if gpu else 0}",
            "--learner.logprob_chunk=2048", "--learner.learning_rate=1e-6", f"--model.gradient_checkpointing={str(gpu).lower()}",
            f"--cluster.device={device}", f"--cluster.gpus_per_node={2 if gpu else 0}", "--cluster.learners_per_node=[1]",
            "--reward.functions={arith: 1.0}", f"--logging.output_dir={tmp / 'run'}", "--logging.tensorboard=false",
            "--logging.progress_bar=false", "--checkpoint.every_steps=0", "--checkpoint.export_hf=false", "--checkpoint.resume=none"]
    s = train(load_config("default", over))
    recs = [r for r in read_metrics(tmp / "run") if "time/step" in r][shape["warmup"]:]
    med = lambda k: statistics.median(r[k] for r in recs)
    return {"ours_2gpu_step_s": med("time/step"), "ours_2gpu_split_s": {k: med(f"time/{k}") for k in ("generation", "generation_total", "reward", "learner", "sync")},
            "ours_2gpu_staleness": recs[-1]["staleness"], "ours_2gpu_wall_s": s["wall_s"]}


# ---------------------------------------------------------------- driver
def child(part:str, smoke:bool, out_json:Path):
    shape = SMOKE if smoke else FULL
    import torch
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="e2e"))
    model_dir = build_model(shape, tmp / "model")
    rec = {"part": part, "config": {k: shape[k] for k in ("prompts", "prompt_len", "G", "gen", "steps", "warmup")},
           "model": {k: v for k, v in shape.items() if k not in ("prompts", "prompt_len", "G", "gen", "steps", "warmup")},
           "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "gpus": torch.cuda.device_count() if device == "cuda" else 0,
           "smoke": smoke, "torch": torch.__version__, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    import transformers; rec["transformers"] = transformers.__version__
    steps = [("ours", lambda: run_ours_colocated(shape, model_dir, device)), ("trl", lambda: run_trl(shape, model_dir, device))] if part == "A" \
            else [("ours_2gpu", lambda: run_ours_two_gpu(shape, model_dir, device, tmp))]
    for name, fn in steps:   # each side guarded: one failing still records the other
        t = time.perf_counter()
        try: rec.update(fn())
        except Exception as e:
            rec[f"{name}_error"] = f"{type(e).__name__}: {e}"[:2000]; traceback.print_exc()
        rec[f"{name}_wall_s"] = time.perf_counter() - t
    if rec.get("ours_step_s") and rec.get("trl_step_s"): rec["speedup"] = rec["trl_step_s"] / rec["ours_step_s"]
    out_json.write_text(json.dumps(rec, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="all", choices=["A", "B", "all"], help="A: one GPU, TRL vs ours; B: ours on two GPUs")
    ap.add_argument("--smoke", action="store_true", help="a CPU-sized run (no GPU, TRL optional)")
    ap.add_argument("--out", default="", help="results JSON (records are merged by part and smoke)")
    ap.add_argument("--timeout", type=int, default=460, help="seconds per part")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.smoke, Path(a.out)); return
    out = Path(a.out or ROOT / "bench" / "results" / ("e2e_vs_trl_smoke.json" if a.smoke else "e2e_vs_trl.json"))
    old = json.loads(out.read_text()) if out.exists() else {"records": []}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    for part in (["A", "B"] if a.part == "all" else [a.part]):
        penv = dict(env)
        if part == "A" and not a.smoke: penv["CUDA_VISIBLE_DEVICES"] = penv.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]  # TRL refuses 2 visible GPUs
        tmp = Path(tempfile.mkdtemp()) / "rec.json"
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", part, "--out", str(tmp)] + (["--smoke"] if a.smoke else [])
        try: rc = subprocess.run(cmd, env=penv, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired: rc = "timeout"
        rec = json.loads(tmp.read_text()) if tmp.exists() else {"part": part, "smoke": a.smoke, "error": f"child exited {rc} without a record"}
        rec["part_wall_s"] = time.perf_counter() - t
        old["records"] = [r for r in old["records"] if (r.get("part"), r.get("smoke")) != (part, a.smoke)] + [rec]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(old, indent=1))
        print(json.dumps({k: v for k, v in rec.items() if not k.endswith("_all")}, indent=1))


if __name__ == "__main__":
    main()
