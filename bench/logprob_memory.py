"""Peak GPU memory and time of token log-probs, naive vs chunked, forward + backward.

The naive path materialises the [N, V] logits (bf16, then fp32) and log_softmax; the chunked path
(`grpo_nb.loss.token_logprobs`) holds a few [chunk, V] buffers at a time. For Qwen2.5 shapes (V = 151,936,
H = 896 and 1536) and N = 8k..32k tokens in bf16, this records torch.cuda.max_memory_allocated above what the
inputs already hold ("extra"), the absolute peak, and the median time of forward + backward, then a chunk-size
sweep at the largest N. Plain torch only; the repository root is put on sys.path to import grpo_nb.loss.

GPU (one H100 or H200, about 1 minute):   python bench/logprob_memory.py
CPU smoke test (seconds, no GPU):          python bench/logprob_memory.py --smoke --out /tmp/logprob_memory.json
Output: bench/results/logprob_memory.json = {"meta": {...}, "records": [{...}, ...]}.
"""
from __future__ import annotations
import argparse, datetime, json, platform, statistics, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
from grpo_nb.loss import token_logprobs, token_logprobs_naive  # noqa: E402


def _sync(dev):
    if dev.type == "cuda": torch.cuda.synchronize(dev)


def _alloc(dev) -> int | None:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None


def run_once(fn, hidden, weight, tokens, dev):
    "One forward + backward of logp.sum(); returns (seconds, peak bytes, extra bytes over the start, logp, grad_h, grad_w)."
    hidden.grad = weight.grad = None
    _sync(dev)
    if dev.type == "cuda": torch.cuda.reset_peak_memory_stats(dev)
    base = _alloc(dev)
    t0 = time.perf_counter()
    logp = fn(hidden, weight, tokens)
    logp.sum().backward()
    _sync(dev)
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    return dt, peak, (peak - base if peak is not None else None), logp.detach(), hidden.grad, weight.grad


def measure(fn, hidden, weight, tokens, dev, reps):
    "Warm-up + `reps` timed runs: median seconds, max peak/extra bytes, and the last run's outputs; None fields on OOM."
    times, peaks, extras, last, oom = [], [], [], None, False
    try:
        for i in range(reps + 1):
            last = None  # free the previous run's outputs before the next run
            dt, peak, extra, *last = run_once(fn, hidden, weight, tokens, dev)
            if i: times.append(dt); peaks.append(peak); extras.append(extra)
    except torch.OutOfMemoryError:
        oom = True
    hidden.grad = weight.grad = None
    if oom:  # outside the except block, so that the traceback's tensors are already freed
        last = None
        if dev.type == "cuda": torch.cuda.empty_cache()
        return {"oom": True, "s": None, "peak": None, "extra": None}, None
    return {"oom": False, "s": statistics.median(times), "peak": None if peaks[0] is None else max(peaks),
            "extra": None if extras[0] is None else max(extras)}, last


def bench(tokens_list, hidden_list, vocab, chunk, sweep_chunks, reps, dtype, dev, seed=0):
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    records = []
    cases = [(H, N, chunk, True) for H in hidden_list for N in tokens_list]
    cases += [(max(hidden_list), max(tokens_list), c, False) for c in sweep_chunks if c != chunk]
    for H, N, c, with_naive in cases:
        g = torch.Generator(device=dev).manual_seed(seed)  # inputs made on the device (a [V, H] randn on CPU takes seconds)
        weight = (torch.randn(vocab, H, generator=g, device=dev) * H ** -0.5).to(dtype).requires_grad_()
        hidden = torch.randn(N, H, generator=g, device=dev).to(dtype).requires_grad_()
        tokens = torch.randint(0, vocab, (N,), generator=g, device=dev)
        chunked, c_out = measure(lambda h, w, t: token_logprobs(h, w, t, chunk=c), hidden, weight, tokens, dev, reps)
        if c_out is not None: c_out = (c_out[0].cpu(), c_out[1].float().cpu(), c_out[2].float().cpu())
        naive, n_out = (measure(token_logprobs_naive, hidden, weight, tokens, dev, reps) if with_naive
                        else ({"oom": None, "s": None, "peak": None, "extra": None}, None))
        rec = {"hidden": H, "vocab": vocab, "tokens": N, "chunk": c, "dtype": str(dtype).replace("torch.", ""),
               "naive_ran": with_naive, "naive_oom": naive["oom"], "naive_peak_bytes": naive["peak"],
               "naive_extra_bytes": naive["extra"], "naive_s": naive["s"], "chunked_oom": chunked["oom"],
               "chunked_peak_bytes": chunked["peak"], "chunked_extra_bytes": chunked["extra"], "chunked_s": chunked["s"],
               "logits_fp32_bytes": N * vocab * 4, "device": name}
        if c_out is not None and n_out is not None:
            lp, gh, gw = n_out[0].cpu(), n_out[1].float().cpu(), n_out[2].float().cpu()
            rec["max_abs_diff_logp"] = (c_out[0] - lp).abs().max().item()
            rec["rel_diff_grad_hidden"] = ((c_out[1] - gh).norm() / gh.norm()).item()
            rec["rel_diff_grad_weight"] = ((c_out[2] - gw).norm() / gw.norm()).item()
        records.append(rec)
        gib = lambda b: "  -  " if b is None else f"{b / 2**30:6.2f}"
        print(f"H={H:5d} N={N:6d} chunk={c:5d} | extra GiB naive {gib(naive['extra'])}{' OOM' if naive['oom'] else ''} "
              f"chunked {gib(chunked['extra'])} | s naive {naive['s'] or 0:.4f} chunked {chunked['s'] or 0:.4f}", flush=True)
        del weight, hidden, tokens, c_out, n_out
        if dev.type == "cuda": torch.cuda.empty_cache()
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (checks the script, measures nothing useful)")
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768], help="N = B·T values")
    p.add_argument("--hidden", type=int, nargs="+", default=[896, 1536], help="H values (Qwen2.5-0.5B, -1.5B)")
    p.add_argument("--vocab", type=int, default=151_936, help="V (Qwen2.5)")
    p.add_argument("--chunk", type=int, default=1024, help="chunk of the main table (learner.logprob_chunk)")
    p.add_argument("--sweep-chunks", type=int, nargs="*", default=[256, 512, 2048, 4096], help="chunk sizes at the largest H and N")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions after one warm-up")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/logprob_memory.json; with --smoke: print only)")
    a = p.parse_args(argv)
    if a.smoke:
        dev, a.tokens, a.hidden, a.vocab, a.chunk, a.sweep_chunks, a.reps = torch.device("cpu"), [128, 256], [16, 32], 500, 64, [32], 1
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run this on a GPU machine, or use --smoke here", file=sys.stderr); return 2
        dev = torch.device("cuda")
        if a.out is None: a.out = str(ROOT / "bench" / "results" / "logprob_memory.json")
    t0 = time.time()
    records = bench(a.tokens, a.hidden, a.vocab, a.chunk, a.sweep_chunks, a.reps, torch.bfloat16, dev)
    meta = {"script": "bench/logprob_memory.py", "argv": sys.argv[1:] if argv is None else list(argv),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "device": records[0]["device"] if records else str(dev), "smoke": a.smoke, "seconds": round(time.time() - t0, 1),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "note": "extra = max_memory_allocated during forward+backward minus memory_allocated before it (inputs excluded)"}
    out = json.dumps({"meta": meta, "records": records}, indent=1)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(out + "\n")
        print(f"wrote {a.out} ({len(records)} records, {meta['seconds']} s)")
    else: print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
