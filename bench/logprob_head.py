"""The learner's log-prob head alone: `grpo_nb.loss.token_logprobs` forward + backward with the loop of torch ops
(`kernel="torch"`) and with the fused Triton kernels (`kernel="triton"`), on the shapes the learner runs (Qwen2.5's
vocabulary, the hidden sizes of 1.5B / 3B / 7B, a 16,384-token micro-batch in chunks of 2,048), through the same
autograd function the learner calls.

For each shape and kernel: seconds per forward + backward over timed repetitions (mean, median, p90, after a warm-up),
the peak memory the head adds, and how far the kernels' log-probs, entropies and gradients are from the loop's, and
their log-probs from float64 references on the first rows (of the exact logits, and of the logits as the matmul rounds them). Results: bench/results/logprob_head.json.

    python bench/logprob_head.py                    # one GPU, about a minute
    python bench/logprob_head.py --smoke            # CPU: small shapes; the Triton kernels in Triton's interpreter when triton is installed
"""
from __future__ import annotations
import argparse, importlib.util, json, os, platform, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.common import step_stats  # noqa: E402

SHAPES = {"Qwen2.5-1.5B": 1536, "Qwen2.5-3B": 2048, "Qwen2.5-7B": 3584}   # hidden sizes; all have V = 151,936
VOCAB = 151936


def one_shape(torch, name:str, hidden:int, vocab:int, tokens:int, chunk:int, reps:int, with_entropy:bool, dev:str, ref_rows:int) -> dict:
    "Time and compare both kernels on one shape."
    from grpo_nb.loss import token_logprobs
    g = torch.Generator(device="cpu").manual_seed(0)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    h0 = (torch.randn(tokens, hidden, generator=g) * 1.0).to(dev, dt)
    W0 = (torch.randn(vocab, hidden, generator=g) * hidden ** -0.5 * 4).to(dev, dt)   # logits of std ~4, a peaked softmax like a trained model's
    y = torch.randint(0, vocab, (tokens,), generator=g).to(dev)
    y[::97] = -100                                                     # ignored positions, as at the end of packed sequences
    gl = torch.randn(tokens, generator=g).to(dev)
    ge = torch.randn(tokens, generator=g).to(dev) if with_entropy else None
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    out = {"model": name, "hidden": hidden, "vocab": vocab, "tokens": tokens, "chunk": chunk, "with_entropy": with_entropy, "kernels": {}}
    res = {}
    for kernel in ("torch", "triton"):
        h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
        def step():
            h.grad = W.grad = None
            o = token_logprobs(h, W, y, chunk=chunk, with_entropy=with_entropy, kernel=kernel)
            lp, en = o if with_entropy else (o, None)
            loss = (lp * gl).sum() + ((en * ge).sum() if with_entropy else 0)
            loss.backward()
            return lp, en
        lp, en = step()                                                # warm-up (and Triton's compile)
        sync()
        if dev == "cuda": torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        times = []
        for _ in range(reps):
            sync(); t0 = time.perf_counter(); lp, en = step(); sync(); times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() - base if dev == "cuda" else None
        res[kernel] = (lp.detach().float(), None if en is None else en.detach().float(), h.grad.float(), W.grad.float())
        out["kernels"][kernel] = {"step_s": step_stats(times), "reps": reps, "head_peak_bytes": peak}
        del h, W
    names = ("logp", "entropy", "grad_hidden", "grad_weight")
    out["max_abs_diff_triton_vs_torch"] = {n: (a - b).abs().max().item() for n, a, b in zip(names, res["torch"], res["triton"]) if a is not None}
    out["max_abs"] = {n: a.abs().max().item() for n, a in zip(names, res["torch"]) if a is not None}
    # float64 references on the first rows: from the exact product of the bf16 inputs (what rounding the logits to the
    # weights' dtype costs both heads alike), and from the logits as the matmul rounds them (the heads' own arithmetic)
    r = slice(0, ref_rows)
    def ref(z):   # [rows, V] float64 logits -> log-probs of the chosen tokens
        lsm = torch.log_softmax(z, -1)
        return torch.where(y[r] >= 0, lsm.gather(1, y[r].clamp(min=0)[:, None])[:, 0], 0)
    exact, rounded = ref(h0[r].double() @ W0.double().t()), ref((h0[r] @ W0.t()).double())
    out["max_abs_err_vs_float64"] = {k: (res[k][0][r].double() - exact).abs().max().item() for k in res}
    out["max_abs_err_vs_float64_of_rounded_logits"] = {k: (res[k][0][r].double() - rounded).abs().max().item() for k in res}
    t, f = out["kernels"]["torch"]["step_s"]["mean"], out["kernels"]["triton"]["step_s"]["mean"]
    out["speedup_mean"] = t / f if f else None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="results JSON (default bench/results/logprob_head.json; smoke: /tmp/logprob_head_smoke.json)")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per call (one packed micro-batch; default 16384)")
    p.add_argument("--chunk", type=int, default=2048, help="learner.logprob_chunk (default 2048, as the learner benchmarks)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per kernel and shape (default 10)")
    p.add_argument("--models", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--smoke", action="store_true", help="CPU, small shapes; needs triton installed and runs it in its interpreter")
    a = p.parse_args(argv)
    if a.smoke: os.environ["TRITON_INTERPRET"] = "1"                   # before triton is imported
    import torch
    if importlib.util.find_spec("triton") is None:
        print("triton is not installed: nothing to compare (pip install triton)", file=sys.stderr); return 2
    dev = "cpu" if a.smoke else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: run on a GPU node, or --smoke", file=sys.stderr); return 2
    bad = [m for m in a.models.split(",") if m not in SHAPES]
    if bad: print(f"unknown model(s) {bad}: choose from {list(SHAPES)}", file=sys.stderr); return 2
    rows = []
    shapes = [("smoke", 32, 500, 96, 40)] if a.smoke else [(m, SHAPES[m], VOCAB, a.tokens, a.chunk) for m in a.models.split(",")]
    for name, hidden, vocab, tokens, chunk in shapes:
        for ent in (False, True):
            r = one_shape(torch, name, hidden, vocab, tokens, chunk, 2 if a.smoke else a.reps, ent, dev, 16 if a.smoke else 256)
            k = r["kernels"]
            print(f"{name:<14} entropy={ent!s:<5} torch {k['torch']['step_s']['mean']*1e3:8.1f} ms  triton {k['triton']['step_s']['mean']*1e3:8.1f} ms"
                  f"  x{r['speedup_mean']:.2f}  |Δlogp| {r['max_abs_diff_triton_vs_torch']['logp']:.1e}"
                  + (f"  peak {(k['torch']['head_peak_bytes'] or 0)/2**30:.2f} -> {(k['triton']['head_peak_bytes'] or 0)/2**30:.2f} GiB" if dev == "cuda" else ""), flush=True)
            rows.append(r)
    import triton
    env = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu (Triton interpreter)"}
    out = Path(a.out or ("/tmp/logprob_head_smoke.json" if a.smoke else ROOT / "bench/results/logprob_head.json"))
    out.write_text(json.dumps({"env": env, "records": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
