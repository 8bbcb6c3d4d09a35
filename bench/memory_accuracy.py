"""Predicted vs measured peak memory of real DeepSpeed training steps.

Each configuration runs in a fresh process: a random-init HF causal LM of a built-in shape (Qwen2.5
0.5B/1.5B/3B), bf16, sdpa attention, DeepSpeed ZeRO 0/2/3 with torch's fused AdamW and DeepSpeed's default
buckets, three optimizer steps, either HF's `labels=` loss ("full" logits) or grpo-nb's chunked log-probs
(`grpo_nb.loss.token_logprobs`). It records `torch.cuda.max_memory_allocated()` after start-up (reset after
`deepspeed.initialize`), per phase (forward+backward, optimizer step) and per step, next to the planner's
prediction (`grpo_nb.memory.learner_memory`) term by term. Two-GPU configurations run under torchrun and are
skipped when only one GPU is visible; with two GPUs visible, one-GPU configurations run two at a time.

GPU (one or two H100/H200; DeepSpeed carried in /tmp/site; about 4 minutes on one H200, 3 on two):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    PYTHONPATH=$PWD:/tmp/site python3 bench/memory_accuracy.py
CPU smoke test (no GPU; peak = live bytes of the CPU allocator from the torch profiler's memory events):
    .venv/bin/python bench/memory_accuracy.py --smoke --out /tmp/memory_accuracy.json
After a change to the planner (CPU only, nothing is measured):
    .venv/bin/python bench/memory_accuracy.py --repredict    # every record's prediction from today's planner; the one it was
                                                              # measured with stays as predicted_bytes_recorded
Output: bench/results/memory_accuracy.json = {"meta": {...}, "records": [{config..., "predicted_bytes",
"measured_bytes", "device", "error", "terms": {...}, "phases_measured": {...}, ...}, ...]}.
"""
from __future__ import annotations
import argparse, datetime, json, os, platform, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import GPU_ENV  # noqa: E402  (shared by the bench scripts)

# name, model, learners (GPUs), zero, micro_batch, seq_len, grad_ckpt, logits
GRID = [
    ("0.5B-z0-8x1024-ckpt-full",  "Qwen2.5-0.5B", 1, 0, 8, 1024, True, "full"),
    ("0.5B-z3-8x1024-ckpt-full",  "Qwen2.5-0.5B", 1, 3, 8, 1024, True, "full"),
    ("0.5B-z2-4x2048-nockpt-chunk", "Qwen2.5-0.5B", 1, 2, 4, 2048, False, "chunked"),
    ("0.5B-z0-16x512-nockpt-full", "Qwen2.5-0.5B", 1, 0, 16, 512, False, "full"),
    ("1.5B-z3-8x1024-ckpt-full",  "Qwen2.5-1.5B", 1, 3, 8, 1024, True, "full"),
    ("1.5B-z2-2x4096-ckpt-chunk", "Qwen2.5-1.5B", 1, 2, 2, 4096, True, "chunked"),
    ("1.5B-z0-1x8192-nockpt-chunk", "Qwen2.5-1.5B", 1, 0, 1, 8192, False, "chunked"),
    ("3B-z3-1x8192-ckpt-chunk",   "Qwen2.5-3B", 1, 3, 1, 8192, True, "chunked"),
    ("3B-z2-4x2048-ckpt-full",    "Qwen2.5-3B", 1, 2, 4, 2048, True, "full"),
    ("3B-z0-2x1024-nockpt-chunk", "Qwen2.5-3B", 1, 0, 2, 1024, False, "chunked"),
    ("0.5B-z3-4x2048-ckpt-chunk-2gpu", "Qwen2.5-0.5B", 2, 3, 4, 2048, True, "chunked"),
    ("1.5B-z2-2x4096-nockpt-chunk-2gpu", "Qwen2.5-1.5B", 2, 2, 2, 4096, False, "chunked"),
    ("1.5B-z3-8x1024-ckpt-chunk-2gpu", "Qwen2.5-1.5B", 2, 3, 8, 1024, True, "chunked"),
    ("3B-z3-1x8192-ckpt-full-2gpu", "Qwen2.5-3B", 2, 3, 1, 8192, True, "full"),
]

# CPU smoke: a tiny Qwen2-shaped model; small buckets so that the model states are visible next to them
TINY = dict(name="tiny-qwen2", family="qwen2", hidden=256, intermediate=704, layers=4, heads=4, kv_heads=2, head_dim=64,
            vocab=8192, tie_word_embeddings=True, attention_bias=True, qk_norm="none")
SMOKE_GRID = [
    ("tiny-z2-4x128-nockpt-full", TINY, 1, 2, 4, 128, False, "full"),
    ("tiny-z3-2x128-ckpt-chunk", TINY, 1, 3, 2, 128, True, "chunked"),
]
SMOKE_KNOBS = dict(reduce_bucket_size=200_000, allreduce_bucket_size=200_000, stage3_prefetch_bucket_size=50_000,
                   stage3_max_live_parameters=1_000_000, stage3_max_reuse_distance=1_000_000, stage3_param_persistence_threshold=10_000,
                   sub_group_size=1_000_000_000)
STEPS = 3
CHUNK = 1024
MULTI_GPU_ENV = GPU_ENV


def as_config(row) -> dict:
    name, model, learners, zero, mb, T, ckpt, logits = row
    return dict(name=name, model=model, learners=learners, zero=zero, micro_batch=mb, seq_len=T, grad_ckpt=ckpt, logits=logits,
                logprob_chunk=CHUNK, attn="sdpa", steps=STEPS)


def predict(cfg:dict, smoke:bool) -> dict:
    "The planner's prediction for one configuration (per GPU), with every term and phase."
    from grpo_nb.memory import ModelShape, ZeroKnobs, Overheads, learner_memory, TERMS
    model = ModelShape(**cfg["model"]) if isinstance(cfg["model"], dict) else cfg["model"]
    knobs = ZeroKnobs(**cfg["knobs"]) if cfg.get("knobs") else ZeroKnobs()
    m = learner_memory(model, learners=cfg["learners"], zero=cfg["zero"], micro_batch=cfg["micro_batch"], seq_len=cfg["seq_len"],
                       grad_ckpt=cfg["grad_ckpt"], attn=cfg["attn"], logits=cfg["logits"], logprob_chunk=cfg["logprob_chunk"],
                       knobs=knobs, overheads=Overheads(fixed_bytes=0) if smoke else Overheads(),
                       adam="single-tensor" if smoke else "fused")  # the learner's config asks for fused AdamW on CUDA only
    return {"predicted_bytes": m.peak_bytes, "predicted_phase": m.peak_phase, "terms": {k: getattr(m, k) for k in TERMS},
            "phases_predicted": {k: sum(v.values()) for k, v in m.phases.items()}, "phase_terms": m.phases}


def repredict(path:Path) -> list:
    """Rewrite every record's prediction in `path` with today's planner, for the record's own configuration (CPU only; the
    measurements are not touched). The prediction a record was made with stays as `predicted_bytes_recorded` (and
    `predicted_phase_recorded`). Returns (name, before, after) for each record rewritten."""
    d, done = json.loads(path.read_text()), []
    if d.get("meta", {}).get("smoke"): return done   # the smoke run's predictions use its own knobs and overheads
    for r in d["records"]:
        r.setdefault("predicted_bytes_recorded", r.get("predicted_bytes")); r.setdefault("predicted_phase_recorded", r.get("predicted_phase"))
        before = r.get("predicted_bytes")
        r.update(predict(r, smoke=False))
        if r.get("measured_bytes"): r["error"] = (r["predicted_bytes"] - r["measured_bytes"]) / r["measured_bytes"]
        done.append((r["name"], before, r["predicted_bytes"]))
    path.write_text(json.dumps(d, indent=1))
    return done


# ---------------------------------------------------------------- child: one configuration in this process
class CpuMemory:
    "Peak live bytes of the CPU allocator between marks, from the torch profiler's memory events (CUDA has max_memory_allocated)."
    def __init__(self):
        from torch.profiler import profile, ProfilerActivity
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.prof.__enter__()

    def mark(self, name:str):
        from torch.profiler import record_function
        with record_function(f"mark::{name}"): pass

    def stop(self) -> dict:
        self.prof.__exit__(None, None, None)
        evs = self.prof.profiler.kineto_results.events()
        mem = [(e.start_ns(), e.nbytes(), None) for e in evs if e.name() == "[memory]"]
        marks = [(e.start_ns(), 0, e.name()[6:]) for e in evs if e.name().startswith("mark::")]
        live = peak = 0
        out, last = {}, None
        for t, nb, name in sorted(mem + marks, key=lambda x: x[0]):
            if name is None:
                live += nb; peak = max(peak, live)
            else:
                if last is not None: out[f"peak:{last}->{name}"] = peak
                out[f"live:{name}"] = live
                last, peak = name, live
        return out


def replica_ds_config(zero_stage, dtype, device, lr, overrides=None):
    "What grpo_nb.learner.ds_config returns for bf16 without offload (used when grpo_nb.learner cannot be imported)."
    params = {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "torch_adam": True, **({"fused": True} if device == "cuda" else {})}
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**9, "wall_clock_breakdown": False,
           "zero_allow_untested_optimizer": True, "gradient_clipping": 1.0, "zero_optimization": {"stage": zero_stage},
           "optimizer": {"type": "AdamW", "params": params}, "bf16": {"enabled": dtype == "bfloat16"}, "fp16": {"enabled": False}}
    if dtype == "bfloat16" and zero_stage == 1: cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    for k, v in (overrides or {}).items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return cfg


def _replica_policy_class():
    import torch
    from grpo_nb.loss import token_logprobs

    class LogProbHead(torch.nn.Linear):
        def forward(self, hidden, targets=None, chunk=1024, kernel="auto"):
            if targets is None: return super().forward(hidden)
            return token_logprobs(hidden, self.weight, targets, chunk, kernel=kernel), None

    class PolicyLogProbs(torch.nn.Module):
        "grpo_nb.learner.PolicyLogProbs without varlen attention: log-probs of the scored tokens of a packed row."
        def __init__(self, policy):
            super().__init__(); policy.get_output_embeddings().__class__ = LogProbHead; self.policy = policy
        def forward(self, input_ids, position_ids, score_idx, targets, chunk=1024, kernel="auto"):
            h = self.policy.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state  # [1, L, h]
            return self.policy.get_output_embeddings()(h[0, score_idx], targets, chunk, kernel=kernel)
    return PolicyLogProbs


def ReplicaPolicyLogProbs(policy):
    return _replica_policy_class()(policy)


def child(cfg:dict, result_path:str, smoke:bool):
    import torch, torch.distributed as dist
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
    cuda = torch.cuda.is_available() and not smoke
    if not cuda: os.environ["DS_ACCELERATOR"] = "cpu"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda: torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, **({"device_id": dev} if cuda else {}))
    import deepspeed
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # a CPU-only optimisation that JIT-compiles for a minute
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config, LlamaConfig, Olmo2Config
    from grpo_nb.memory import ModelShape, ZeroKnobs, get_shape
    shape = ModelShape(**cfg["model"]) if isinstance(cfg["model"], dict) else get_shape(cfg["model"])
    knobs = ZeroKnobs(**cfg["knobs"]) if cfg.get("knobs") else ZeroKnobs()
    tracker = None if cuda else CpuMemory()
    mark = (lambda n: None) if cuda else tracker.mark
    hf = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig, "olmo2": Olmo2Config}[shape.family](
        hidden_size=shape.hidden, intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, vocab_size=shape.vocab,
        tie_word_embeddings=shape.tie_word_embeddings, use_cache=False)
    torch.manual_seed(0)
    with torch.device(dev):
        lm = AutoModelForCausalLM.from_config(hf, attn_implementation=cfg["attn"], dtype=torch.bfloat16)
    if cfg["grad_ckpt"]: lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()

    # the project's learner module and DeepSpeed config when importable (grpo_nb.learner needs fastcore), else replicas of them
    try:
        from grpo_nb.learner import PolicyLogProbs, ds_config
        code = "grpo_nb.learner"
    except ImportError:
        PolicyLogProbs, ds_config, code = ReplicaPolicyLogProbs, replica_ds_config, "bench replica of grpo_nb.learner"
    T, B = cfg["seq_len"], cfg["micro_batch"]
    if cfg["logits"].startswith("chunked"):
        module = PolicyLogProbs(lm)  # the output projection becomes a LogProbHead (chunked log-probs inside the module)
        # B sequences in one row [1, B·T]. Positions run on through the row: restarting them would make HF build an explicit
        # [L, L] packed-sequence mask, which sends sdpa to repeat_kv + a masked kernel; the learner's varlen flash path does not.
        pos = torch.arange(B * T, device=dev)[None]
        score = torch.tensor([i for i in range(B * T) if i % T != T - 1], device=dev)  # every position but each sequence's last
    else:
        module = lm
    overrides = {"zero_optimization": {"reduce_bucket_size": knobs.reduce_bucket_size, "allgather_bucket_size": knobs.allreduce_bucket_size}}
    if cfg["zero"] == 3:
        overrides["zero_optimization"].update(
            stage3_prefetch_bucket_size=knobs.stage3_prefetch_bucket_size, stage3_max_live_parameters=knobs.stage3_max_live_parameters,
            stage3_max_reuse_distance=knobs.stage3_max_reuse_distance,
            stage3_param_persistence_threshold=knobs.stage3_param_persistence_threshold, sub_group_size=knobs.sub_group_size)
    if cfg["zero"] <= 1 and world > 1: overrides["allreduce_bucket_size"] = knobs.allreduce_bucket_size
    ds = ds_config(cfg["zero"], "bfloat16", "cuda" if cuda else "cpu", lr=1e-5, overrides=overrides)
    engine, *_ = deepspeed.initialize(model=module, config=ds, model_parameters=[p for p in module.parameters() if p.requires_grad])
    if cuda: torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    mark("init")
    rec = {"init_allocated_bytes": torch.cuda.memory_allocated() if cuda else None, "steps": []}
    g = torch.Generator(device="cpu").manual_seed(1 + rank)
    t0 = time.time()
    for k in range(cfg["steps"]):
        x = torch.randint(0, shape.vocab, (B, T), generator=g).to(dev)
        mark(f"s{k}")
        if cfg["logits"].startswith("chunked"):   # "chunked": the loop of torch ops; "chunked-triton": the fused kernels
            row = x.reshape(1, -1)
            logp, _ = engine(row, pos, score, row[0, score + 1], chunk=cfg["logprob_chunk"],
                             kernel="triton" if cfg["logits"] == "chunked-triton" else "torch")
            loss = -logp.mean()
        else:
            loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        if cuda: torch.cuda.synchronize(); fb = torch.cuda.max_memory_allocated(); torch.cuda.reset_peak_memory_stats()
        mark(f"b{k}")
        engine.step()
        if cuda: torch.cuda.synchronize(); st = torch.cuda.max_memory_allocated(); torch.cuda.reset_peak_memory_stats()
        mark(f"e{k}")
        if cuda: rec["steps"].append({"loss": float(loss), "fwd_bwd_peak": fb, "step_peak": st, "allocated_after": torch.cuda.memory_allocated()})
        else: rec["steps"].append({"loss": float(loss)})
        del loss
    rec["seconds_per_step"] = (time.time() - t0) / cfg["steps"]
    if not cuda:
        m = tracker.stop()
        rec["init_allocated_bytes"] = m.get("live:init")
        for k, s in enumerate(rec["steps"]):
            s.update(fwd_bwd_peak=m.get(f"peak:s{k}->b{k}"), step_peak=m.get(f"peak:b{k}->e{k}"), allocated_after=m.get(f"live:e{k}"))
    peaks = [max(s["fwd_bwd_peak"], s["step_peak"]) for s in rec["steps"]]
    mine = torch.tensor([max(peaks)], dtype=torch.float64, device=dev)
    allr = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(allr, mine)
    rec["measured_bytes"] = int(max(t.item() for t in allr))  # the fullest GPU
    rec["measured_bytes_per_rank"] = [int(t.item()) for t in allr]
    rec["device"] = torch.cuda.get_device_name(dev) if cuda else f"cpu ({platform.processor() or platform.machine()})"
    rec["learner_code"] = code
    rec["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "transformers": __import__("transformers").__version__}
    if rank == 0: Path(result_path).write_text(json.dumps(rec))
    dist.barrier(); dist.destroy_process_group()


# ---------------------------------------------------------------- parent: the grid
def launch(cfg:dict, gpus:list[int], smoke:bool, timeout:float):
    "Start one configuration in a fresh process (torchrun for several GPUs); returns (Popen, result path)."
    res = tempfile.NamedTemporaryFile(prefix="memacc-", suffix=".json", delete=False).name
    args = ["--one", json.dumps(cfg), "--result", res] + (["--smoke"] if smoke else [])
    if len(gpus) > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={len(gpus)}", __file__, *args]
    else:
        cmd = [sys.executable, __file__, *args]
    env = {**os.environ, **MULTI_GPU_ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if gpus and not smoke: env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    log = tempfile.NamedTemporaryFile(prefix="memacc-", suffix=".log", delete=False)
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), res, log.name, time.time()


def finish(cfg:dict, proc, res:str, logf:str, started:float, smoke:bool) -> dict:
    rec = {**{k: v for k, v in cfg.items() if k != "model"}, "model": cfg["model"] if isinstance(cfg["model"], str) else cfg["model"]["name"]}
    rec.update(predict(cfg, smoke))
    rec["wall_s"] = round(time.time() - started, 1)
    out = Path(res).read_text() if Path(res).exists() and Path(res).stat().st_size else ""
    tail = Path(logf).read_text()[-3000:]
    if proc.returncode == 0 and out:
        rec.update(json.loads(out)); rec["status"] = "ok"
        rec["error"] = (rec["predicted_bytes"] - rec["measured_bytes"]) / rec["measured_bytes"]
    else:
        rec.update(status="oom" if "OutOfMemoryError" in tail or "out of memory" in tail else f"failed (exit {proc.returncode})",
                   measured_bytes=None, device=None, error=None, log_tail=tail)
    for p in (res, logf): Path(p).unlink(missing_ok=True)
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny configurations on CPU (the code path, not GPU numbers)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/memory_accuracy.json"), help="output JSON")
    ap.add_argument("--only", default="", help="comma-separated substrings of configuration names to run")
    ap.add_argument("--budget-s", type=float, default=330, help="skip configurations not started within this many seconds")
    ap.add_argument("--timeout-s", type=float, default=None, help="kill one configuration after this many seconds (180 on GPU, 900 with --smoke)")
    ap.add_argument("--repredict", action="store_true", help="CPU only: rewrite every record's prediction in --out with "
                    "today's planner (the one it was measured with stays as predicted_bytes_recorded); runs nothing")
    ap.add_argument("--one", help=argparse.SUPPRESS); ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one: return child(json.loads(a.one), a.result, a.smoke)
    if a.repredict:
        for name, before, after in repredict(Path(a.out)): print(f"{name:<34} predicted {(before or 0) / 2**30:7.2f} GiB -> {after / 2**30:7.2f} GiB")
        return 0
    if a.timeout_s is None: a.timeout_s = 900 if a.smoke else 180

    import torch
    ngpu = 0 if a.smoke else torch.cuda.device_count()
    if not a.smoke and ngpu == 0: sys.exit("no GPU visible: run with --smoke on CPU")
    rows = SMOKE_GRID if a.smoke else GRID
    cfgs = [as_config(r) for r in rows if not a.only or any(s in r[0] for s in a.only.split(","))]
    if a.smoke:
        for c in cfgs: c["knobs"] = SMOKE_KNOBS; c["logprob_chunk"] = 64; c["steps"] = 2
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpus_visible": ngpu, "smoke": a.smoke,
            "python": platform.python_version(), "host": platform.node(), "steps": STEPS,
            "measured": "torch.cuda.max_memory_allocated() after deepspeed.initialize, max over steps and ranks"
                        if not a.smoke else "CPU allocator live bytes (torch profiler memory events), max over steps"}
    out, records, t0 = Path(a.out), [], time.time()
    out.parent.mkdir(parents=True, exist_ok=True)
    def save(): out.write_text(json.dumps({"meta": {**meta, "wall_s": round(time.time() - t0, 1)}, "records": records}, indent=1))
    queue = list(cfgs)
    running = []  # (cfg, gpus, proc, res, log, started)
    free = list(range(max(ngpu, 1)))
    while queue or running:
        for cfg in list(queue):  # start what fits on the free GPUs
            need = 1 if a.smoke else cfg["learners"]
            if need > max(ngpu, 1):
                queue.remove(cfg); records.append({**predict(cfg, a.smoke), **cfg, "status": f"skipped: needs {need} GPUs, {ngpu} visible",
                                                   "measured_bytes": None, "device": None, "error": None}); save(); continue
            if time.time() - t0 > a.budget_s:
                queue.remove(cfg); records.append({**predict(cfg, a.smoke), **cfg, "status": "skipped: time budget",
                                                   "measured_bytes": None, "device": None, "error": None}); save(); continue
            if need <= len(free) and (not running or not a.smoke):
                gpus, free = free[:need], free[need:]
                queue.remove(cfg); running.append((cfg, gpus, *launch(cfg, gpus, a.smoke, a.timeout_s)))
                print(f"[{time.time() - t0:6.1f}s] start {cfg['name']} on GPU(s) {gpus}", flush=True)
        time.sleep(0.5)
        for item in list(running):
            cfg, gpus, proc, res, logf, started = item
            if proc.poll() is None and time.time() - started > a.timeout_s: proc.kill(); proc.wait()
            if proc.poll() is None: continue
            running.remove(item); free = sorted(free + gpus)
            r = finish(cfg, proc, res, logf, started, a.smoke)
            if isinstance(cfg["model"], dict): r["model"] = cfg["model"]["name"]
            records.append(r); save()
            err = f"{100 * r['error']:+.1f}%" if r["error"] is not None else r["status"]
            meas = f"{r['measured_bytes'] / 2**30:.2f}" if r["measured_bytes"] else "-"
            print(f"[{time.time() - t0:6.1f}s] {cfg['name']:<34} predicted {r['predicted_bytes'] / 2**30:7.2f} GiB "
                  f"measured {meas:>7} GiB  {err}  ({r['wall_s']} s)", flush=True)
    records.sort(key=lambda r: [c["name"] for c in cfgs].index(r["name"]))
    save()
    print(f"wrote {out} ({len(records)} records, {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
