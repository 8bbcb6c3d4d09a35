"""End-to-end GRPO step time of `grpo_nb train` (the trainer users run, with real vLLM engines) against two peers,
TRL's GRPOTrainer with its own vLLM integration and verl's PPO trainer with its vLLM rollout, on the same GPUs, the
same random-init model and the same work.

Each run is one subprocess with its own time limit and writes one JSON file; `--merge` pairs them into records.
The committed run files are in bench/results/e2e_runs/ (`--merge bench/results/e2e_runs` rebuilds e2e_vs_trl.json).

  ours:<layout>:<mode>:<shape>   `python -m grpo_nb.cli train default ...` (Ray, DeepSpeed learner, vLLM engine)
      layout  colocated (1 GPU: learner and engine share it; the engine stays awake where the GPU holds both, `rollout.sleep_level=auto`)
              split     (2 GPUs: learner on GPU 0, engine on GPU 1, NCCL weight sync)
      mode    sync | one-step-off (split only)
  trl:<backend>:<shape>          TRL 1.16 GRPOTrainer
      backend vllm-colocate (1 GPU, `vllm_mode="colocate"`), vllm-server (2 GPUs: `trl vllm-serve` on GPU 1, trainer
              on GPU 0), transformers (1 GPU, HF generate)
  verl:<backend>:<shape>         verl 0.9.1 `python -m verl.trainer.main_ppo` (bench/verl_peer.py: its modes, the
                                 packages it needs, what it says about vLLM 0.26)
      backend hybrid (1 GPU), hybrid-2gpu (2 GPUs), separate-async (2 GPUs: actor on GPU 0, rollout on GPU 1),
              one-step-off (2 GPUs, verl's experimental one-step-off trainer)
  shapes  bench: 8 prompts of 128 tokens x G=8, 256 generated tokens; long: the same with 1024 generated tokens;
          wide: 32 prompts of 192 tokens x G=4, 320 generated tokens (twice the samples a step: more learner work)
          steady: the bench work with 40 timed steps instead of 10 (an engine's steps run slower for stretches, and on some
                  nodes its first calls of a cold start: bench/rollout_throughput.py --repeats 20; this shape times past both)

Both trainers train a step in one micro-batch (TRL: `per_device_train_batch_size` = the step's sequences; ours:
`learner.pack_length` = the step's tokens, `step_tokens`), and every run starts with empty compile caches
(`COLD_CACHES`), so each side's `first_step_s` (launch to the first step's start) is a cold start.
Every step's time is recorded, and its generation (`generation_s_all`); statistics use the steps after `warmup` (mean,
median, p90). Where nvidia-smi answers, a run's file also keeps its GPU's SM clock, power, temperature and utilisation
through the run (`gpu_clocks`, every half second) and, for ours and TRL's, each step's end and mean SM clock
(`step_end_wall`, `sm_clock_mhz_per_step`): a slow stretch of steps can then be set beside the GPU's clocks.
Every merged record names its `peer` ("trl" | "verl") and its `shape`; the peer's keys carry its name
(`trl_step_mean_s`, `verl_step_mean_s`, ...), ours `ours_`. The speed-up by mean step time is given only where both sides completed on the
same GPU model. A peer's failure lands in its `<peer>_error` (the tail of its log) and never loses our record.

    python bench/e2e_vs_trl.py --runs ours:colocated:sync:bench,trl:vllm-colocate:bench --out-dir OUT   # on the GPU machine
    python bench/e2e_vs_trl.py --peers verl:hybrid,verl:separate-async --shapes bench,long --out-dir OUT --timeout 540
    python bench/e2e_vs_trl.py --peers verl:hybrid --dry-run       # print each run's command, arguments and files; run nothing
    python bench/e2e_vs_trl.py --runs ours:colocated:sync:bench --ours-extra=--rollout.sleep_level=2 --out-dir OUT2   # a variant of ours (not merged)
    python bench/e2e_vs_trl.py --merge OUT --out bench/results/e2e_vs_trl.json
    python bench/e2e_vs_trl.py --smoke                                                                   # CPU-sized, here
"""
from __future__ import annotations
import argparse, json, os, shlex, signal, statistics, subprocess, sys, tempfile, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (CLOCK_FIELDS, COLD_CACHES, GPU_ENV, ClockLog, digit_prompts, end_group, free_port, per_step,  # noqa: E402
                    save_bench_tokenizer, step_stats, stop_group)   # (shared by the bench scripts)
from verl_peer import BACKENDS as VERL_BACKENDS, PAIRS as VERL_PAIRS, dry_run_text, run_verl, verl_plan  # noqa: E402  (the second peer)

MODEL = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
             vocab_size=151936, tie_word_embeddings=True)   # the Qwen2.5-0.5B shape
SMOKE_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128,
                   vocab_size=512, tie_word_embeddings=True)
MIN_TIMED = 8   # a run cut by its time limit still counts when at least this many steps after warm-up completed
SHAPES = {"bench": dict(prompts=8, prompt_len=128, G=8, gen=256, steps=10, warmup=2),
          "long": dict(prompts=8, prompt_len=128, G=8, gen=1024, steps=10, warmup=2),
          "wide": dict(prompts=32, prompt_len=192, G=4, gen=320, steps=10, warmup=2),
          "steady": dict(prompts=8, prompt_len=128, G=8, gen=256, steps=40, warmup=2),   # the bench work, timed past stretches of slower steps
          "smoke": dict(prompts=2, prompt_len=8, G=2, gen=8, steps=3, warmup=1)}
LAYOUTS = ("colocated", "split")
SHAPE_LAYOUTS = {"steady": ("colocated",)}   # a shape measured in some layouts only; a merge lists its unmeasured comparisons there alone
GPUS = {("ours", "colocated"): 1, ("ours", "split"): 2, ("trl", "vllm-colocate"): 1, ("trl", "vllm-server"): 2, ("trl", "transformers"): 1,
        **{("verl", b): v["gpus"] for b, v in VERL_BACKENDS.items()}}
PEERS = {"trl": [("colocated", "sync", "vllm-colocate"), ("colocated", "sync", "transformers"),
                 ("split", "sync", "vllm-server"), ("split", "one-step-off", "vllm-server")],
         "verl": VERL_PAIRS}
"Each peer's modes beside our (layout, mode) on the same GPUs: the comparisons `--merge` makes."
TARGETS = {("trl", "vllm-colocate", "sync"): 1.2, ("trl", "vllm-server", "sync"): 1.2, ("trl", "vllm-server", "one-step-off"): 1.5,
           ("trl", "transformers", "sync"): 3.0}
"The speed-up by mean step time each comparison aims at, by peer, peer mode and our mode (none against verl yet)."
SAFE_ENV = {**GPU_ENV, "VLLM_USE_FLASHINFER_SAMPLER": "0"}


stats = step_stats   # the name rollout_throughput and tp2_gpu import


def build_model(model:dict, out:Path, weights:bool=True) -> Path:
    "A random-init Qwen2 of `model`'s shape plus a tokenizer covering every id (`save_bench_tokenizer`), as a HF directory (`weights=False`: config and tokenizer only, for `load_format='dummy'`)."
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    save_bench_tokenizer(model["vocab_size"], out)
    cfg = Qwen2Config(**model, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if not weights: cfg.architectures = ["Qwen2ForCausalLM"]; cfg.save_pretrained(out); return out
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    return out


def prompts(model:dict, shape:dict, n:int, seed:int=0) -> list[str]:
    "`n` random prompts of `shape['prompt_len']` tokens (digits: one token each, see `save_bench_tokenizer`)."
    return digit_prompts(n, shape["prompt_len"], seed)


def toy_reward(completion:str) -> float:
    "Cheap, deterministic and not constant: the share of `t<id>` tokens with an even id, spaced or not (the peers' reward; ours uses `arith`)."
    import re
    ids = [int(x) for x in re.findall(r"t(\d+)", completion)]
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)


# ---------------------------------------------------------------- ours: the trainer users run
def step_tokens(shape:dict) -> int:
    "Tokens of one step's sequences at their longest, rounded up to 1024: ours packs them into one micro-batch, as TRL trains the step in one batch."
    return -(-shape["prompts"] * shape["G"] * (shape["prompt_len"] + 8 + shape["gen"]) // 1024) * 1024


def ours_overrides(layout:str, mode:str, shape:dict, model_dir:Path, data:Path, tmp:Path, device:str) -> list[str]:
    "The `grpo_nb train default` overrides of our run of `shape` in `layout` and `mode` on `device`."
    n, B, gpu = shape["warmup"] + shape["steps"], shape["prompts"] * shape["G"], device == "cuda"
    over = [f"--model.name_or_path={model_dir}", f"--data.train_path={data}", "--data.eval_path=", f"--total_steps={n}", "--eval_every=0",
            f"--data.max_prompt_tokens={shape['prompt_len'] + 8}", "--rollout.backend=vllm", f"--rollout.prompts_per_step={shape['prompts']}",
            f"--rollout.num_samples_per_prompt={shape['G']}", f"--rollout.max_new_tokens={shape['gen']}", f"--rollout.mode={mode}",
            f"--rollout.placement={layout}", "--learner.zero_stage=0", f"--learner.micro_batch_size={B}",
            f"--learner.pack_length={step_tokens(shape) if gpu else 0}", "--learner.logprob_chunk=2048", "--learner.learning_rate=1e-6",
            f"--model.gradient_checkpointing={str(gpu).lower()}", f"--cluster.device={device}",
            f"--cluster.gpus_per_node={GPUS[('ours', layout)] if gpu else 0}", "--cluster.learners_per_node=[1]",
            "--reward.functions={arith: 1.0}", f"--logging.output_dir={tmp / 'run'}", "--logging.tensorboard=false",
            "--logging.progress_bar=false", "--checkpoint.every_steps=0", "--checkpoint.at_end=false", "--checkpoint.export_hf=false", "--checkpoint.resume=none"]
    if layout == "colocated": over += ["--rollout.gpu_memory_utilization=0.3"] + ([] if gpu else ["--rollout.sleep_level=0", "--rollout.kv_cache_mib=64"])
    else: over += [f"--rollout.gpu_memory_utilization={0.85 if gpu else 0.5}"] + ([] if gpu else ["--rollout.kv_cache_mib=64"])
    if not gpu: over += ["--model.dtype=float32", "--rollout.enforce_eager=true"]
    return over + shlex.split(os.environ.get("E2E_OURS_EXTRA", ""))   # --ours-extra: a variant of ours (its command records it)


def run_ours(layout:str, mode:str, shape:dict, model:dict, model_dir:Path, tmp:Path, device:str, timeout:float, keep_log:Path|None=None) -> dict:
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts(model, shape, 512)))
    n = shape["warmup"] + shape["steps"]
    over = ours_overrides(layout, mode, shape, model_dir, data, tmp, device)
    cmd = [sys.executable, "-m", "grpo_nb.cli", "train", "default", *over]
    t0 = time.perf_counter()
    log = tmp / "train.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        first = None   # seconds from the launch to the start of the first step: the first record's arrival less its step time
        ends = []   # each metrics line's arrival (unix seconds, within the poll's quarter second): when its step ended
        try:
            while (rc := proc.poll()) is None:
                if time.perf_counter() - t0 > timeout: raise subprocess.TimeoutExpired(cmd, timeout)
                if (m := tmp / "run" / "metrics.jsonl").exists():
                    done = m.read_text().split("\n")[:-1]   # whole lines only: the last may still be being written
                    ends += [time.time()] * (len(done) - len(ends))
                    if first is None and done:
                        try: first = time.perf_counter() - t0 - json.loads(done[0]).get("time/step", 0.0)
                        except ValueError: pass
                time.sleep(0.25)
        except subprocess.TimeoutExpired:   # keep what ran: the steps logged so far and the log's tail
            stop_group(proc, 20); rc = "timeout"   # TERM first: the trainer stops Ray and frees the GPUs before the next run
    wall = time.perf_counter() - t0
    recs = [json.loads(l) for l in (tmp / "run" / "metrics.jsonl").read_text().splitlines()] if (tmp / "run" / "metrics.jsonl").exists() else []
    recs = [r for r in recs if "time/step" in r]
    startup = {k.removeprefix("startup/"): v for k, v in (recs[0] if recs else {}).items() if k.startswith("startup/")}   # the first step carries them
    if keep_log is not None: keep_log.write_bytes(log.read_bytes()[-(1 << 20):])   # the last MiB: vLLM's and DeepSpeed's start-up lines
    for f in sorted((tmp / "run" / "logs").glob("engine*_load.log")) if keep_log is not None else []:   # each engine's load: where its start went
        keep_log.with_name(keep_log.name.replace(".train.log", f".{f.stem}.log")).write_bytes(f.read_bytes())
    stopped = None
    if rc == "timeout" and len(recs) - shape["warmup"] >= MIN_TIMED:   # enough timed steps: keep them, and say the run was cut
        stopped = f"stopped by the benchmark's time limit after {len(recs)} of {n} steps ({wall:.0f} s, start-up included)"
    elif rc != 0 or len(recs) < n:
        raise RuntimeError(f"grpo_nb train exited {rc} after {len(recs)} of {n} steps ({[round(r['time/step'], 2) for r in recs]}) in {wall:.0f} s:\n"
                           + "\n".join(l for l in log.read_text().splitlines() if "Warning" not in l)[-2500:])
    timed = recs[shape["warmup"]:]
    keys = sorted({k for r in timed for k in r if k.startswith("time/")})
    lines = [json.loads(l) for l in (tmp / "run" / "metrics.jsonl").read_text().splitlines()] if recs else []
    step_end = [t for t, r in zip(ends, lines) if "time/step" in r]   # the step lines' arrivals (other lines, such as evaluations, are left out)
    return {"step_s_all": [r["time/step"] for r in recs], "step_end_wall": step_end if len(step_end) == len(recs) else None,
            "split_s": {k.removeprefix("time/"): statistics.fmean(r.get(k, 0.0) for r in timed) for k in keys},
            "generation_s_all": [r.get("time/generation", 0.0) for r in recs],   # every step's: where a step's time moves within a run
            "peak_gib": max(r.get("peak_gpu_mem_gib", 0) for r in recs), "staleness": timed[-1].get("staleness"),
            "learner_mfu": statistics.fmean(r["mfu"] for r in timed) if all(r.get("mfu") is not None for r in timed) else None,
            "response_len_mean": statistics.fmean(r.get("response_len_mean", 0.0) for r in timed),   # the work: tokens generated per sequence
            "prompt_len_mean": statistics.fmean(r.get("prompt_len_mean", 0.0) for r in timed),
            "startup_s": startup, "first_step_s": first, "first_step_from": "process start", "wall_s": wall, "command": "grpo_nb train default " + " ".join(o for o in over if "/" not in o),
            **({"stopped": stopped} if stopped else {})}


# ---------------------------------------------------------------- TRL, in its best supported modes
def _serve_trl(model_dir:Path, port:int, tmp:Path) -> subprocess.Popen:
    "TRL's vLLM server (`trl vllm-serve`, i.e. vLLM's own server with the weight-transfer engine) on the second GPU."
    env = {**os.environ, **SAFE_ENV, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")[-1]}
    code = ("from trl.scripts.vllm_serve import ScriptArguments, main; "
            f"main(ScriptArguments(model={str(model_dir)!r}, port={port}, host='127.0.0.1', gpu_memory_utilization=0.85, "
            "enable_prefix_caching=True))")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=open(tmp / "trl_server.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    _SERVER_LOG[proc.pid] = tmp / "trl_server.log"
    if SERVER_PID_FILE is not None: SERVER_PID_FILE.write_text(str(proc.pid))   # the parent ends it if this run is killed
    return proc


_SERVER_LOG:dict = {}
SERVER_PID_FILE:Path|None = None   # set by `child`: where a TRL server's process group is written for the parent
def _tail(p, n:int=2500) -> str: return "\n".join(l for l in Path(p).read_text().splitlines() if "Warning" not in l)[-n:] if p and Path(p).exists() else ""

def _wait_health(port:int, proc, timeout:float):
    import urllib.request
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the TRL vLLM server exited {proc.returncode}: " + _tail(_SERVER_LOG.get(proc.pid)))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200: return time.monotonic() - t
        except Exception: time.sleep(2)
    raise TimeoutError(f"the TRL vLLM server was not healthy after {timeout} s")


def trl_split(timed:list[dict]) -> dict:
    "Mean seconds per phase of TRL's timed steps: generation (without the sync that runs inside it), sync, and the rest."
    split = {k: statistics.fmean(s.get(k, 0.0) for s in timed) for k in ("generation", "sync")}
    split["generation"] -= split["sync"]   # the sync runs inside the generation call
    split["learner_and_rest"] = statistics.fmean(s["step"] for s in timed) - split["generation"] - split["sync"]
    return split


def time_method(cls, name:str, key:str, acc:dict):
    "Wrap `cls.name` so that each call adds its seconds to `acc[key]` (times the peer's own phases; nothing else changes)."
    fn = getattr(cls, name, None)
    if fn is None: return
    def wrap(self, *a, **k):
        t = time.perf_counter()
        try: return fn(self, *a, **k)
        finally: acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
    setattr(cls, name, wrap)


def time_trl_phases(trainer_cls, acc:dict):
    "Time TRL's generation (`_generate_single_turn`, the weight sync inside it) and its weight sync into `acc`."
    time_method(trainer_cls, "_generate_single_turn", "generation", acc)
    try:
        from trl.generation.vllm_generation import VLLMGeneration
        time_method(VLLMGeneration, "sync_weights", "sync", acc)
    except ImportError: pass


def trl_args(backend:str, shape:dict, tmp:Path, device:str, server_port:int|None=None, group_port:int|None=None) -> dict:
    "The GRPOConfig arguments of TRL's run of `shape` with `backend`: the whole step in one batch, no KL, our learning rate."
    B = shape["prompts"] * shape["G"]
    want = dict(output_dir=str(tmp / "trl"), per_device_train_batch_size=B, num_generations=shape["G"], max_completion_length=shape["gen"],
                gradient_accumulation_steps=1, max_steps=shape["warmup"] + shape["steps"], learning_rate=1e-6, beta=0.0, logging_steps=1, report_to=[],
                save_strategy="no", temperature=1.0, bf16=device == "cuda", use_cpu=device == "cpu", gradient_checkpointing=device == "cuda",
                seed=0, shuffle_dataset=False, dataloader_num_workers=0, use_vllm=backend != "transformers")
    if backend == "vllm-colocate": want.update(vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    if backend == "vllm-server": want.update(vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=server_port, vllm_group_port=group_port)
    return want


def run_trl(backend:str, shape:dict, model:dict, model_dir:Path, tmp:Path, device:str, progress=None) -> dict:
    "TRL's GRPOTrainer on the same work; `progress(steps)` is called after every step (the parent keeps a run cut by its time limit)."
    t_import = time.perf_counter()   # time to the first step counts TRL's imports, its server's start and its trainer's construction
    import torch, datasets
    from transformers import TrainerCallback
    import trl
    from trl import GRPOConfig, GRPOTrainer
    server = None
    if backend == "vllm-server":
        port = free_port()
        server = _serve_trl(model_dir, port, tmp)
        up_s = _wait_health(port, server, 420)
    try:
        if device == "cuda": os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]  # TRL wants one GPU
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        n = shape["warmup"] + shape["steps"]
        ds = datasets.Dataset.from_list([{"prompt": p} for p in prompts(model, shape, shape["prompts"] * n)])
        want = trl_args(backend, shape, tmp, device, port if server else None, free_port())
        fields = set(GRPOConfig.__dataclass_fields__)
        args = GRPOConfig(**{k: v for k, v in want.items() if k in fields})
        sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
        steps, cur = [], {}
        time_trl_phases(GRPOTrainer, cur)
        t_build, first = time.perf_counter(), []
        class Timer(TrainerCallback):
            def on_step_begin(self, *a, **k):
                sync(); cur.clear(); cur["t0"] = time.perf_counter()
                if not first: first.append(cur["t0"] - t_build)
            def on_step_end(self, *a, **k):
                sync(); t = time.perf_counter() - cur.pop("t0")
                steps.append({"step": t, **cur, "end_wall": time.time()})
                if progress is not None: progress(steps)
        trainer = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [toy_reward(c) for c in completions],
                              args=args, train_dataset=ds, callbacks=[Timer()])
        if device == "cuda": torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter(); trainer.train(); wall = time.perf_counter() - t0
        lens = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h][shape["warmup"]:]
        return {"version": trl.__version__, "step_s_all": [s["step"] for s in steps], "step_end_wall": [s["end_wall"] for s in steps],
                "split_s": trl_split(steps[shape["warmup"]:]), "wall_s": wall,
                "generation_s_all": [s.get("generation", 0.0) - s.get("sync", 0.0) for s in steps],   # as `trl_split` counts it, every step's
                "response_len_mean": statistics.fmean(lens) if lens else None,   # the work: tokens generated per sequence, as TRL logs it
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
                "args_dropped": sorted(set(want) - fields), "server_up_s": up_s if server else None,
                "first_step_s": first[0] + (t_build - t_import) if first else None,   # the server's start lies between the two marks
                "first_step_at": t_build + first[0] if first else None}   # perf_counter at the first step: `child` counts from the process's start
    finally:
        if server is not None:
            stop_group(server, 30)


# ---------------------------------------------------------------- one run in a subprocess
def partial_path(out_json:Path) -> Path:
    "Where a TRL run leaves its steps so far (read by the parent when the run is cut by its time limit)."
    return out_json.with_name(out_json.stem + ".partial.json")


def from_partial(run:str, partial:Path, rc) -> dict:
    "The record of a TRL run that did not end: its steps so far; statistics only when at least MIN_TIMED steps after warm-up completed."
    p = json.loads(partial.read_text())
    shape, steps = p["config"], p.pop("steps")
    n, done = shape["warmup"] + shape["steps"], len(steps)
    rec = {**p, "step_s_all": [s["step"] for s in steps]}
    if done - shape["warmup"] >= MIN_TIMED:
        rec.update(split_s=trl_split(steps[shape["warmup"]:]), stats=stats(rec["step_s_all"][shape["warmup"]:]),
                   stopped=f"stopped by the benchmark's time limit after {done} of {n} steps")
    else: rec["error"] = f"run exited {rc} after {done} of {n} steps ({[round(x, 1) for x in rec['step_s_all']]}); too few to count"
    return rec


def server_pid_path(out_json:Path) -> Path:
    "Where a TRL run writes its server's process group: the server runs in its own session, beyond the reach of a kill of the run."
    return out_json.with_name(out_json.stem + ".server.pid")


def end_leftover_server(out_json:Path, grace:float=20):
    "End the TRL server a run left behind (the run was killed before its own cleanup): SIGTERM, then SIGKILL; the next run needs its GPU."
    pid_file = server_pid_path(out_json)
    if not pid_file.exists(): return
    end_group(int(pid_file.read_text()), grace)   # not our child: nothing to reap, the group is watched until it is gone
    pid_file.unlink()


def from_process_start(first_step_at:float|None, # perf_counter at TRL's first step
                       own_s:float, # the benchmark's own work in this process before TRL started (building the model)
                      ) -> dict:
    "TRL's time to its first step counted as ours is, from its process's start (Python and torch's import included), less the benchmark's own work."
    try: from grpo_nb.trainer import process_age_s   # imported after the run, so its import is not counted
    except ImportError: return {}   # the older count (from TRL's imports) stays
    age = process_age_s()
    if first_step_at is None or age is None: return {}
    return {"first_step_s": first_step_at - (time.perf_counter() - age) - own_s, "first_step_from": "process start"}


def child(run:str, smoke:bool, out_json:Path, timeout:float):
    global SERVER_PID_FILE
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a TERM (the time limit) runs the cleanups: TRL's server is stopped
    SERVER_PID_FILE = server_pid_path(out_json)
    t_child = time.perf_counter()
    import torch
    side, *rest = run.split(":")
    shape_name = rest[-1]
    shape, model = SHAPES["smoke" if smoke else shape_name], SMOKE_MODEL if smoke else MODEL
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="e2e"))
    for var, sub in COLD_CACHES.items():   # a cold start for every run (both sides compile vLLM's graphs; a shared cache would favour whichever runs second)
        os.environ[var] = str(tmp / "cache" / sub)
    rec = {"run": run, "side": side, **({"peer": side} if side in PEERS else {}), "shape": shape_name, "config": shape, "model": model, "smoke": smoke,
           "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "compile_caches": "fresh"}   # `first_step_s` is a cold start (runs without this key shared the caches of the runs before them)
    with ClockLog() as clocks:   # the GPU's clocks through the run (nothing where nvidia-smi is missing)
        try:
            t_b = time.perf_counter(); model_dir = build_model(model, tmp / "model"); built_s = time.perf_counter() - t_b   # the benchmark's own work
            left = lambda: timeout - (time.perf_counter() - t_child) - 10
            if side == "ours":
                layout, mode = rest[0], rest[1]
                rec.update(layout=layout, mode=mode, backend="vllm", gpus=GPUS[("ours", layout)])
                rec.update(run_ours(layout, mode, shape, model, model_dir, tmp, device, left(), out_json.with_name(out_json.stem + ".train.log")))
            elif side == "verl":   # a failed verl run returns its error with its steps so far; nothing of ours is at stake here
                rec.update(backend=rest[0], gpus=GPUS[("verl", rest[0])])
                rec.update(run_verl(rest[0], shape, model_dir, tmp, prompts(model, shape, shape["prompts"] * (shape["warmup"] + shape["steps"] + 2)),
                                    toy_reward, left(), MIN_TIMED, dict(os.environ)))
            else:
                rec.update(backend=rest[0], gpus=GPUS[("trl", rest[0])])
                progress = lambda steps: partial_path(out_json).write_text(json.dumps({**rec, "steps": steps}))
                rec.update(run_trl(rest[0], shape, model, model_dir, tmp, device, progress))
                rec.update(from_process_start(rec.pop("first_step_at", None), built_s))
            if not rec.get("error"): rec["stats"] = stats(rec["step_s_all"][shape["warmup"]:])
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[-4000:]; traceback.print_exc()
    rec.update(clock_fields(clocks.samples, clocks.every_ms, rec.get("step_end_wall"), rec.get("step_s_all")))
    out_json.write_text(json.dumps(rec, indent=1))


def clock_fields(samples:list[dict], # `ClockLog.samples` of the run
                 every_ms:int, # their period
                 ends:list[float]|None, # each step's end (unix seconds), where the run recorded them
                 steps:list[float]|None, # each step's length (s)
                ) -> dict: # `gpu_clocks` (every sample, seconds from the first) and `sm_clock_mhz_per_step`; empty without samples
    "A run's GPU samples in its record, and each step's mean SM clock where the steps' ends are known."
    if not samples: return {}
    t0 = samples[0]["t"]
    out = {"gpu_clocks": {"every_ms": every_ms, "t0": t0, "fields": ["t_s", "gpu", *CLOCK_FIELDS],
                          "rows": [[round(x["t"] - t0, 3), x["gpu"], *(x[k] for k in CLOCK_FIELDS)] for x in samples]}}
    if ends and steps and len(ends) == len(steps): out["sm_clock_mhz_per_step"] = per_step(samples, ends, steps)
    return out


def peer_fields(peer:str, o:dict, p:dict) -> dict:
    "The keys of one comparison: each side's step statistics, split, peak memory, error and note (prefixed `ours_` and `<peer>_`), and the speed-up by mean where both completed on the same GPU model."
    rec = {}
    for side, r in (("ours", o), (peer, p)):
        s = r.get("stats") or {}
        rec |= {f"{side}_step_s": s.get("median"), f"{side}_step_mean_s": s.get("mean"), f"{side}_step_p90_s": s.get("p90"),
                f"{side}_step_s_all": r.get("step_s_all"), f"{side}_generation_s_all": r.get("generation_s_all"),
                f"{side}_split_s": r.get("split_s"), f"{side}_peak_gib": r.get("peak_gib"),
                f"{side}_error": r.get("error"), f"{side}_stopped": r.get("stopped"), f"{side}_first_step_s": r.get("first_step_s"),
                f"{side}_cold_start": r.get("compile_caches") == "fresh", f"{side}_response_len_mean": r.get("response_len_mean"),
                f"{side}_first_step_from": r.get("first_step_from", "process start" if side == "ours" else "its imports"),
                f"{side}_sm_clock_mhz_per_step": r.get("sm_clock_mhz_per_step")}   # each step's mean SM clock, where the run sampled it
    rec[f"{peer}_version"] = p.get("version")
    rec["ours_startup_s"] = o.get("startup_s")   # our start-up phases (Ray, learners, engine load and vLLM's own phases, connect)
    rec["ours_command"] = o.get("command")
    if peer != "trl":
        rec |= {f"{peer}_command": p.get("command"), f"{peer}_timing_s": p.get("timing_s"), f"{peer}_peak_gib_per_gpu": p.get("peak_gib_per_gpu"),
                f"{peer}_preflight": p.get("preflight")}
    short = [w for w, r in (("ours", o), (peer, p)) if r.get("prompt_note")]   # runs from before the digit prompts (`prompt_note` says what they read)
    if short: rec["prompt_note"] = f"{' and '.join(short)} measured with shorter prompts than the shape says: " + (o.get("prompt_note") or p["prompt_note"])
    if o.get("device") and p.get("device") and o["device"] != p["device"]:
        rec["note"] = f"ours ran on {o['device']}, {peer} on {p['device']}: no speed-up across GPU models"
    elif rec["ours_step_mean_s"] and rec[f"{peer}_step_mean_s"] and not rec["ours_error"] and not rec[f"{peer}_error"]:
        rec["speedup_mean"] = rec[f"{peer}_step_mean_s"] / rec["ours_step_mean_s"]
    return rec


def read_runs(run_dir:Path) -> dict:
    "The finished runs of a directory by name (partials, runs still in progress, are left out)."
    files = [p for p in sorted(run_dir.glob("run_*.json")) if not p.name.endswith(".partial.json")]
    return {r["run"]: r for r in (json.loads(p.read_text()) for p in files)}


def earlier_pairs(run_dir:Path, ours:str, peer:str) -> list[dict]:
    """Every earlier measurement of one comparison, kept in `run_dir/earlier/<name>/` when a newer pair replaced it: both sides'
    mean step and the speed-up, so that a page shows the spread between pairs, not only the newest."""
    out = []
    for d in sorted(p for p in (run_dir / "earlier").glob("*") if p.is_dir()):
        runs = read_runs(d)
        o, t = runs.get(ours, {}), runs.get(peer, {})
        om, tm = (o.get("stats") or {}).get("mean"), (t.get("stats") or {}).get("mean")
        if om and tm and o.get("device") == t.get("device"):
            out.append({"from": d.name, "ours_step_mean_s": om, "peer_step_mean_s": tm, "speedup_mean": tm / om,
                        "ours_first_step_s": o.get("first_step_s"), "peer_first_step_s": t.get("first_step_s"), "device": o.get("device")})
    return out


def merge(run_dir:Path) -> dict:
    "Pair our runs with each peer's on the same GPUs and work; one record per comparison, its `peer` naming the peer (earlier pairs under `earlier`)."
    runs = read_runs(run_dir)
    recs = []
    for shape in (*(k for k in SHAPES if k != "smoke"), "smoke"):
        has_runs = any(k.rsplit(":", 1)[-1] == shape for k in runs)
        for peer, pairs in PEERS.items():
            for layout, mode, backend in pairs:
                o, t = runs.get(f"ours:{layout}:{mode}:{shape}"), runs.get(f"{peer}:{backend}:{shape}")
                if o is None and t is None and (shape == "smoke" or not has_runs or layout not in SHAPE_LAYOUTS.get(shape, LAYOUTS)):
                    continue   # a shape with runs lists what is still unmeasured of it (in its layouts); a shape without any is left out
                if t is None and peer != "trl": continue   # a second peer's comparisons are listed once it has a run
                o, t = o or {}, t or {}
                target = TARGETS.get((peer, backend, mode))
                rec = {"peer": peer, "layout": layout, "shape": shape, "ours_mode": mode, "ours_backend": "vllm", f"{peer}_backend": backend,
                       "gpus": GPUS[("ours", layout)], "device": o.get("device") or t.get("device"), "config": o.get("config") or t.get("config"),
                       "target_speedup": target, **peer_fields(peer, o, t)}
                if rec.get("speedup_mean") and target: rec["target_met"] = rec["speedup_mean"] >= target
                if (before := earlier_pairs(run_dir, f"ours:{layout}:{mode}:{shape}", f"{peer}:{backend}:{shape}")): rec["earlier"] = before
                recs.append(rec)
    return {"records": recs, "runs": sorted(runs)}


def run_names(runs:str, peers:str, shapes:str) -> list[str]:
    "The runs of `--runs` plus every peer mode of `--peers` on every shape of `--shapes`, each checked against the modes this script knows."
    out = [r for r in runs.split(",") if r.strip()] + [f"{p.strip()}:{sh.strip()}" for p in peers.split(",") if p.strip() for sh in shapes.split(",") if sh.strip()]
    known = {f"ours:{l}:{m}" for (side, l) in GPUS if side == "ours" for m in (("sync", "one-step-off") if l == "split" else ("sync",))}
    known |= {f"{side}:{b}" for (side, b) in GPUS if side != "ours"}
    bad = [r for r in out if r.rsplit(":", 1)[0] not in known or r.rsplit(":", 1)[-1] not in SHAPES]
    if bad: raise SystemExit(f"unknown runs {bad}: a run is MODE:SHAPE with MODE one of {sorted(known)} and SHAPE one of {sorted(SHAPES)}")
    return out


def dry_run(runs:list[str], smoke:bool):
    "Print each run's command (ours), GRPOConfig arguments (TRL) or command and files (verl), running nothing and writing nothing."
    for run in runs:
        side, *rest = run.split(":")
        shape, model = SHAPES["smoke" if smoke else rest[-1]], SMOKE_MODEL if smoke else MODEL
        tmp, device = Path(tempfile.gettempdir()) / "e2eXXXX", "cpu" if smoke else "cuda"
        print(f"=== {run}: {shape}")
        if side == "ours":
            print("ours: grpo_nb train default " + shlex.join(ours_overrides(rest[0], rest[1], shape, tmp / "model", tmp / "prompts.jsonl", tmp, device)))
        elif side == "trl":
            print(f"trl {rest[0]}: GRPOConfig " + json.dumps(trl_args(rest[0], shape, tmp, device, 8000 if rest[0] == "vllm-server" else None, 51216)))
        else:
            n = shape["warmup"] + shape["steps"] + 2
            print(dry_run_text(verl_plan(rest[0], shape, tmp / "model", tmp, prompts(model, shape, shape["prompts"] * n), toy_reward, hide_trl=True)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="", help="comma-separated runs, e.g. ours:colocated:sync:bench,trl:vllm-colocate:bench,verl:hybrid:bench")
    ap.add_argument("--peers", default="", help=f"comma-separated peer modes to run on every shape of --shapes: {', '.join(f'{p}:{b}' for p, b in GPUS if p != 'ours')}")
    ap.add_argument("--shapes", default="bench", help="the shapes of --peers (comma-separated)")
    ap.add_argument("--out-dir", default="", help="where each run writes run_<name>.json")
    ap.add_argument("--merge", default="", help="merge the run files of this directory into --out")
    ap.add_argument("--out", default="", help="merged results JSON")
    ap.add_argument("--smoke", action="store_true", help="CPU-sized runs of ours (and TRL if installed)")
    ap.add_argument("--dry-run", action="store_true", help="print every run's command, arguments and files; run nothing")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--ours-extra", default="", help="overrides added to every run of ours, e.g. --ours-extra=--rollout.sleep_level=2 (a variant: give it an --out-dir of its own)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ours_extra: os.environ["E2E_OURS_EXTRA"] = a.ours_extra   # the children inherit it
    if a.child:
        child(a.child, a.smoke, Path(a.out), a.timeout); return
    if a.merge:
        out = Path(a.out or ROOT / "bench" / "results" / "e2e_vs_trl.json")
        out.write_text(json.dumps(merge(Path(a.merge)), indent=1)); print(out); return
    runs = run_names(a.runs, a.peers, a.shapes) or ["ours:colocated:sync:smoke", "ours:split:one-step-off:smoke"]
    if a.dry_run: dry_run(runs, a.smoke); return
    out_dir = Path(a.out_dir or tempfile.mkdtemp(prefix="e2e_runs")); out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **SAFE_ENV, "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    for run in runs:
        dst = out_dir / f"run_{run.replace(':', '_')}.json"
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", run, "--out", str(dst), "--timeout", str(a.timeout)] + (["--smoke"] if a.smoke else [])
        try: rc = subprocess.run(cmd, env=env, timeout=a.timeout + 30).returncode
        except subprocess.TimeoutExpired: rc = "timeout"
        end_leftover_server(dst)
        if not dst.exists():
            part = partial_path(dst)
            dst.write_text(json.dumps(from_partial(run, part, rc) if part.exists() else {"run": run, "error": f"run exited {rc} without a record"}))
        rec = json.loads(dst.read_text()); rec["run_wall_s"] = time.perf_counter() - t; dst.write_text(json.dumps(rec, indent=1))
        print(f"[{time.strftime('%H:%M:%S')}] {run}: {rec.get('stats')} {(rec.get('error') or '')[:300]}", flush=True)
    if a.smoke:
        res = merge(out_dir)
        print(json.dumps([{k: v for k, v in r.items() if not k.endswith("_all")} for r in res["records"]], indent=1))


if __name__ == "__main__":
    main()
