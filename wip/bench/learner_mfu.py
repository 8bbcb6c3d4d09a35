#!/usr/bin/env python3
"""Learner throughput and MFU on H100/H200: the learner's own step (packed micro-batches, chunked log-probs,
the GRPO loss, DeepSpeed) on random-init Qwen2.5-0.5B / 1.5B shapes, one GPU (ZeRO-0/1) and two (ZeRO-3).

MFU = model FLOPs / step time / (989 TFLOP/s dense bf16 × GPUs), with model FLOPs per optimizer step
    6·N_body·T + 6·V·H·T_scored + 6·layers·H·Σ s²
(N_body: parameters except the embedding and the output projection; T: tokens trained on; T_scored:
completion tokens, the only ones whose log-prob is computed; s: each sequence's length — causal attention).
For a tied model that scores every token this is the usual (6·N + 6·layers·H·s)·T. Recomputation
(gradient checkpointing, the log-prob backward's logits) is not counted.

Beside each measurement: the memory planner's prediction (grpo_nb.memory.learner_memory) of the peak that
torch.cuda.max_memory_allocated reports.

    GPU (one or two H100/H200; PYTHONPATH holds the repo and the carried DeepSpeed/Ray wheels):
        python bench/learner_mfu.py                # both parts (the 2-GPU part needs 2 visible GPUs)
        python bench/learner_mfu.py --part 1gpu    # one GPU only
        python bench/learner_mfu.py --part 2gpu    # ZeRO-3 on two GPUs only
    CPU (this machine): python bench/learner_mfu.py --smoke   (tiny model, fp32, gloo; writes /tmp/learner_mfu_smoke.json)

Each 1-GPU variant runs in its own subprocess (a crash or OOM costs only that record); the 2-GPU part runs
the learner group itself: two Ray actors, NCCL, ZeRO-3. Results are merged into bench/results/learner_mfu.json.
"""
import argparse, gc, json, os, subprocess, sys, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEAK = 989e12  # H100/H200 SXM dense bf16 FLOP/s
FORMULA = "MFU = (6·N_body·T + 6·V·H·T_scored + 6·layers·H·Σs²) / step_s / (989e12 · gpus)"


def hf_config(name:str, smoke:bool) -> dict:
    "A Qwen2 config dict with the shape of a published model (random init)."
    if smoke:
        return {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "vocab_size": 512, "tie_word_embeddings": True, "max_position_embeddings": 4096}
    from grpo_nb.memory import ARCHS
    s = ARCHS[name]
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
        ids.append(torch.randint(4, vocab, (n,), generator=g).tolist()); plen.append(prompt); total += n
    adv = torch.randn(len(ids), generator=g).tolist()
    roll = [(-torch.rand(len(s) - p, generator=g)).tolist() for s, p in zip(ids, plen)]
    return TrainBatch(ids, plen, adv, rollout_logprobs=roll)


def predicted(name:str, gpus:int, zero:int, pack:int, ckpt:bool, attn:str, chunk:int) -> int|None:
    try:
        from grpo_nb.memory import learner_memory
        return int(learner_memory(name, learners=gpus, zero=zero, micro_batch=1, seq_len=pack, grad_ckpt=ckpt,
                                  attn="flash_attention_2" if attn == "grpo_varlen" else "sdpa", logits="chunked",
                                  logprob_chunk=chunk).peak_bytes)
    except Exception as e:
        print(f"planner: {type(e).__name__}: {e}", flush=True); return None


def pick_pack(name:str, gpus:int, zero:int, ckpt:bool, chunk:int, gpu_bytes:int, smoke:bool) -> int:
    "The longest pack length whose predicted peak leaves 15% of the GPU free."
    if smoke: return 256
    for pack in (16384, 12288, 8192, 4096):
        p = predicted(name, gpus, zero, pack, ckpt, "grpo_varlen", chunk)
        if p is not None and p < 0.85 * gpu_bytes: return pack
    return 4096


def spec_for(v:dict, device:str):
    from grpo_nb.config import LearnerConfig
    from grpo_nb.learner import LearnerSpec
    L = LearnerConfig(learning_rate=1e-6, zero_stage=v["zero"], micro_batch_size=100_000, gradient_accumulation_steps=1,
                      pack_length=v["pack"], logprob_chunk=v["chunk"], max_grad_norm=1.0)
    return LearnerSpec(model=hf_config(v["model"], v["smoke"]), learner=L, device=device, gradient_checkpointing=v["ckpt"],
                       compile=v["compile"], temperature=1.0, norm_len=v["hi"], peak_flops=None if device == "cpu" else PEAK)


def measure(group, v:dict) -> dict:
    "Warm-up steps, then timed steps; tokens/s, MFU and peak memory from the learner's own metrics."
    vocab = hf_config(v["model"], v["smoke"])["vocab_size"]
    ms = []
    for s in range(v["warmup"] + v["steps"]):
        t = time.perf_counter()
        m = group.step(make_batch(s, v["tokens"], vocab, v["prompt"], v["lo"], v["hi"]))
        print(f"  step {s}: {time.perf_counter() - t:.2f} s, {m['micro_batches']} micro-batches, loss {m['loss']:.4f}"
              + (f", MFU {m['mfu']:.3f}" if "mfu" in m else ""), flush=True)
        if s >= v["warmup"]: ms.append(m)
    T, F = sum(m["time_s"] for m in ms), sum(m["flops"] for m in ms)
    return {"tokens_per_s": sum(m["train_tokens"] for m in ms) / T, "mfu": F / T / (PEAK * v["gpus"]),
            "measured_bytes": max(m["peak_bytes"] for m in ms), "step_s": T / len(ms),
            "tokens_per_step": ms[0]["train_tokens"], "micro_batches": ms[0]["micro_batches"], "grad_norm": ms[-1]["grad_norm"]}


def record(v:dict, device_name:str, info:dict|None, res:dict|None, err:str|None) -> dict:
    r = {"model": v["model"], "gpus": v["gpus"], "zero": v["zero"], "tokens_per_s": None, "mfu": None, "measured_bytes": None,
         "predicted_bytes": v.get("predicted"), "device": device_name, "variant": v["variant"], "pack_length": v["pack"],
         "grad_ckpt": v["ckpt"], "compile": v["compile"], "attention": (info or {}).get("attention")}
    if res: r.update(res)
    if err: r["error"] = err
    return r


def run_one(v:dict) -> dict:
    "One 1-GPU variant in this process."
    import torch
    from grpo_nb.learner import create_learner_group
    device = "cpu" if v["smoke"] else "cuda"
    name = "cpu (smoke)" if v["smoke"] else torch.cuda.get_device_name(0)
    info = None
    try:
        g = create_learner_group(spec_for(v, device), 1, local=True)
        info = g.info[0]
        print(f"{v['variant']}: {g}", flush=True)
        res = measure(g, v)
        g.shutdown()
        return record(v, name, info, res, None)
    except Exception as e:
        traceback.print_exc()
        return record(v, name, info, None, f"{type(e).__name__}: {str(e)[:300]}")


def run_two(variants:list, smoke:bool) -> list:
    "The 2-GPU part: the learner group itself (two Ray actors, NCCL, ZeRO-3)."
    import ray, torch
    from grpo_nb.learner import create_learner_group
    out = []
    env = {k: os.environ[k] for k in ("PYTHONPATH", "TORCH_CUDA_ARCH_LIST", "PYTHONUNBUFFERED") if k in os.environ}
    ray.init(address="local", num_cpus=8 if not smoke else 4, num_gpus=0 if smoke else 2, include_dashboard=False, log_to_driver=True,
             object_store_memory=(2 if not smoke else 0.2) * 2**30, runtime_env={"env_vars": env})
    try:
        for v in variants:
            name, info = ("cpu (smoke)" if smoke else "2 × " + torch.cuda.get_device_name(0)), None
            g = None
            try:
                g = create_learner_group(spec_for(v, "cpu" if smoke else "cuda"), 2, actor_options=[{"num_cpus": 1}] * 2, timeout_s=600)
                info = g.info[0]
                print(f"{v['variant']}: {g}", flush=True)
                out.append(record(v, name, info, measure(g, v), None))
            except Exception as e:
                traceback.print_exc()
                out.append(record(v, name, info, None, f"{type(e).__name__}: {str(e)[:300]}"))
            finally:
                if g is not None and g.actors: g.shutdown(kill=True)
    finally:
        ray.shutdown()
    return out


def variants(part:str, smoke:bool, models:list, quick:bool) -> list:
    import torch
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * 2**30
    out = []
    for name in models:
        # 1 GPU: ZeRO-1 (bf16 + fp32 master weights and gradients), no checkpointing, eager then compiled layers
        if part in ("1gpu", "all"):
            for comp in ([False] if quick else [False, True]):
                pack = pick_pack(name, 1, 1, False, 2048, gpu_bytes, smoke)
                out.append(dict(model=name, gpus=1, zero=1, ckpt=False, compile=comp, pack=pack, chunk=256 if smoke else 2048))
        if part in ("2gpu", "all"):
            pack = pick_pack(name, 2, 3, False, 2048, gpu_bytes, smoke)
            out.append(dict(model=name, gpus=2, zero=3, ckpt=False, compile=False, pack=pack, chunk=256 if smoke else 2048))
    for v in out:
        v.update(smoke=smoke, variant=f"{v['model']} {v['gpus']}gpu zero{v['zero']}" + (" compiled" if v["compile"] else "")
                 + (" ckpt" if v["ckpt"] else ""), warmup=2 if v["compile"] else 1, steps=1 if smoke else 3,
                 tokens=4 * v["pack"] * v["gpus"], prompt=16 if smoke else 256, lo=8 if smoke else 256, hi=64 if smoke else 1792)
        v["predicted"] = None if smoke else predicted(v["model"], v["gpus"], v["zero"], v["pack"], v["ckpt"], "grpo_varlen", v["chunk"])
    return out


def merge(path:Path, new:list) -> dict:
    old = json.loads(path.read_text()).get("records", []) if path.exists() else []
    key = lambda r: (r["model"], r["gpus"], r["zero"], r.get("variant"))
    keep = [r for r in old if key(r) not in {key(n) for n in new}]
    return {"formula": FORMULA, "peak_flops": PEAK, "records": keep + new}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["1gpu", "2gpu", "all"], default="all", help="which measurements (default: all)")
    p.add_argument("--models", default="Qwen2.5-0.5B,Qwen2.5-1.5B", help="comma-separated shapes from grpo_nb.memory.ARCHS")
    p.add_argument("--quick", action="store_true", help="1-GPU part: eager only (no torch.compile variant)")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU (fp32, gloo): checks the script here")
    p.add_argument("--out", default=None, help="results JSON (default bench/results/learner_mfu.json; smoke: /tmp/learner_mfu_smoke.json)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one 1-GPU variant (JSON) and print its record
    a = p.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if a.one:
        print("RECORD " + json.dumps(run_one(json.loads(a.one))), flush=True); return 0
    t0 = time.time()
    out = Path(a.out or ("/tmp/learner_mfu_smoke.json" if a.smoke else ROOT / "bench/results/learner_mfu.json"))
    vs = variants(a.part, a.smoke, ["tiny"] if a.smoke else a.models.split(","), a.quick)
    records = []
    for v in [v for v in vs if v["gpus"] == 1]:
        print(f"== {v['variant']} (pack {v['pack']}, {v['tokens']} tokens/step)", flush=True)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0])
        r = subprocess.run([sys.executable, __file__, "--one", json.dumps(v)], env=env, capture_output=True, text=True, timeout=400)
        sys.stdout.write(r.stdout[-4000:] if r.returncode == 0 else (r.stdout + r.stderr)[-6000:])
        rec = next((json.loads(l[7:]) for l in r.stdout.splitlines() if l.startswith("RECORD ")), None)
        records.append(rec or record(v, "?", None, None, f"subprocess exit {r.returncode}: {r.stderr[-300:]}"))
    two = [v for v in vs if v["gpus"] == 2]
    if two:
        print(f"== 2-GPU part: {[v['variant'] for v in two]}", flush=True)
        records += run_two(two, a.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merge(out, records), indent=1))
    print(f"\n{'variant':<34} {'tok/s':>9} {'MFU':>6} {'measured GiB':>13} {'predicted GiB':>14}  attention")
    for r in records:
        g = lambda b: f"{b / 2**30:.1f}" if b else "-"
        print(f"{r['variant']:<34} {r['tokens_per_s'] or 0:>9,.0f} {r['mfu'] or 0:>6.3f} {g(r['measured_bytes']):>13} "
              f"{g(r['predicted_bytes']):>14}  {r.get('attention')}" + (f"  ERROR {r['error'][:80]}" if r.get("error") else ""))
    print(f"wrote {out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
