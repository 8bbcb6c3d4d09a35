#!/usr/bin/env python3
"""Learner throughput and MFU on H100/H200: the learner's own step (packed micro-batches, varlen or per-sequence
attention, chunked log-probs, the GRPO loss, DeepSpeed) on random-init Qwen2.5-0.5B / 1.5B shapes, one GPU
(ZeRO-1: bf16 weights, fp32 master weights and gradients, fused AdamW) and two GPUs (ZeRO-3).

MFU = model FLOPs / step time / (989 TFLOP/s dense bf16 × GPUs), with model FLOPs per optimizer step
    6·N_body·T + 6·V·H·T_scored + 6·layers·H·Σ s²
(N_body: parameters except the embedding and the output projection; T: tokens trained on; T_scored:
completion tokens, the only ones whose log-prob is computed; s: each sequence's length — causal attention).
For a tied model that scores every token this is the usual (6·N + 6·layers·H·s)·T. Recomputation
(gradient checkpointing, the log-prob backward's logits) is not counted.

Beside each measurement: the memory planner's prediction (grpo_nb.memory.learner_memory, for the longest
packed row of the step) of the peak that torch.cuda.max_memory_allocated reports during the step.

On a GPU node (the repo on PYTHONPATH; what else it needs: the guide page "Measured on GPUs", nbs/guides/gpu_results.ipynb):
    python bench/learner_mfu.py --part 1gpu --out bench/results/learner_mfu.json    # one GPU, about 5 min
    python bench/learner_mfu.py --part 2gpu --out bench/results/learner_mfu.json    # two GPUs, about 4 min
On this CPU machine: python bench/learner_mfu.py --smoke    (tiny model, fp32, gloo; writes /tmp/learner_mfu_smoke.json)
After a change to the planner (CPU only, nothing is measured):
    python bench/learner_mfu.py --repredict    # every record's predicted_bytes from today's planner, for its own configuration;
                                               # the prediction made when it was measured stays as predicted_bytes_recorded

Every variant runs in its own process group with a time limit (a crash, an OOM or a hang costs that record
only); the results file is rewritten after every variant, records of other parts and variants are kept.
Variants run most important first; those that no longer fit into --budget-s are recorded as skipped.
"""
import argparse, importlib.util, json, os, signal, subprocess, sys, time, traceback, typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from common import GPU_ENV as COMMON_GPU_ENV, step_stats  # noqa: E402  (shared by the bench scripts)
PEAK = 989e12  # H100/H200 SXM dense bf16 FLOP/s
FORMULA = "MFU = (6·N_body·T + 6·V·H·T_scored + 6·layers·H·Σs²) / step_s / (989e12 · gpus)"
GPU_ENV = {**COMMON_GPU_ENV, "RAY_agent_register_timeout_ms": "120000"}  # the raylet's wait for its runtime-env agent (30 s by default)
SMOKE_CFG = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 512, "tie_word_embeddings": True, "max_position_embeddings": 4096}


def hf_config(name:str) -> dict:
    "A config dict with the shape of a published model (random init; its own architecture where it is not Qwen2), or the smoke model's."
    if name == "tiny": return dict(SMOKE_CFG)
    from grpo_nb.memory import ARCHS, shape_to_hf
    s = ARCHS[name]
    if s.family != "qwen2": return shape_to_hf(s) | {"max_position_embeddings": 32768}   # e.g. OLMo-2: its q/k norms and post-norms are part of what is timed
    return {"model_type": "qwen2", "hidden_size": s.hidden, "intermediate_size": s.intermediate, "num_hidden_layers": s.layers,
            "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "vocab_size": s.vocab,
            "tie_word_embeddings": s.tie_word_embeddings, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6, "use_sliding_window": False}


def make_batch(step:int, tokens:int, vocab:int, prompt:int, lo:int, hi:int):
    "GRPO-like sequences: a `prompt`-token prompt, completions of lo..hi tokens, about `tokens` tokens in all."
    import torch
    from grpo_nb.learner import TrainBatch
    g = torch.Generator().manual_seed(step)
    ids, plen, total = [], [], 0
    while total < tokens:
        n = prompt + int(torch.randint(lo, hi + 1, (1,), generator=g))
        if total + n > tokens: n = max(prompt + 1, tokens - total)
        ids.append(torch.randint(4, vocab, (n,), generator=g).tolist()); plen.append(prompt); total += n
    adv = torch.randn(len(ids), generator=g).tolist()
    roll = [(-torch.rand(len(s) - p, generator=g)).tolist() for s, p in zip(ids, plen)]
    return TrainBatch(ids, plen, adv, rollout_logprobs=roll)


def longest_row(batch, gpus:int, pack:int) -> int:
    "Tokens of the longest packed micro-batch any rank runs (what the activations are sized by)."
    from grpo_nb.learner import pack_sequences, shard_batch
    lens = [len(s) for s in batch.input_ids]
    return max(sum(lens[idx[i]] for i in p) for idx in shard_batch(lens, gpus) for p in pack_sequences([lens[i] for i in idx], pack))


def predicted(v:dict, seq_len:int) -> int|None:
    "The planner's peak (bytes) for this variant with micro-batches of `seq_len` tokens."
    try:
        from grpo_nb.memory import ZERO3_BUCKETS, elementwise_fused, head_logits_mode, learner_memory, shape_from_hf
        model = shape_from_hf(hf_config("tiny")) if v["model"] == "tiny" else v["model"]
        logits = head_logits_mode(v.get("head", "auto"), triton_runs=False if v["model"] == "tiny" else None)   # the tiny model runs on CPU
        # varlen and per-sequence sdpa keep what flash attention keeps (no [L, L] scores)
        return int(learner_memory(model, learners=v["gpus"], zero=v["zero"], micro_batch=1, seq_len=seq_len, grad_ckpt=v["ckpt"],
                                  knobs=ZERO3_BUCKETS[v.get("buckets", "deepspeed")],
                                  attn="flash_attention_2", logits=logits, logprob_chunk=v["chunk"], adam="fused",
                                  fused=elementwise_fused(v.get("kernels", "torch"), v["compile"])).peak_bytes)
    except Exception as e:
        print(f"planner: {type(e).__name__}: {e}", flush=True); return None


def pick_pack(v:dict, gpu_bytes:int) -> int|None:
    "The longest pack length (≤ 16384) whose predicted peak leaves 20% of the GPU free; None when even 4096 tokens do not."
    for pack in (16384, 12288, 8192, 4096):
        p = predicted(v, pack)
        if p is not None and p < 0.8 * gpu_bytes: return pack
    return None


def fit_variant(v:dict, gpu_bytes:int) -> dict:
    "Give `v` its pack length; where the planner says no pack fits without gradient checkpointing (7B on 2 GPUs), turn checkpointing on and say so."
    pack = pick_pack(v, gpu_bytes)
    if pack is None and not v["ckpt"]:
        v["ckpt"], v["note"] = True, "gradient checkpointing on: without it the planner fits no pack of 4096 tokens in 80% of the GPU"
        pack = pick_pack(v, gpu_bytes)
    if pack is None: v["note"] = (v.get("note", "") + "; " if v.get("note") else "") + "the planner fits no pack of 4096 tokens in 80% of the GPU: run at 4096 anyway"
    v["pack"] = pack or 4096
    return v


def given_pack(v:dict, pack:int, gpu_bytes:int) -> dict:
    "Give `v` the pack asked for; where the planner fits it in 90% of the GPU only with gradient checkpointing, turn checkpointing on and say so."
    v["pack"] = pack
    fits = lambda: (predicted(v, pack) or float("inf")) < 0.9 * gpu_bytes
    if not v["ckpt"] and not fits():
        v["ckpt"] = True
        v["note"] = f"gradient checkpointing on: without it the planner fits no pack of {pack} tokens in 90% of the GPU"
        if not fits(): v["note"] += "; with it neither: run anyway"
    return v


def spec_for(v:dict, device:str):
    from grpo_nb.config import LearnerConfig
    from grpo_nb.learner import LearnerSpec
    L = LearnerConfig(learning_rate=1e-6, zero_stage=v["zero"], micro_batch_size=100_000, gradient_accumulation_steps=1, zero3_buckets=v.get("buckets", "deepspeed"),
                      pack_length=v["pack"], logprob_chunk=v["chunk"], logprob_kernel=v.get("head", "auto"), max_grad_norm=1.0)
    return LearnerSpec(model=hf_config(v["model"]), learner=L, device=device, dtype=v.get("dtype", "auto"), gradient_checkpointing=v["ckpt"],
                       compile=v["compile"], kernels=v.get("kernels", "torch"), temperature=1.0, norm_len=v["hi"], peak_flops=None if device == "cpu" else PEAK)


def measure(step_fn, v:dict, t_start:float) -> dict:
    "Warm-up steps, then timed steps; tokens/s, MFU and peak memory from the learner's own metrics."
    vocab = hf_config(v["model"])["vocab_size"]
    ms, rows, first_s = [], [], None
    for s in range(v["warmup"] + v["steps"]):
        b = make_batch(s, v["tokens"], vocab, v["prompt"], v["lo"], v["hi"])
        t = time.perf_counter()
        m = step_fn(b)
        if first_s is None: first_s = time.perf_counter() - t
        if not v.get("quiet"):
            print(f"  step {s}: {time.perf_counter() - t:.2f} s, {m['micro_batches']} micro-batches, loss {m['loss']:.4f}, "
                  f"peak {m['peak_bytes'] / 2**30:.1f} GiB" + (f", MFU {m['mfu']:.3f}" if "mfu" in m else ""), flush=True)
        if s >= v["warmup"]: ms.append(m); rows.append(longest_row(b, v["gpus"], v["pack"]))
    prof = None
    if v.get("profile"):
        try: prof = time_breakdown(step_fn, make_batch(10**6, v["tokens"], vocab, v["prompt"], v["lo"], v["hi"]), v["model"] != "tiny")
        except Exception as e: prof = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"  profiled step: {prof}", flush=True)
    mem = None
    if v.get("memory_peak"):
        try: mem = memory_at_peak(step_fn, make_batch(10**6 + 1, v["tokens"], vocab, v["prompt"], v["lo"], v["hi"]))
        except Exception as e: mem = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"  memory at the step's peak: {mem}", flush=True)
    T, F = sum(m["time_s"] for m in ms), sum(m["flops"] for m in ms)
    peak = max(m["peak_bytes"] for m in ms)
    row = max(rows)
    return {"tokens_per_s": sum(m["train_tokens"] for m in ms) / T, "mfu": F / T / (PEAK * v["gpus"]),
            "measured_bytes": peak or None, "predicted_bytes": predicted(v, row), "predicted_bytes_at_pack": predicted(v, v["pack"]),
            "longest_row": row, "step_s": T / len(ms), "first_step_s": first_s, "step_s_all": [m["time_s"] for m in ms],
            **{f"step_{k}_s": x for k, x in step_stats([m["time_s"] for m in ms]).items() if k != "mean"},   # step_median_s, step_p90_s
            "mfu_steps": [m["flops"] / m["time_s"] / (PEAK * v["gpus"]) for m in ms], "tokens_per_step": ms[0]["train_tokens"],
            "micro_batches": ms[0]["micro_batches"], "losses": [m["loss"] for m in ms], "grad_norm": ms[-1]["grad_norm"],
            "setup_s": t_start, "time_breakdown": prof, **({"memory_at_peak": mem} if mem is not None else {})}


def peak_composition(events:list, # one device's allocator trace (`torch.cuda.memory._snapshot()["device_traces"][i]`)
                     before:int=0, # bytes allocated when the trace began (no frames: the states and whatever the step keeps)
                     top:int=12, # groups listed
                    ) -> dict:
    """What was allocated at the highest point of a trace: the bytes live then, grouped by the innermost frame of
    this project, transformers, DeepSpeed or torch (else the innermost frame), largest first. It is what a planner
    term must cover at the peak: compare each group with the term meant to hold it."""
    live, total, best, at = {}, before, before, {}
    for e in events:
        a = e.get("action")
        if a == "alloc": live[e["addr"]] = e; total += e["size"]
        elif a == "free_completed" and e["addr"] in live: total -= live.pop(e["addr"])["size"]
        else: continue
        if total > best: best, at = total, dict(live)
    def where(e):
        fr = e.get("frames") or []
        pick = next((f for f in fr if any(k in f.get("filename", "") for k in ("grpo_nb", "transformers", "deepspeed", "liger"))), None) \
               or next((f for f in fr if "torch" in f.get("filename", "")), fr[0] if fr else None)
        return f"{Path(pick['filename']).name}:{pick['line']} {pick['name']}" if pick else "(no frames)"
    groups = {}
    for e in at.values(): groups[where(e)] = groups.get(where(e), 0) + e["size"]
    return {"peak_bytes": best, "before_bytes": before, "step_bytes": best - before,
            "groups": sorted(([k, b] for k, b in groups.items()), key=lambda x: -x[1])[:top]}


def memory_at_peak(step_fn, batch) -> dict:
    "One more step with the CUDA allocator's history on; `peak_composition` of its trace (what the planner must cover)."
    import torch
    torch.cuda.synchronize(); before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=500_000)
    try:
        step_fn(batch); torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally: torch.cuda.memory._record_memory_history(enabled=None)
    return peak_composition(snap["device_traces"][torch.cuda.current_device()], before)


KERNEL_KINDS = {"attention": ("flash", "fmha", "attention", "attn", "sdpa"), "optimizer": ("adam", "multi_tensor", "foreach"),
                "communication": ("nccl", "allreduce", "all_gather", "reduce_scatter"),
                "matmul": ("gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm")}


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")   # the operators the profiler counts FLOPs for


def time_breakdown(step_fn, batch, cuda:bool) -> dict:
    """One more step under torch.profiler: seconds of GPU kernels by kind (matmul, attention, optimizer, communication,
    other = elementwise ops and reductions), the share of the step's wall time the GPU was idle (no kernel of any
    stream running), the matmuls' own FLOPs and rate, and the longest kernels. It says what limits MFU (idle: the CPU
    feeds the GPU too slowly; other: memory-bound kernels; matmul: the matmuls themselves, at the rate they reach on
    these shapes, which is the hardware's part). Kernels of different streams (ZeRO-3's communication) can overlap, so
    the kinds can sum to more than the busy time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, with_flops=True) as prof:
        t = time.perf_counter(); step_fn(batch)
        if cuda: torch.cuda.synchronize()
        wall = time.perf_counter() - t
    out, top, mm_flops = dict.fromkeys([*KERNEL_KINDS, "other"], 0.0), [], 0
    for e in prof.key_averages():
        on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
        if not on_gpu and e.key in MATMUL_OPS: mm_flops += e.flops or 0
        if cuda != on_gpu or (not cuda and not e.key.startswith("aten::")): continue
        sec = (getattr(e, "self_device_time_total", 0) if cuda else e.self_cpu_time_total) / 1e6
        name = e.key.lower()
        out[next((k for k, keys in KERNEL_KINDS.items() if any(x in name for x in keys)), "other")] += sec
        top.append((e.key[:100], sec, e.count))
    kinds_s = sum(out.values())
    busy = kinds_s
    if cuda:   # the union of kernel intervals over all streams: time the GPU ran anything
        iv = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        if iv:
            busy, (s0, e0) = 0.0, iv[0]
            for s1, e1 in iv[1:]:
                if s1 > e0: busy, s0, e0 = busy + (e0 - s0), s1, e1
                else: e0 = max(e0, e1)
            busy = (busy + e0 - s0) / 1e6
    top.sort(key=lambda x: -x[1])
    return {"wall_s": wall, "busy_s": busy, "kinds_sum_s": kinds_s, "idle_frac": max(0.0, 1 - busy / wall) if cuda else None,
            **{f"{k}_s": v for k, v in out.items()}, "matmul_flops": mm_flops,
            "matmul_tflops_per_s": mm_flops / out["matmul"] / 1e12 if out["matmul"] else None,
            "top_kernels": [[n, round(sec, 5), c] for n, sec, c in top[:15]]}


def head_in_use(v:dict) -> str:
    "The log-prob head a variant runs: its `head` setting, with auto resolved as the learner resolves it (triton on a GPU that has it)."
    from grpo_nb.memory import head_logits_mode
    return "triton" if head_logits_mode(v.get("head", "auto"), triton_runs=False if v["model"] == "tiny" else None) == "chunked-triton" else "torch"


def record(v:dict, device_name:str, info:dict|None, res:dict|None, err:str|None) -> dict:
    r = {"model": v["model"], "gpus": v["gpus"], "zero": v["zero"], "tokens_per_s": None, "mfu": None, "measured_bytes": None,
         "predicted_bytes": None, "device": device_name, "variant": v["variant"], "pack_length": v["pack"],
         "grad_ckpt": v["ckpt"], "compile": v["compile"], "attention": (info or {}).get("attention_kernel"),
         "launcher": v.get("launcher"), "zero3_buckets": v.get("buckets", "deepspeed") if v["zero"] == 3 else None, "kernels": v.get("kernels", "torch"),
         "logprob_chunk": v["chunk"], "micro_batches": v.get("micro_batches", 4), "warmup_steps": v.get("warmup"), "logprob_kernel": (info or {}).get("logprob_kernel") or head_in_use(v)}   # what the learner ran, where it said
    if v.get("note"): r["note"] = v["note"]
    if res: r.update(res)
    if r.get("measured_bytes") and r.get("predicted_bytes"): r["predicted_over_measured"] = r["predicted_bytes"] / r["measured_bytes"]
    if err: r["error"] = err
    return r


def versions() -> dict:
    "Installed versions (read from package metadata: nothing is imported)."
    from importlib.metadata import version, PackageNotFoundError
    out = {}
    for m in ("torch", "deepspeed", "transformers", "ray", "liger_kernel"):
        try: out[m] = version(m)
        except PackageNotFoundError: out[m] = None
    return out


# ---- one variant, in its own process ---------------------------------------------------------------------

def run_local(v:dict) -> dict:
    "One GPU (or the CPU smoke): the learner group with one in-process rank."
    import torch
    from grpo_nb.learner import create_learner_group
    device = "cpu" if v["model"] == "tiny" else "cuda"
    name = "cpu (smoke)" if device == "cpu" else torch.cuda.get_device_name(0)
    info, t0 = None, time.perf_counter()
    try:
        check = logprob_check(v, device) if v.get("kernels", "torch") != "torch" and not v.get("skip_check") else {}   # first: its torch-kernel models precede any Liger patch
        g = create_learner_group(spec_for(v, device), 1, local=True)
        info = g.info[0]
        print(f"{v['variant']}: {g} ({info['attention_kernel']}), set up in {time.perf_counter() - t0:.1f} s", flush=True)
        res = measure(g.step, v, time.perf_counter() - t0)
        g.shutdown()
        return record(v, name, info, {**res, **check, "kernels": info.get("kernels")}, None)
    except Exception as e:
        traceback.print_exc()
        return record(v, name, info, None, f"{type(e).__name__}: {str(e)[:300]}")


def logprob_check(v:dict, device:str) -> dict:
    """The learner's log-probs on one fixed batch with the model's own kernels, then with `v['kernels']`, from the same
    initial weights (same seed): the largest absolute difference, in bf16 and in fp32. It runs before the timed steps
    and builds every torch-kernel model before the first Liger one, since Liger's rotary kernel is patched into the
    transformers module for the whole process; each group's close() empties its tensors and the allocator is emptied before timing."""
    import torch
    from grpo_nb.learner import create_learner_group
    vocab = hf_config(v["model"])["vocab_size"]
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in (96, 160, 256, 512)]
    lens = [32, 64, 16, 128]
    out = {}
    for k in ("torch", v["kernels"]):            # every torch-kernel model before the first Liger one (the process-wide rotary patch)
        for dtype in ("auto", "float32"):        # bf16 on GPU (what trains), and fp32 (the kernels' own error, without bf16 rounding)
            grp = create_learner_group(spec_for({**v, "kernels": k, "dtype": dtype}, device), 1, local=True)
            out[k, dtype] = grp.actors[0].ws_logprobs(seqs, lens)
            grp.shutdown(); del grp
            import gc; gc.collect(); torch.cuda.empty_cache()
    res = {}
    for dtype in ("auto", "float32"):
        d = max(abs(a - b) for x, y in zip(out["torch", dtype], out[v["kernels"], dtype]) for a, b in zip(x, y))
        print(f"  log-probs ({dtype}), {v['kernels']} vs torch kernels: max |diff| {d:.2e}", flush=True)
        res["logprob_max_abs_diff_vs_torch" + ("" if dtype == "auto" else "_fp32")] = d
    return res


def run_ray(v:dict) -> dict:
    "Two GPUs through the learner group itself: two Ray actors, one NCCL world, ZeRO-3 (spawned processes if Ray will not start)."
    import ray, torch
    from grpo_nb.actors import local_ray_node
    from grpo_nb.learner import create_learner_group
    smoke = v["model"] == "tiny"
    name = "cpu (smoke)" if smoke else f"{v['gpus']} × {torch.cuda.get_device_name(0)}"
    env = {k: os.environ[k] for k in ("PYTHONPATH", *GPU_ENV) if k in os.environ}
    try:
        cluster = local_ray_node(2 * v["gpus"] if smoke else 8, 0 if smoke else v["gpus"], int((0.2 if smoke else 2) * 2**30))
        ray.init(address=cluster.address, log_to_driver=True, runtime_env={"env_vars": env})
    except Exception as e:
        print(f"Ray did not start ({type(e).__name__}: {str(e)[:200]}): spawned processes instead", flush=True)
        return {**run_mp(v), "launcher": f"mp (Ray did not start: {type(e).__name__})"}
    info, g, t0 = None, None, time.perf_counter()
    try:
        g = create_learner_group(spec_for(v, "cpu" if smoke else "cuda"), v["gpus"], actor_options=[{"num_cpus": 1}] * v["gpus"], timeout_s=300)
        info = g.info[0]
        print(f"{v['variant']}: {g} ({info['attention_kernel']}), set up in {time.perf_counter() - t0:.1f} s", flush=True)
        return record(v, name, info, measure(g.step, v, time.perf_counter() - t0), None)
    except Exception as e:
        traceback.print_exc()
        return record(v, name, info, None, f"{type(e).__name__}: {str(e)[:300]}")
    finally:
        if g is not None and g.actors: g.shutdown()
        ray.shutdown(); cluster.shutdown()


def _mp_rank(rank:int, v:dict, port:int, q) -> None:
    "One rank of the Ray-free launcher: a `LearnerWorker` in a spawned process; rank 0 reports the record."
    import warnings
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use `torch.distributed")
    smoke = v["model"] == "tiny"
    if not smoke:  # before CUDA starts: each rank sees its own GPU as device 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        os.environ["CUDA_VISIBLE_DEVICES"] = (visible.split(",") if visible else [str(i) for i in range(v["gpus"])])[rank]
    import torch
    from grpo_nb.learner import LearnerWorker, combine_metrics, shard_batch
    W, t0, v = v["gpus"], time.perf_counter(), {**v, "quiet": rank != 0}
    w = LearnerWorker(rank, W)
    try:
        info = w.setup(spec_for(v, "cpu" if smoke else "cuda"), "127.0.0.1", port)
        def step(batch):  # what LearnerGroup.step does, with the other ranks' sums gathered over torch.distributed
            mine = w.train_step(batch.select(shard_batch([len(s) for s in batch.input_ids], W)[rank]), 1)
            parts = [None] * W
            torch.distributed.all_gather_object(parts, mine)
            return combine_metrics(parts, None if smoke else PEAK)
        name = "cpu (smoke)" if smoke else f"{W} × {torch.cuda.get_device_name(0)}"
        res = measure(step, v, time.perf_counter() - t0)
        if rank == 0: q.put(record(v, name, info, res, None))
    except Exception as e:
        traceback.print_exc()
        if rank == 0: q.put(record(v, "?", None, None, f"{type(e).__name__}: {str(e)[:300]}"))
    finally:
        try: w.close()
        except Exception: pass


def run_mp(v:dict) -> dict:
    "Two GPUs without Ray: the same `LearnerWorker`s in two spawned processes (when Ray is not installed)."
    import torch.multiprocessing as mp
    from grpo_nb.actors import free_port
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_mp_rank, args=(r, v, port, q)) for r in range(v["gpus"])]
    for p in ps: p.start()
    rec = None
    while rec is None and any(p.is_alive() for p in ps):  # read before joining (a process with queued data does not exit)
        try: rec = q.get(timeout=1)
        except Exception: pass
    if rec is None:
        try: rec = q.get(timeout=5)
        except Exception: rec = record(v, "?", None, None, f"ranks exited with {[p.exitcode for p in ps]}")
    for p in ps: p.join(timeout=60)
    return rec


def run_variant(v:dict) -> dict:
    import warnings
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use `torch.distributed")  # DeepSpeed's calls, not ours
    if v["gpus"] == 1: return run_local(v)
    if v["launcher"] == "ray": return run_ray(v)
    return run_mp(v)


# ---- the plan and the driver -----------------------------------------------------------------------------

# ZeRO-3 variants run with `learner.zero3_buckets` "deepspeed" (DeepSpeed's defaults) unless they say "large" (the learner's
# default since these measurements; grpo_nb.memory.ZERO3_BUCKETS). The first "large" records (2026-11-25) were measured through
# ds_overrides with the same settings plus reduce_bucket_size 5e8 and contiguous_gradients, which are DeepSpeed's defaults.


def variants(part:str, smoke:bool, models:list, gpu_bytes:int, launcher:str, smoke_compile:bool, pack:int=0, skip_check:bool=False,
             micro_batches:int=4, steps:int=3, head:str="auto", warmup:int=0) -> list:
    """The measurements of a part, most important first (`pack` > 0: rows of that many tokens instead of the planner's choice;
    `micro_batches`: packs a learner trains each step, so a step holds `micro_batches` x `pack` tokens per GPU; `head`: the
    log-prob head, `learner.logprob_kernel`)."""
    out = []
    if part in ("1gpu", "all"):
        if smoke:
            out += [dict(model="tiny", gpus=1, zero=1, ckpt=False, compile=c) for c in ([False, True] if smoke_compile else [False])]
        else:  # the target (1.5B) first, eager then compiled; then the 0.5B shape; a checkpointed run checks the planner there
            big, small = models[-1], models[0]
            out += [dict(model=big, gpus=1, zero=1, ckpt=False, compile=False), dict(model=big, gpus=1, zero=1, ckpt=False, compile=False, kernels="liger"),
                    dict(model=big, gpus=1, zero=1, ckpt=False, compile=True)]   # compiled + Liger: dynamo fails on Liger's layers (2026-11-25)
            if small != big:
                out += [dict(model=small, gpus=1, zero=1, ckpt=False, compile=False), dict(model=small, gpus=1, zero=1, ckpt=False, compile=True)]
            out += [dict(model=big, gpus=1, zero=1, ckpt=True, compile=False)]
    if part in ("2gpu", "all"):
        for name in (["tiny"] if smoke else list(reversed(models))):
            out.append(dict(model=name, gpus=2, zero=3, ckpt=False, compile=False))
            if not smoke:
                out.append(dict(model=name, gpus=2, zero=3, ckpt=False, compile=False, kernels="liger"))
                out.append(dict(model=name, gpus=2, zero=3, ckpt=False, compile=False, kernels="liger", buckets="large"))
    if part == "4gpu":   # ZeRO-3 over four GPUs (7B and up): the model's own kernels, then Liger's
        for name in (["tiny"] if smoke else list(reversed(models))):
            out += [dict(model=name, gpus=4, zero=3, ckpt=False, compile=False)] + \
                   ([] if smoke else [dict(model=name, gpus=4, zero=3, ckpt=False, compile=False, kernels="liger")])
    if not smoke and importlib.util.find_spec("liger_kernel") is None:   # say so once, instead of failing each Liger variant after its start-up
        gone = [v for v in out if v.get("kernels") == "liger"]
        if gone: print(f"liger-kernel is not installed: {len(gone)} Liger variant(s) left out (pip install liger-kernel)", flush=True)
        out = [v for v in out if v.get("kernels") != "liger"]
    for v in out:
        v.update(chunk=256 if smoke else 2048, launcher=launcher if v["gpus"] > 1 else "local", profile=v["gpus"] == 1 or launcher == "mp", head=head)
        if smoke: v["pack"] = 256
        elif pack: given_pack(v, pack, gpu_bytes)
        else: fit_variant(v, gpu_bytes)
        v["skip_check"] = skip_check
        v.update(variant=f"{v['model']} {v['gpus']}gpu zero{v['zero']}" + (" compiled" if v["compile"] else "") + (" ckpt" if v["ckpt"] else "")
                         + (f" {v['kernels']}" if v.get("kernels", "torch") != "torch" else "") + (" large-buckets" if v.get("buckets") == "large" else "")
                         + (f" {micro_batches}mb" if micro_batches != 4 else "")   # another step shape: its own record, beside the 4-pack one
                         + (f" {head}-head" if head != "auto" else "")   # a head asked for by name: its own record beside the default's
                         + (f" warmup{warmup}" if warmup else ""),   # more warm-up steps than the default: its own record too
                 warmup=warmup or (2 if v["compile"] else 1), steps=1 if smoke else steps, micro_batches=micro_batches,
                 prompt=16 if smoke else 256, lo=8 if smoke else 256, hi=64 if smoke else 1792)
        # the default 4 packs keep their token count (and so their records); another count leaves one longest sequence of room
        # per GPU, so that first-fit packing lands on that many micro-batches rather than one more
        v["tokens"] = v["gpus"] * (4 * v["pack"] if micro_batches == 4 else micro_batches * v["pack"] - (v["prompt"] + v["hi"]))
    return out


def merge(path:Path, new:list) -> dict:
    "The results file with `new` replacing records of the same variant on the same GPUs (records of other variants and GPUs are kept)."
    old = json.loads(path.read_text()).get("records", []) if path.exists() else []
    key = lambda r: (r["model"], r["gpus"], r["zero"], r.get("variant"), r.get("device"), r.get("launcher"))   # one record per GPU kind and launcher
    keep = [r for r in old if key(r) not in {key(n) for n in new}]
    return {"formula": FORMULA, "peak_flops": PEAK, "records": keep + new}


def run_isolated(v:dict, limit_s:float) -> dict:
    "Run one variant in a new process group; kill the whole group (Ray included) when it exceeds `limit_s`."
    env = dict(os.environ)
    if v["gpus"] == 1 and v["model"] != "tiny": env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    p = subprocess.Popen([sys.executable, __file__, "--one", json.dumps(v)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    rec, lines, t0 = None, [], time.time()
    try:
        out, _ = p.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rec = record(v, "?", None, None, f"timeout: killed after {limit_s:.0f} s")
    for l in out.splitlines():
        if l.startswith("RECORD "): rec = rec or json.loads(l[7:])
        else: lines.append(l)
    try: os.killpg(p.pid, signal.SIGKILL)  # leftovers (Ray's raylet, spawned ranks) of a variant that exited
    except ProcessLookupError: pass
    sys.stdout.write("\n".join(lines[-40:] if rec and not rec.get("error") else lines[-150:]) + "\n")
    rec = rec or record(v, "?", None, None, f"exit {p.returncode}: " + " | ".join(lines[-3:])[-300:])
    rec["wall_s"] = round(time.time() - t0, 1)
    return rec


def variant_of(r:dict) -> dict:
    "The planner's inputs of a record: its model, GPUs, ZeRO stage, checkpointing, kernels (those in use), buckets and log-prob chunk."
    return {"model": r["model"], "gpus": r["gpus"], "zero": r["zero"], "ckpt": bool(r.get("grad_ckpt")), "compile": bool(r.get("compile")),
            "kernels": r.get("kernels") or "torch", "buckets": r.get("zero3_buckets") or "deepspeed",
            "head": r.get("logprob_kernel") or "torch",   # records made before the fused head ran the loop
            "chunk": r.get("logprob_chunk") or (256 if r["model"] == "tiny" else 2048)}   # the chunk every variant has run with


def repredict(path:Path) -> list:
    """Rewrite the planner's figures of every measured record in `path` with today's planner, for the record's own configuration
    (CPU only; the measurements are not touched). The first prediction a record carried stays as `predicted_bytes_recorded`.
    Returns (variant, device, before, after) for each record rewritten."""
    data = json.loads(path.read_text())
    changed = []
    for r in data.get("records", []):
        if not r.get("longest_row"): continue            # failed or skipped: nothing was measured
        v = variant_of(r)
        new, at_pack = predicted(v, r["longest_row"]), predicted(v, r["pack_length"])
        if new is None: continue                         # a shape the planner does not know: keep what it said then
        r.setdefault("predicted_bytes_recorded", r.get("predicted_bytes"))
        changed.append((r.get("variant"), r.get("device"), r.get("predicted_bytes"), new))
        r.update(predicted_bytes=new, predicted_bytes_at_pack=at_pack)
        if r.get("measured_bytes"): r["predicted_over_measured"] = new / r["measured_bytes"]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1)); tmp.replace(path)   # all or nothing: an interrupted rewrite leaves the file as it was
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["1gpu", "2gpu", "4gpu", "all"], default="all", help="which measurements (default: all = 1gpu and 2gpu; 4gpu: ZeRO-3 over four GPUs)")
    p.add_argument("--models", default="Qwen2.5-0.5B,Qwen2.5-1.5B", help="comma-separated shapes from grpo_nb.memory.ARCHS, smallest first")
    p.add_argument("--out", default=None, help="results JSON (default bench/results/learner_mfu.json; smoke: /tmp/learner_mfu_smoke.json)")
    p.add_argument("--budget-s", type=float, default=420, help="wall-clock budget of each part; variants that no longer fit are skipped")
    p.add_argument("--variant-limit-s", type=float, default=240, help="kill a variant after this many seconds")
    p.add_argument("--launcher", choices=["auto", "ray", "mp"], default="auto", help="2-GPU part: Ray actors (the learner group) or spawned processes; auto: Ray when installed")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU (fp32, gloo): checks the script here")
    p.add_argument("--only", default="", help="comma-separated substrings: run only the variants whose name contains one; a trailing $ means 'ends with' (e.g. 'liger,zero1$')")
    p.add_argument("--pack", type=int, default=0, help="tokens per packed micro-batch (default 0: the longest the planner fits in 80%% of the GPU)")
    p.add_argument("--micro-batches", type=int, default=4, help="a step of this many packs' worth of tokens per GPU (default 4, which first-fit "
                   "packing spreads over 4 or 5 packs; any other count leaves room to land on exactly that many); fewer, longer micro-batches pay "
                   "ZeRO-3's gathers fewer times: e.g. --pack 16384 --micro-batches 1")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant, after the warm-up (default 3)")
    p.add_argument("--warmup", type=int, default=0, help="untimed steps before them (default 0: 2 for a compiled variant, else 1); another "
                   "count names its records '... warmupN', beside the default's (under ZeRO-3 the first timed step after one untimed "
                   "step has been the slowest of every one-micro-batch record)")
    from grpo_nb.config import LearnerConfig   # (no torch: the config module is light)
    p.add_argument("--logprob-kernel", choices=typing.get_args(typing.get_type_hints(LearnerConfig)["logprob_kernel"]), default="auto",
                   help="the log-prob head (learner.logprob_kernel; default auto, as the trainer: the fused Triton kernels on a GPU); "
                   "torch or triton name their variants '... torch-head', '... triton-head'")
    p.add_argument("--skip-check", action="store_true", help="no log-prob check of fused kernels before timing (its models were seen to keep GPU memory on an 80 GB GPU)")
    p.add_argument("--memory-peak", action="store_true", help="one more step per one-GPU variant with the allocator's history on: what is live at the peak, "
                   "grouped by where it was allocated (`memory_at_peak` in the record)")
    p.add_argument("--smoke-compile", action="store_true", help="smoke: also a torch.compile variant (slow on a small CPU)")
    p.add_argument("--repredict", action="store_true", help="CPU only: rewrite every record's planner prediction (predicted_bytes, predicted_bytes_at_pack, "
                   "predicted_over_measured) with today's planner for its own configuration; the measurements are kept, the first prediction as predicted_bytes_recorded")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one variant (JSON) and print its record
    a = p.parse_args(argv)
    for k, val in GPU_ENV.items(): os.environ.setdefault(k, val)
    if a.smoke: os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if a.one:
        print("RECORD " + json.dumps(run_variant(json.loads(a.one))), flush=True); return 0
    t0 = time.time()
    out = Path(a.out or ("/tmp/learner_mfu_smoke.json" if a.smoke else ROOT / "bench/results/learner_mfu.json"))
    if a.repredict:
        if not out.exists(): print(f"no results file at {out}: nothing to recompute (measure first, or pass --out)", file=sys.stderr); return 2
        try: changed = repredict(out)
        except (ValueError, KeyError, TypeError) as e:   # not a learner_mfu results file
            print(f"{out} is not a learner_mfu.json results file ({type(e).__name__}: {e}); nothing was rewritten", file=sys.stderr); return 2
        for variant, device, before, after in changed:
            g = lambda b: f"{b / 2**30:.2f} GiB" if b else "-"
            print(f"{variant:<46} {device:<28} predicted {g(before):>10} -> {g(after):>10}")
        print(f"wrote {out}"); return 0
    launcher = a.launcher
    if launcher == "auto":
        try: import ray  # noqa: F401
        except ImportError: launcher = "mp"
        else: launcher = "ray"
    # the GPUs, asked in a child process: this one holds no CUDA context while the variants run
    facts = subprocess.run([sys.executable, "-c", "import torch; c = torch.cuda.is_available(); "
                            "print(torch.cuda.device_count() if c else 0, torch.cuda.get_device_properties(0).total_memory if c else 0)"],
                           capture_output=True, text=True)
    n_gpus, gpu_bytes = (int(x) for x in facts.stdout.split()[-2:]) if facts.returncode == 0 else (0, 0)
    gpu_bytes = gpu_bytes or 80 * 2**30
    if not a.smoke and not n_gpus: print(f"no GPU visible: use --smoke on a CPU machine {facts.stderr[-300:]}", file=sys.stderr); return 2
    part = a.part
    if not a.smoke and part == "4gpu" and n_gpus < 4:
        print(f"the 4-GPU part needs 4 visible GPUs (found {n_gpus}): use --part 2gpu or 1gpu", file=sys.stderr); return 2
    if not a.smoke and part != "1gpu" and n_gpus < 2:
        if part == "2gpu": print(f"the 2-GPU part needs 2 visible GPUs (found {n_gpus}): use --part 1gpu", file=sys.stderr); return 2
        print("one GPU visible: the 2-GPU part is left out", flush=True); part = "1gpu"
    if a.micro_batches < 1: print(f"--micro-batches {a.micro_batches}: give at least 1", file=sys.stderr); return 2
    vs = variants(part, a.smoke, ["tiny"] if a.smoke else a.models.split(","), gpu_bytes, launcher, a.smoke_compile, a.pack, a.skip_check,
                  a.micro_batches, a.steps, a.logprob_kernel, a.warmup)
    if a.only: vs = [v for v in vs if any(v["variant"].endswith(x[:-1]) if x.endswith("$") else x in v["variant"] for x in a.only.split(","))]
    for v in vs: v["memory_peak"] = a.memory_peak and v["gpus"] == 1 and not a.smoke   # the allocator's history is a CUDA feature
    meta = {"versions": versions(), "command": " ".join(sys.argv)}
    records, starts = [], {}
    for v in vs:
        part = f"{v['gpus']}gpu"
        starts.setdefault(part, time.time())
        left = a.budget_s - (time.time() - starts[part])
        need = 120 if v["compile"] and not a.smoke else 45
        if left < need:
            print(f"== skip {v['variant']}: {left:.0f} s left of the {part} budget", flush=True)
            rec = record(v, "?", None, None, f"skipped: {left:.0f} s of the {a.budget_s:.0f} s budget left")
        else:
            print(f"== [{time.time() - t0:.0f} s] {v['variant']} (pack {v['pack']}, {v['tokens']} tokens/step, {v['launcher']})", flush=True)
            rec = run_isolated(v, min(a.variant_limit_s, left))
        rec.update(meta)
        records.append(rec)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(merge(out, records), indent=1))  # after every variant: a later crash loses nothing
    print(f"\n{'variant':<36} {'tok/s':>9} {'MFU':>6} {'measured GiB':>13} {'predicted GiB':>14}  attention")
    for r in records:
        g = lambda b: f"{b / 2**30:.1f}" if b else "-"
        print(f"{r['variant']:<36} {r['tokens_per_s'] or 0:>9,.0f} {r['mfu'] or 0:>6.3f} {g(r['measured_bytes']):>13} "
              f"{g(r['predicted_bytes']):>14}  {r.get('attention')}" + (f"  ERROR {r['error'][:100]}" if r.get("error") else ""))
    print(f"wrote {out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
