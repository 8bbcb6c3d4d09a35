#!/usr/bin/env python3
"""Does a learner give its memory back? The live tensor bytes of this process (every torch tensor the garbage
collector can see, each storage counted once) with a learner built in it (`create_learner_group(local=True)`, as
notebooks and benchmarks build one), after one step, and after `shutdown()`: ZeRO-1 and ZeRO-3, fp32 and bf16,
on CPU. What users run: the same calls a notebook makes, nothing patched.

    python bench/learner_release.py                      # this checkout; appends its records to bench/results/learner_release.json
    python bench/learner_release.py --code /tmp/old      # another checkout of grpo_nb (e.g. a git worktree of an older commit)

Records: code (the commit measured), zero, dtype, built_mib (with the learner built), stepped_mib (after one step),
left_mib (after shutdown), all relative to the process before the learner.
"""
import argparse, gc, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 4096, "tie_word_embeddings": True, "max_position_embeddings": 1024}


def live_bytes() -> int:
    "Bytes of every storage behind a live tensor of this process, each storage once."
    import torch
    gc.collect()
    seen = {}
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and not o.is_meta:
                s = o.untyped_storage(); seen[(s.device, s.data_ptr())] = s.nbytes()
        except Exception: pass   # a tensor subclass without a storage
    return sum(seen.values())


def batch(vocab:int):
    import torch
    from grpo_nb.learner import TrainBatch
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(4, vocab, (int(n),), generator=g).tolist() for n in torch.randint(40, 120, (16,), generator=g)]
    return TrainBatch(ids, [8] * len(ids), torch.randn(len(ids), generator=g).tolist())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", default=str(ROOT), help="checkout whose grpo_nb is measured (default: this one)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/learner_release.json"), help="results JSON (records of other commits are kept)")
    a = ap.parse_args()
    sys.path.insert(0, a.code)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from grpo_nb.config import LearnerConfig
    from grpo_nb.learner import LearnerSpec, create_learner_group
    commit = subprocess.run(["git", "-C", a.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    mib = lambda b: round(b / 2**20, 1)
    recs = []
    for zero in (1, 3):
        for dtype in ("float32", "bfloat16"):
            base = live_bytes()
            spec = LearnerSpec(model=dict(MODEL), device="cpu", dtype=dtype, norm_len=120,
                               learner=LearnerConfig(learning_rate=1e-4, zero_stage=zero, micro_batch_size=8, pack_length=512))
            g = create_learner_group(spec, 1, local=True)
            built = live_bytes() - base
            g.step(batch(MODEL["vocab_size"]))
            stepped = live_bytes() - base
            g.shutdown(); del g
            left = live_bytes() - base
            recs.append({"code": commit, "zero": zero, "dtype": dtype, "built_mib": mib(built), "stepped_mib": mib(stepped), "left_mib": mib(left),
                         "model": MODEL, "when": time.strftime("%Y-%m-%d %H:%M")})
            print(f"{commit}: ZeRO-{zero} {dtype}: {mib(built)} MiB built, {mib(stepped)} MiB after a step, {mib(left)} MiB left after shutdown", flush=True)
    out = Path(a.out)
    old = json.loads(out.read_text())["records"] if out.exists() else []
    out.write_text(json.dumps({"records": [r for r in old if r["code"] != commit] + recs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
