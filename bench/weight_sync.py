"""Weight-sync benchmark: a ZeRO-3 learner on GPU 0 pushes its weights into a rollout engine on GPU 1, either the
transformers engine (`--receiver transformers`) or a real vLLM engine (`--receiver vllm`).

A Qwen2.5-1.5B-shaped policy (random init, bf16, 3.09 GB, 338 tensors) lives in a one-rank DeepSpeed ZeRO-3
world on GPU 0, in this process; the engine (`grpo_nb.rollout.HFEngine`, or `grpo_nb.rollout.VllmEngine` whose
worker loads the buckets through vLLM's own loader) with the same architecture lives on GPU 1, in a child process
(spawned, driven through a pipe: no Ray needed). They form the weight-sync group (NCCL) through
the library's own `connect_weight_sync` / `sync_weights` / `verify_weight_sync`, and this script times:

  floor  a raw NCCL broadcast of one buffer of the same number of bytes, through the same group, same run
  gather ZeRO-3 gathers + packing into bucket buffers (learner; phases synchronised one by one)
  send   the bucket broadcasts (learner; phases synchronised one by one)
  load   copying received tensors into the engine's existing parameters (engine; synchronised)
  total  the real, pipelined sync: first gather on the learner -> last tensor copied on the engine
         (the next bucket is gathered while the previous one is on the wire, and loaded while the next arrives)

for a few bucket sizes, then verifies the engine bit for bit (checksums) and by log-probs. vLLM packs q/k/v and
gate/up into single tensors, so for it the learner's checksums are taken of the same packing (concatenated full
tensors) and compared with the checksums of the worker's own parameters (`bench/vllm_bench_ext.py`).
Records go to bench/results/weight_sync.json (receiver, model, bytes, floor_s, gather_s, send_s, load_s, total_s,
total_over_floor, device; prepare_s, the plan's round trip, and call_plan_kept_s / total_plan_kept_s, the sync as the
trainer makes it, with the plan kept and the NaN/Inf check in the sync's header); a run replaces the records of its own receiver and keeps the other receiver's.

GPU (2 GPUs; see the guide page "Measured on GPUs"):                     python bench/weight_sync.py [--receiver vllm]
CPU smoke test (tiny model, gloo, ~1 min):                               python bench/weight_sync.py --smoke [--receiver vllm]

Every stage (start-up, floor, each bucket size, verification) is guarded: a failure is recorded under "errors"
and the JSON is rewritten after every stage, so one failure still leaves the rest. A stage that times out
(a hung collective) ends the run, since every later stage would hang too. `--budget-s` skips bucket sizes
that would start after that many seconds, so the whole run stays within a few minutes.
"""
import argparse, json, multiprocessing as mp, os, socket, statistics, sys, tempfile, threading, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import GPU_ENV as SAFE_ENV  # noqa: E402  (shared by the bench scripts)
os.environ.update(SAFE_ENV)   # before torch/NCCL start: the engine process inherits it

import torch  # noqa: E402
from grpo_nb.rollout import HFEngine, VllmEngine, gather, submit  # noqa: E402
from grpo_nb.weight_sync import (WeightSyncError, WeightSyncSource, connect_weight_sync, sync_plan, sync_weights,  # noqa: E402
                                 tensor_checksum, verify_weight_sync)
from vllm_bench_ext import raw_broadcast  # noqa: E402  (the floor, timed the same way on every side)

QWEN25_1P5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6,
                   rms_norm_eps=1e-6, eos_token_id=151643, bos_token_id=151643)
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=1, bos_token_id=1)


def qwen2_config(shape:dict):
    from transformers import Qwen2Config
    return Qwen2Config(**shape)


class Learner(WeightSyncSource):
    "One-rank DeepSpeed ZeRO-3 learner holding a random-init policy (lives in this process)."
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
        return {"params": self.n_params, "device_name": name, "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "torch": torch.__version__, "nccl": str(torch.cuda.nccl.version()) if self.device.type == "cuda" else None}

    def floor(self, nbytes:int, iters:int) -> list[float]:
        "Sender side of a raw broadcast of `nbytes` through the sync group; one time per iteration."
        return raw_broadcast(self._ws_group, nbytes, iters)

    def packed_checksums(self) -> dict[str, int]:
        "Checksums of the full tensors packed as vLLM's Qwen2 holds them (q/k/v -> qkv_proj, gate/up -> gate_up_proj)."
        import deepspeed
        named = dict(self.model.module.named_parameters())
        out = {}
        with deepspeed.zero.GatheredParameters(list(named.values()), modifier_rank=None):
            for n, p in named.items():
                packed = [(parts, name) for parts, name in PACKED if f".{parts[0]}." in n]
                if packed:
                    parts, name = packed[0]
                    out[n.replace(parts[0], name)] = tensor_checksum(torch.cat([named[n.replace(parts[0], q)].data for q in parts], 0))
                elif not any(f".{q}." in n for parts, _ in PACKED for q in parts):
                    out[n] = tensor_checksum(p.data)
        return out


PACKED = [(("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj")]   # vLLM's Qwen2 packing


class Engine(HFEngine):
    "The transformers engine, plus the receiving side of the raw broadcast."
    def floor(self, nbytes:int, iters:int) -> list[float]:
        return raw_broadcast(self.sync_group, nbytes, iters)
    def in_place(self) -> bool:
        "Whether the last sync went straight into the parameters (`grpo_nb.weight_sync.bind_in_place`) rather than through a copy."
        return getattr(self, "_bound", (None, None))[1] is not None


class VEngine(VllmEngine):
    "The real vLLM engine (worker extension `bench/vllm_bench_ext.py`), plus the floor and the packed checksums."
    def floor(self, nbytes:int, iters:int) -> list[float]:
        return self.llm.collective_rpc("grpo_floor", args=(nbytes, iters))[0]
    def packed_checksums(self) -> dict[str, int]:
        return self.llm.collective_rpc("grpo_param_checksums")[0]
    def set_weight_load(self, mode:str) -> str:
        "How the workers load the next syncs (`rollout.weight_load`)."
        self.weight_load = mode; return mode


# ---- an object in a child process, called through a pipe ------------------------------------------------------------

def _serve(conn, cls, args, kwargs, env):
    "Child process: build `cls(*args, **kwargs)` and answer (method, args, kwargs) requests until told to stop."
    os.environ.update(env)   # before the first CUDA call (torch is imported, CUDA is not initialised yet)
    try: obj, reply = cls(*args, **kwargs), (True, None)
    except BaseException as e: obj, reply = None, (False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
    conn.send(reply)
    while obj is not None:
        name, a, k = conn.recv()
        if name is None: break
        try: conn.send((True, getattr(obj, name)(*a, **k)))
        except BaseException as e: conn.send((False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"))


class InProcess:
    "`cls(*args, **kwargs)` in a spawned child process; `proxy.method(*a)` calls it there and waits (one call at a time)."
    def __init__(self, cls, *args, env:dict|None=None, timeout_s:float=600, **kwargs):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, cls, args, kwargs, dict(env or {})), daemon=True)
        self._proc.start()
        self._lock, self._timeout = threading.Lock(), timeout_s
        self._answer("start-up")

    def _answer(self, what):
        if not self._conn.poll(self._timeout): raise TimeoutError(f"engine process: no answer to {what} in {self._timeout} s")
        ok, val = self._conn.recv()
        if not ok: raise RuntimeError(f"engine process, {what}: {val}")
        return val

    def __getattr__(self, name):
        if name.startswith("_"): raise AttributeError(name)
        def method(*a, **k):
            with self._lock:
                self._conn.send((name, a, k))
                return self._answer(name)
        return method

    def _stop(self):
        try: self._conn.send((None, (), {}))
        except (OSError, BrokenPipeError): pass
        self._proc.join(10)
        if self._proc.is_alive(): self._proc.kill()


# ---- the benchmark -------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU with gloo (checks the script, not the hardware)")
    ap.add_argument("--receiver", choices=["transformers", "vllm"], default="transformers",
                    help="the engine that receives: grpo_nb's transformers engine or a real vLLM engine (vLLM's loader)")
    ap.add_argument("--reps", type=int, default=5, help="timed syncs per bucket size (median reported)")
    ap.add_argument("--buckets-mib", default="1024,256,0", help="bucket sizes in MiB; 0 = the whole model in one bucket")
    ap.add_argument("--weight-load", default="auto", help="vllm receiver: comma-separated rollout.weight_load modes to measure "
                    "(auto, direct, slices, reload), each with every bucket size and its own bit-exact check")
    ap.add_argument("--out", default=None, help="JSON output (default: bench/results/weight_sync.json; smoke: a temp file)")
    ap.add_argument("--budget-s", type=float, default=360, help="start no new bucket size after this many seconds")
    ap.add_argument("--call-timeout-s", type=float, default=120, help="a sync or floor call slower than this counts as hung")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    shape, model_name = (TINY, "tiny-qwen2 (smoke)") if args.smoke else (QWEN25_1P5B, "Qwen2.5-1.5B shape (random init, bf16)")
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "weight_sync_smoke.json" if args.smoke
                                           else ROOT / "bench" / "results" / "weight_sync.json")
    t_all, timeout = time.time(), args.call_timeout_s
    res = {"records": [], "errors": [], "created": time.strftime("%Y-%m-%d %H:%M:%S"), "host": socket.gethostname(),
           "argv": sys.argv[1:] if argv is None else list(argv), "reference_floor_s": None if args.smoke else 0.0118}
    kept, kept_err, runs = [], [], {}   # the other receiver's results stay in the file
    if out.exists():
        try:
            old = json.loads(out.read_text())
            kept = [r for r in old.get("records", []) if r.setdefault("receiver", "transformers") != args.receiver]
            kept_err = [e for e in old.get("errors", []) if e.setdefault("receiver", "transformers") != args.receiver]
            runs = {k: v for k, v in old.get("runs", {}).items() if k != args.receiver}
        except (json.JSONDecodeError, AttributeError): pass
    mine = res["records"]
    def write():
        res["wall_s"] = time.time() - t_all
        for e in res["errors"]: e.setdefault("receiver", args.receiver)
        meta = {k: res.get(k) for k in ("created", "host", "argv", "learner", "engine", "sync_group", "startup_s", "wall_s",
                                        "before_sync_check", "verified", "checksums", "floor_s")}
        full = {**res, "records": kept + mine, "errors": kept_err + res["errors"], "runs": {**runs, args.receiver: meta}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(full, indent=1))
    hung = False
    def stage(name, fn):
        "Run one stage; record its error (and skip later stages after a timeout) instead of raising."
        nonlocal hung
        if hung: res["errors"].append({"stage": name, "error": "skipped: an earlier stage hung"}); write(); return None
        try: return fn()
        except Exception as e:   # a benchmark records every failure and goes on
            hung = hung or isinstance(e, TimeoutError)
            res["errors"].append({"stage": name, "error": f"{type(e).__name__}: {str(e)[:1500]}",
                                  "traceback": traceback.format_exc()[-3000:]})
            print(f"[{name}] FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True); write(); return None

    if device == "cuda" and torch.cuda.device_count() < 2:
        res["errors"].append({"stage": "start", "error": f"needs 2 GPUs (sees {torch.cuda.device_count()}); use --smoke on CPU"})
        write(); print("weight_sync bench: needs 2 GPUs (or --smoke).", file=sys.stderr); return 2
    E = None
    try:
        def start():
            nonlocal E
            engine_env = {**SAFE_ENV, "CUDA_VISIBLE_DEVICES": "1"} if device == "cuda" else dict(SAFE_ENV)
            # the engine process starts first (it is spawned, so it sees the environment before any CUDA call here)
            if args.receiver == "vllm":
                from e2e_vs_trl import build_model
                mdir = build_model({k: v for k, v in shape.items() if k not in ("max_position_embeddings", "eos_token_id", "bos_token_id")},
                                   Path(tempfile.mkdtemp(prefix="ws-vllm-")) / "model", weights=False)
                engine_env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")])
                engine_env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
                engine_env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the worker lives in the (daemonic) engine process itself
                E = InProcess(VEngine, str(mdir), gpu_memory_utilization=0.5 if device == "cuda" else 0.9, enforce_eager=True,
                              dtype="bfloat16" if device == "cuda" else "float32", seed=1, max_model_len=256,
                              load_format="dummy", worker_extension_cls="vllm_bench_ext.BenchVllmExtension",
                              env=engine_env, timeout_s=600)
            else:
                E = InProcess(Engine, qwen2_config(shape), device=device, dtype="auto", seed=1, env=engine_env, timeout_s=300)
            L = Learner(shape, device, port=29500 + os.getpid() % 500)
            desc, einfo = L.describe(), E.info()
            print(f"learner: {desc}\nengine: {einfo}\nstart-up {time.time() - t_all:.1f} s", flush=True)
            info = connect_weight_sync([L], [E], tp=1, backend="nccl" if device == "cuda" else "gloo", timeout_s=timeout)
            print("sync group:", info, flush=True)
            res.update(learner=desc, engine=einfo, sync_group=info, startup_s=time.time() - t_all)
            return L, desc
        started = stage("start", start)
        if started is None: write(); return 1
        L, desc = started
        device_name = f"{torch.cuda.device_count()}x {desc['device_name']}" if device == "cuda" else "cpu (smoke)"
        atol = 0.1 if device == "cuda" else 1e-4   # bf16 engine vs bf16 learner; the checksums are exact either way

        def before():   # the engine starts from other weights: the check must fail
            try: verify_weight_sync([L], [E], atol=atol, checksums=True, max_new_tokens=4)
            except WeightSyncError as e: res["before_sync_check"] = f"failed as expected: {str(e)[:200]}"; return
            res["before_sync_check"] = "UNEXPECTED: engine matched before the first sync"
        stage("check before sync", before)
        first = stage("warm-up sync", lambda: sync_weights([L], [E], timeout_s=timeout))   # NCCL communicators, allocator
        if first is None: write(); return 1
        nbytes = first["bytes"]

        def floor():
            t = gather([submit(L, "floor", nbytes, args.reps), submit(E, "floor", nbytes, args.reps)], timeout)
            f = statistics.median(max(a, b) for a, b in zip(*t))
            print(f"floor: {nbytes / 1e9:.3f} GB in {f * 1e3:.2f} ms ({nbytes / f / 1e9:.0f} GB/s)", flush=True)
            return f
        floor_s = stage("floor", floor)
        res["floor_s"] = floor_s
        write()
        def bucket_run(mib:int, mode:str|None):
            bb = None if mib == 0 else mib * 2**20
            sync_weights([L], [E], bucket_bytes=bb, timeout_s=timeout)              # warm-up at this size
            timed = [sync_weights([L], [E], bucket_bytes=bb, timing=True, timeout_s=timeout) for _ in range(args.reps)]
            piped = [sync_weights([L], [E], bucket_bytes=bb, timeout_s=timeout) for _ in range(args.reps)]
            plan = sync_plan([L], bb, timeout)   # as the trainer syncs: the plan kept, the NaN/Inf check in the sync's header
            kept = [sync_weights([L], [E], bucket_bytes=bb, timeout_s=timeout, plan=plan) for _ in range(args.reps)]
            med = lambda rows, k: statistics.median(r[k] for r in rows)
            rec = {"receiver": args.receiver, "model": model_name, "bytes": nbytes, "tensors": first["tensors"],
                   "bucket": "whole model" if bb is None else f"{mib} MiB", "buckets": piped[0]["buckets"],
                   "floor_s": floor_s, "gather_s": med(timed, "gather_s"), "send_s": med(timed, "send_s"),
                   "load_s": med(timed, "load_s"), "recv_s": med(timed, "recv_s"), "phased_total_s": med(timed, "total_s"),
                   "total_s": med(piped, "total_s"), "check_s": med(piped, "check_s"), "call_s": med(piped, "call_s"),
                   "prepare_s": med(piped, "prepare_s"), "call_plan_kept_s": med(kept, "call_s"), "total_plan_kept_s": med(kept, "total_s"),
                   "device": device_name, "reps": args.reps}
            if mode is not None: rec["weight_load"] = mode
            if args.receiver == "transformers": rec["in_place"] = E.in_place()
            rec["gbps"] = {k: nbytes / rec[f"{k}_s"] / 1e9 for k in ("gather", "send", "load", "total") if rec[f"{k}_s"] > 0}
            if floor_s:
                rec["gbps"]["floor"] = nbytes / floor_s / 1e9
                rec["total_over_floor"] = rec["total_s"] / floor_s
                rec["within_2x_floor"] = rec["total_s"] <= 2 * floor_s
            res["records"].append(rec); write()
            print(f"bucket {rec['bucket']:>11} ({rec['buckets']} buckets): gather {rec['gather_s'] * 1e3:.1f} ms, "
                  f"send {rec['send_s'] * 1e3:.1f} ms, load {rec['load_s'] * 1e3:.1f} ms | pipelined total "
                  f"{rec['total_s'] * 1e3:.1f} ms = {rec.get('total_over_floor', float('nan')):.2f}x floor "
                  f"({rec['gbps'].get('total', 0):.0f} GB/s); NaN check {rec['check_s'] * 1e3:.1f} ms", flush=True)

        def verify(mode):
            rep = verify_weight_sync([L], [E], atol=atol, checksums=True, max_new_tokens=4)
            if args.receiver == "vllm":   # bit for bit, in vLLM's packing
                want, got = L.packed_checksums(), E.packed_checksums()
                diff = sorted(n for n in got if want.get(n) != got[n])
                missing = sorted(set(got) - set(want))
                if device == "cpu" and not missing and got and all(n.endswith("proj.weight") for n in diff):
                    rep["checksums"] = (f"vLLM worker bit-identical on {len(got) - len(diff)} of {len(got)} packed tensors; the other "
                                        f"{len(diff)} are linear weights the CPU build re-lays out after loading (the log-probs cover them)")
                elif diff or missing or not got:
                    raise WeightSyncError(f"vLLM worker parameters differ bit-wise from the learner's: {diff[:3]} (no learner tensor: {missing[:3]})")
                else: rep["checksums"] = f"vLLM worker bit-identical on {len(got)} packed tensors"
            print("verified" + (f" ({mode})" if mode else "") + ":", rep, flush=True)
            res["verified"] = rep
            for r in res["records"]:
                if r.get("weight_load") == mode: r.update(verified=True, checksums=rep.get("checksums"))

        for mode in (args.weight_load.split(",") if args.receiver == "vllm" else [None]):   # each load mode: every bucket size, then its check
            if mode is not None: E.set_weight_load(mode)
            for mib in [int(x) for x in args.buckets_mib.split(",")]:
                what = f"bucket {mib} MiB" + (f" ({mode})" if mode else "")
                if time.time() - t_all > args.budget_s:
                    res["errors"].append({"stage": what, "error": f"skipped: over the {args.budget_s:.0f} s budget"}); continue
                stage(what, lambda mib=mib, mode=mode: bucket_run(mib, mode))
            stage("verify" + (f" ({mode})" if mode else ""), lambda mode=mode: verify(mode))
        write()
        print(f"wrote {out} ({time.time() - t_all:.0f} s in all; {len(res['records'])} records, {len(res['errors'])} errors)", flush=True)
        return 0 if res["records"] and not res["errors"] else 1
    finally:
        if E is not None: E._stop()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)   # a collective that hung leaves a thread behind; do not wait for it
