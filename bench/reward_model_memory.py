"""Peak GPU memory of a ZeRO-3 reward model (sequence classifier) vs the planner's prediction.

One GPU, DeepSpeed ZeRO-3, Qwen2.5-0.5B / 1.5B shapes as `Qwen2ForSequenceClassification` (random weights built
from the shape: no download), bf16, torch fused AdamW, gradient checkpointing on/off, micro-batches of 2-8 pairs
x 512-1024 tokens. Each configuration runs in its own process (3 optimizer steps; peak = max over steps of
torch.cuda.max_memory_allocated) and is compared with `grpo_nb.reward_model.classifier_memory`.

    python bench/reward_model_memory.py --out bench/results/reward_model_memory.json        # GPU, about 3-5 min
    python bench/reward_model_memory.py --smoke --out /tmp/rm_smoke.json                     # CPU, tiny shape
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
try: import fastcore.docments  # grpo_nb.config needs it only for field_docs; the GPU machine may not carry fastcore
except ImportError:
    import types
    _fc = types.ModuleType("fastcore"); _fd = types.ModuleType("fastcore.docments"); _fd.docments = lambda *a, **k: {}
    _fc.docments = _fd; sys.modules.update({"fastcore": _fc, "fastcore.docments": _fd})

CONFIGS = [  # (model, pairs, seq_len, grad_ckpt)
    ("Qwen2.5-0.5B", 4, 1024, True),
    ("Qwen2.5-0.5B", 4, 1024, False),
    ("Qwen2.5-0.5B", 8, 512, True),
    ("Qwen2.5-1.5B", 2, 1024, True),
    ("Qwen2.5-1.5B", 8, 1024, True),
    ("Qwen2.5-1.5B", 2, 512, False),
]
SMOKE = [("tiny", 2, 64, True), ("tiny", 2, 64, False)]

def tiny_shape():
    from grpo_nb.memory import ModelShape
    return ModelShape("tiny", "qwen2", 128, 384, 2, 4, 2, 32, 104, True, True)

def one(model:str, pairs:int, seq_len:int, grad_ckpt:bool, steps:int, port:int) -> dict:
    "Measure one configuration in this process."
    import logging, warnings, torch
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed
    from transformers import Qwen2Config, Qwen2ForSequenceClassification
    from grpo_nb.memory import get_shape
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    cuda = torch.cuda.is_available()
    if not cuda: deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)
    s = tiny_shape() if model == "tiny" else get_shape(model)
    cfg = Qwen2Config(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                      num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim, tie_word_embeddings=True,
                      num_labels=1, pad_token_id=0, max_position_embeddings=max(seq_len, 2048))
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        m = Qwen2ForSequenceClassification._from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    m.train()
    if grad_ckpt: m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = {"lr": 1e-5, "torch_adam": True, **({"fused": True} if cuda else {})}
    ds = {"train_micro_batch_size_per_gpu": pairs, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3},
          "gradient_clipping": 1.0, "steps_per_print": 10**9, "bf16": {"enabled": cuda}, "optimizer": {"type": "AdamW", "params": opt}}
    engine, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=ds)
    dev = engine.device
    peaks, times = [], []
    for step in range(steps):
        ids = torch.randint(1, s.vocab, (2 * pairs, seq_len), device=dev)               # B=2P, T (no padding: T is the padded length)
        if cuda: torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        sc = engine(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, 0]     # B
        loss = -torch.nn.functional.logsigmoid(sc[0::2].float() - sc[1::2].float()).mean()   # Bradley-Terry (grpo_nb.reward_model.bt_loss)
        engine.backward(loss); engine.step()
        if cuda: torch.cuda.synchronize()
        times.append(time.time() - t0)
        peaks.append(torch.cuda.max_memory_allocated() if cuda else 0)
    return {"measured_bytes": max(peaks) if cuda else None, "step_peaks": peaks, "step_seconds": times,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "deepspeed": deepspeed.__version__,
            "reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None}

def predicted(model, pairs, seq_len, grad_ckpt, cuda:bool) -> dict:
    from grpo_nb.reward_model import classifier_memory
    s = tiny_shape() if model == "tiny" else model
    m = classifier_memory(s, gpus=1, micro_batch_pairs=pairs, seq_len=seq_len, grad_ckpt=grad_ckpt, adam="fused" if cuda else "foreach")
    return {"predicted_bytes": m["peak_bytes"], "predicted_phase": m["peak_phase"], "predicted_total_bytes": m["total_bytes"],
            "predicted_terms": m["terms"], "params": m["params"]}

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "bench/results/reward_model_memory.json"))
    p.add_argument("--smoke", action="store_true", help="CPU, a tiny shape: proves the script runs")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: JSON of one configuration, run in a child process
    a = p.parse_args()
    if a.one:
        c = json.loads(a.one)
        print("RESULT " + json.dumps(one(c["model"], c["pairs"], c["seq_len"], c["grad_ckpt"], a.steps, c["port"])), flush=True)
        return
    import torch
    cuda = torch.cuda.is_available()
    records, t_all = [], time.time()
    for i, (model, pairs, T, ck) in enumerate(SMOKE if a.smoke else CONFIGS):
        rec = {"name": f"{model} {pairs}x2x{T} ckpt {'on' if ck else 'off'}", "model": model, "pairs": pairs, "sequences": 2 * pairs,
               "seq_len": T, "grad_ckpt": ck, "gpus": 1, "zero": 3, **predicted(model, pairs, T, ck, cuda)}
        arg = json.dumps({"model": model, "pairs": pairs, "seq_len": T, "grad_ckpt": ck, "port": 29700 + i})
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "--one", arg, "--steps", str(a.steps)], capture_output=True, text=True, timeout=300)
        line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
        if line:
            rec.update(json.loads(line[7:]), status="ok")
            if rec["measured_bytes"]: rec["error"] = rec["predicted_bytes"] / rec["measured_bytes"] - 1
        else:
            err = (r.stderr or r.stdout).strip().splitlines()
            rec.update(status="oom" if "out of memory" in (r.stderr or "").lower() else "failed", detail="\n".join(err[-8:]))
        rec["wall_s"] = round(time.time() - t0, 1)
        records.append(rec)
        meas = rec.get("measured_bytes")
        print(f"{rec['name']:<36} predicted {rec['predicted_bytes']/2**30:6.2f} GiB  measured "
              f"{(meas or 0)/2**30:6.2f} GiB  {rec.get('error', 0)*100:+5.1f}%  {rec['status']}  {rec['wall_s']} s", flush=True)
    out = {"meta": {"smoke": a.smoke, "steps": a.steps, "seconds": round(time.time() - t_all, 1),
                    "command": "python bench/reward_model_memory.py" + (" --smoke" if a.smoke else "")}, "records": records}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out} ({out['meta']['seconds']} s)")

if __name__ == "__main__": main()
