"""The colocated weight sync's transport alone: a learner process hands buckets to an engine process on the same GPU
through `grpo_nb.colocate.IpcGroup`, exactly as `send_weights` and `receive_buckets` drive it (the sender builds each
bucket in `buffer`, `broadcast`s it, keeps at most two in flight; the receiver copies each into its own buffer; both
`end` the sync).

Two ways of sharing, timed in the same run on the same GPU:
  per-sync    what the trainer does: two shared buffers a sync, each shared (one CUDA IPC handle) once
  per-bucket  every bucket's buffer shared, mapped and freed on its own (`end` after each bucket), one bucket at a
              time: the baseline. The transport before the two buffers also shared each bucket on its own, but kept
              two in flight, so this mode is close to it, not the same
and, as the floor, one device-to-device copy of the same bytes on that GPU (what the receiver's copies cost at least).

Every sync's seconds (mean, median, p90 over the timed repeats after one warm-up), the handles shared per sync, and
GB/s. Results: bench/results/ipc_sync.json.

    python bench/ipc_sync.py                       # one GPU: 15 buckets of 1 GiB (a 7B model's 15.2 GB), 5 timed syncs
    python bench/ipc_sync.py --smoke               # CPU, small buckets: the same code path, shared-memory files
"""
from __future__ import annotations
import argparse, json, multiprocessing as mp, sys, time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import step_stats   # noqa: E402  (mean, median, p90)


def _receiver(port:int, device:str, buckets:int, nbytes:int, syncs:int, per_bucket:bool, q):
    "The engine's side: receive every sync's buckets into buffers of its own, as `receive_buckets` does."
    import torch
    from torch.distributed import TCPStore
    from grpo_nb.colocate import IpcGroup
    if device == "cuda": torch.cuda.set_device(0)
    g = IpcGroup(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=120)), 1, 2, device, timeout_s=120)
    bufs = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
    ok = True
    for s in range(syncs):
        for k in range(buckets):
            b = bufs[k % 2]
            g.broadcast(b).wait()
            ok &= int(b[0]) == (s * buckets + k) % 251 and int(b[-1]) == (s * buckets + k) % 251
            if per_bucket: g.end()
        if not per_bucket: g.end()
    q.put(ok)


def time_mode(device:str, buckets:int, nbytes:int, syncs:int, per_bucket:bool) -> dict:
    "One mode: `syncs` syncs of `buckets` buckets from this process to a receiver process; seconds of each sync."
    import torch
    from torch.distributed import TCPStore
    from grpo_nb.colocate import IpcGroup
    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False)
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_receiver, args=(store.port, device, buckets, nbytes, syncs, per_bucket, q))
    p.start()
    g = IpcGroup(store, 0, 2, device, timeout_s=120)
    times, shared = [], []
    for s in range(syncs):
        if device == "cuda": torch.cuda.synchronize()
        t0, before, pending = time.perf_counter(), g.exported, None
        for k in range(buckets):
            out = g.buffer(nbytes, nbytes)
            out.fill_((s * buckets + k) % 251)   # stands for the gather that fills the bucket
            w = g.broadcast(out)
            if pending is not None: pending.wait()
            pending = w
            if per_bucket: pending.wait(); pending = None; g.end()
        if pending is not None: pending.wait()
        if not per_bucket: g.end()
        times.append(time.perf_counter() - t0); shared.append(g.exported - before)
    ok = q.get(timeout=120); p.join(60)
    return {"sync_s_all": times, "handles_per_sync": shared[-1], "received_exactly": bool(ok)}


def copy_floor(device:str, total:int, nbytes:int, reps:int=5) -> float:
    "Seconds of device-to-device copies of `total` bytes in `nbytes` pieces on this GPU (the median of `reps`)."
    import statistics, torch
    a, b = torch.empty(nbytes, dtype=torch.uint8, device=device), torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = []
    for _ in range(reps + 1):
        if device == "cuda": torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(total // nbytes): b.copy_(a)
        if device == "cuda": torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--buckets", type=int, default=15, help="buckets a sync (15 × 1 GiB: about a 7B model in bf16)")
    ap.add_argument("--bucket-mib", type=int, default=1024)
    ap.add_argument("--syncs", type=int, default=6, help="syncs per mode; the first is not timed")
    ap.add_argument("--smoke", action="store_true", help="CPU, 4 buckets of 1 MiB")
    ap.add_argument("--out", default=str(ROOT / "bench/results/ipc_sync.json"))
    a = ap.parse_args()
    import torch
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    buckets, nbytes = (4, 1 << 20) if a.smoke else (a.buckets, a.bucket_mib << 20)
    rec = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "buckets": buckets, "bucket_bytes": nbytes,
           "bytes_per_sync": buckets * nbytes, "timed_syncs": a.syncs - 1, "smoke": a.smoke}
    for mode, per_bucket in (("per-sync", False), ("per-bucket", True)):
        r = time_mode(device, buckets, nbytes, a.syncs, per_bucket)
        timed = r["sync_s_all"][1:]
        st = step_stats(timed)
        rec[mode] = {**r, "sync_mean_s": st["mean"], "sync_median_s": st["median"], "sync_p90_s": st["p90"],
                     "gb_per_s": buckets * nbytes / st["mean"] / 1e9}
        print(mode, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec[mode].items() if k != "sync_s_all"}, flush=True)
    rec["copy_floor_s"] = copy_floor(device, buckets * nbytes, nbytes)
    rec["per_bucket_over_per_sync"] = rec["per-bucket"]["sync_mean_s"] / rec["per-sync"]["sync_mean_s"]
    print("copy floor", round(rec["copy_floor_s"], 4), "per-bucket / per-sync", round(rec["per_bucket_over_per_sync"], 2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"records": [rec]}, indent=1))


if __name__ == "__main__":
    main()
