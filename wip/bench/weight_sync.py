"""Weight-sync benchmark: a ZeRO-3 learner on GPU 0 pushes its weights into a transformers engine on GPU 1.

A Qwen2.5-1.5B-shaped policy (random init, bf16, 3.09 GB, 338 tensors) lives in a one-rank DeepSpeed
ZeRO-3 world on GPU 0 (a Ray actor); a `grpo_nb.rollout.HFEngine` with the same architecture lives on
GPU 1 (another Ray actor). They form the weight-sync group (NCCL) and this script times:

  floor  a raw NCCL broadcast of one buffer of the same number of bytes, through the same group
  gather ZeRO-3 gathers + packing into bucket buffers (learner, synchronised per phase)
  send   the bucket broadcasts (learner, synchronised per phase)
  load   copying received tensors into the engine's parameters (engine, synchronised per phase)
  total  the real, pipelined sync: first gather on the learner -> last tensor copied on the engine

for a few bucket sizes, then verifies the engine bit for bit (checksums) and by log-probs.
Records go to bench/results/weight_sync.json (model, bytes, floor_s, gather_s, send_s, load_s, total_s, device).

GPU (2 GPUs, Ray + DeepSpeed wheels on PYTHONPATH):   python bench/weight_sync.py
CPU smoke test (tiny model, gloo):                   python bench/weight_sync.py --smoke
"""
import argparse, json, os, socket, statistics, sys, tempfile, time
from pathlib import Path

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "NCCL_CUMEM_ENABLE": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
            "TORCH_CUDA_ARCH_LIST": "9.0", "DS_BUILD_OPS": "0", "TOKENIZERS_PARALLELISM": "false"}
os.environ.update(SAFE_ENV)   # before torch/NCCL/Ray start: every process inherits it
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import torch  # noqa: E402
from grpo_nb.rollout import HFEngine, engine_env  # noqa: E402
from grpo_nb.weight_sync import (WeightSyncSource, connect_weight_sync, sync_weights, verify_weight_sync,  # noqa: E402
                                 join_group)

QWEN25_1P5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6,
                   rms_norm_eps=1e-6, eos_token_id=151643, bos_token_id=151643)
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=1, bos_token_id=1)


def qwen2_config(shape:dict):
    from transformers import Qwen2Config
    return Qwen2Config(**shape)


class Learner(WeightSyncSource):
    "One-rank DeepSpeed ZeRO-3 learner holding a random-init policy."
    def __init__(self, shape:dict, device:str, port:int):
        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        self.device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        if device == "cuda": torch.cuda.set_device(self.device)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
        import deepspeed
        if device == "cpu": sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None   # skip a CPU op JIT build
        from transformers import AutoModelForCausalLM
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        torch.manual_seed(0)
        with torch.device(self.device):
            m = AutoModelForCausalLM.from_config(qwen2_config(shape), dtype=dtype, attn_implementation="sdpa")
        ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3}, "bf16": {"enabled": device == "cuda"},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}}}
        self.model, *_ = deepspeed.initialize(model=m, config=ds, model_parameters=m.parameters())
        self.n_params = sum(p.ds_numel for p in self.model.module.parameters())

    def describe(self) -> dict:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return {"params": self.n_params, "device_name": name, "gpus": torch.cuda.device_count() if self.device.type == "cuda" else 0,
                "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def floor(self, nbytes:int, iters:int) -> list[float]:
        "Sender side of a raw broadcast of `nbytes` through the sync group; one time per iteration."
        return _raw_broadcast(self._ws_group, nbytes, iters)


class Engine(HFEngine):
    "The transformers engine, plus the receiving side of the raw broadcast."
    def floor(self, nbytes:int, iters:int) -> list[float]:
        return _raw_broadcast(self.sync_group, nbytes, iters)


def _raw_broadcast(group, nbytes:int, iters:int) -> list[float]:
    "Time `iters` broadcasts of one `nbytes` buffer (after a 1-element barrier broadcast each)."
    dev = group.device
    buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    tick = torch.zeros(1, device=dev)
    if group.rank == 0: buf.fill_(7)
    group.broadcast(buf).wait(); _sync(dev)   # warm-up (communicator, buffers)
    times = []
    for _ in range(iters):
        group.broadcast(tick).wait(); _sync(dev)
        t0 = time.perf_counter()
        group.broadcast(buf).wait(); _sync(dev)
        times.append(time.perf_counter() - t0)
    if group.rank != 0: assert int(buf[-1]) == 7
    del buf
    return times


def _sync(dev):
    if dev.type == "cuda": torch.cuda.synchronize(dev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU with gloo (checks the script, not the hardware)")
    ap.add_argument("--reps", type=int, default=5, help="timed syncs per bucket size (median reported)")
    ap.add_argument("--buckets-mib", default="256,1024,0", help="bucket sizes in MiB; 0 = the whole model in one bucket")
    ap.add_argument("--out", default=None, help="JSON output (default: bench/results/weight_sync.json; smoke: a temp file)")
    args = ap.parse_args(argv)
    import ray
    device = "cpu" if args.smoke else "cuda"
    shape, model_name = (TINY, "tiny-qwen2 (smoke)") if args.smoke else (QWEN25_1P5B, "Qwen2.5-1.5B shape (random init, bf16)")
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "weight_sync_smoke.json" if args.smoke
                                           else ROOT / "bench" / "results" / "weight_sync.json")
    t_all = time.time()
    ray.init(num_cpus=4, num_gpus=0 if args.smoke else None, include_dashboard=False, log_to_driver=True,
             object_store_memory=256 * 2**20, runtime_env={"env_vars": {**SAFE_ENV, "PYTHONPATH": os.environ["PYTHONPATH"]}})
    try:
        if not args.smoke and ray.cluster_resources().get("GPU", 0) < 2:
            print("weight_sync bench: needs 2 GPUs (or --smoke).", file=sys.stderr); return 2
        gpu = 0 if args.smoke else 1
        env = {**engine_env("transformers", 1, device), **SAFE_ENV}
        port = 29500 + os.getpid() % 500
        L = ray.remote(Learner).options(num_gpus=gpu, num_cpus=1, runtime_env={"env_vars": env}).remote(shape, device, port)
        E = ray.remote(Engine).options(num_gpus=gpu, num_cpus=1, runtime_env={"env_vars": env}).remote(
            qwen2_config(shape), device=device, dtype="auto", seed=1)
        desc, einfo = ray.get([L.describe.remote(), E.info.remote()])
        print(f"learner: {desc}\nengine: {einfo}\nstart-up {time.time() - t_all:.1f} s", flush=True)
        info = connect_weight_sync([L], [E], tp=1, backend="nccl" if device == "cuda" else "gloo")
        print("sync group:", info, flush=True)
        # before any sync the engine holds other weights: the check must fail
        try:
            verify_weight_sync([L], [E], atol=0.1 if device == "cuda" else 1e-4, checksums=True, max_new_tokens=4)
            print("WARNING: engine matched before the first sync", flush=True)
        except Exception as e: print("before sync, as expected:", str(e)[:120], flush=True)
        first = sync_weights([L], [E])                          # warm-up (NCCL communicators, allocator)
        nbytes = first["bytes"]
        floor = ray.get([L.floor.remote(nbytes, args.reps), E.floor.remote(nbytes, args.reps)])
        floor_s = statistics.median(max(a, b) for a, b in zip(*floor))
        print(f"floor: {nbytes / 1e9:.3f} GB in {floor_s * 1e3:.2f} ms ({nbytes / floor_s / 1e9:.0f} GB/s)", flush=True)
        device_name = f"{desc['gpus']}x {desc['device_name']}" if device == "cuda" else "cpu (smoke)"
        records = []
        for mib in [int(x) for x in args.buckets_mib.split(",")]:
            bb = None if mib == 0 else mib * 2**20
            sync_weights([L], [E], bucket_bytes=bb)              # warm-up at this size
            timed = [sync_weights([L], [E], bucket_bytes=bb, timing=True) for _ in range(args.reps)]
            piped = [sync_weights([L], [E], bucket_bytes=bb) for _ in range(args.reps)]
            med = lambda rows, k: statistics.median(r[k] for r in rows)
            rec = {"model": model_name, "bytes": nbytes, "tensors": first["tensors"], "bucket": "whole model" if bb is None else f"{mib} MiB",
                   "buckets": piped[0]["buckets"], "floor_s": floor_s, "gather_s": med(timed, "gather_s"), "send_s": med(timed, "send_s"),
                   "load_s": med(timed, "load_s"), "recv_s": med(timed, "recv_s"), "phased_total_s": med(timed, "total_s"),
                   "total_s": med(piped, "total_s"), "call_s": med(piped, "call_s"), "device": device_name, "reps": args.reps}
            rec["total_over_floor"] = rec["total_s"] / floor_s
            rec["gbps"] = {k: nbytes / rec[f"{k}_s"] / 1e9 for k in ("floor", "gather", "send", "load", "total")}
            records.append(rec)
            print(f"bucket {rec['bucket']:>11} ({rec['buckets']} buckets): gather {rec['gather_s'] * 1e3:.1f} ms, send {rec['send_s'] * 1e3:.1f} ms, "
                  f"load {rec['load_s'] * 1e3:.1f} ms | pipelined total {rec['total_s'] * 1e3:.1f} ms = {rec['total_over_floor']:.2f}x floor "
                  f"({rec['gbps']['total']:.0f} GB/s)", flush=True)
        rep = verify_weight_sync([L], [E], atol=0.1 if device == "cuda" else 1e-4, checksums=True, max_new_tokens=4)   # bf16 on GPU
        print("verified:", rep, flush=True)
        for r in records: r["verified"] = rep
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"records": records, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                                   "host": socket.gethostname(), "wall_s": time.time() - t_all}, indent=1))
        print(f"wrote {out} ({time.time() - t_all:.0f} s in all)")
        ray.get([L.ws_close.remote(), E.close.remote()])
        return 0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
