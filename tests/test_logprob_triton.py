"""The fused Triton log-prob head (`token_logprobs(..., kernel="triton")`) against the loop of torch ops, run on this CPU in
Triton's interpreter (TRITON_INTERPRET=1): log-probs, entropies and both gradients, in fp32 and bf16, at a temperature,
with ignored tokens, a chunk that does not divide N, an entropy-only gradient and autograd's expanded (stride-0) gradients;
the buffers it holds (one [chunk, V] buffer in the weights' dtype, what `logits_bytes(..., "chunked-triton")` counts); the
learner's module end to end on a tiny model; and `bench/logprob_head.py --smoke`, run as a script (`runpy`, as `__main__`)
in the same child process after the checks: one torch and Triton start-up serves both tests.

The CPU profile keeps triton out of the main environment (vLLM's CPU build breaks with it importable), so `make venv`
installs it on the side, in .venv/triton-interp, and these checks run in a child process that puts it on the path."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDE = ROOT / ".venv" / "triton-interp"

CHECKS = r'''
import json
import torch
from grpo_nb.loss import token_logprobs

out = {}
torch.manual_seed(0)

def both(h, W, y, chunk, tau, ent, grads):
    "log-probs (and entropy) and the two gradients from each kernel, for the upstream gradients `grads` (gl, ge; ge None: unused)"
    res = {}
    for k in ("torch", "triton"):
        hh, WW = h.detach().clone().requires_grad_(), W.detach().clone().requires_grad_()
        o = token_logprobs(hh, WW, y, chunk=chunk, temperature=tau, with_entropy=ent, kernel=k)
        lp, en = o if ent else (o, None)
        gl, ge = grads
        loss = (lp * gl).sum() + ((en * ge).sum() if ge is not None else 0)
        loss.backward()
        res[k] = [lp.detach().float(), None if en is None else en.detach().float(), hh.grad.float(), WW.grad.float()]
    return res

def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()

cases = []
N, H, V = 37, 16, 301
for dt in (torch.float32, torch.bfloat16):
    for ent in (False, True):
        for tau in (1.0, 0.7):
            h = torch.randn(N, H, dtype=dt); W = torch.randn(V, H, dtype=dt)
            y = torch.randint(0, V, (N,)); y[5] = -100
            gl = torch.randn(N); ge = torch.randn(N) if ent else None
            r = both(h, W, y, 8, tau, ent, (gl, ge))
            cases.append({"dtype": str(dt), "entropy": ent, "tau": tau,
                          "rel": [None if a is None else rel(b, a) for a, b in zip(r["torch"], r["triton"])],
                          "ignored_logp": r["triton"][0][5].item()})
out["cases"] = cases
h = torch.randn(9, 16); W = torch.randn(300, 16); y = torch.randint(0, 300, (9,))
def entropy_only(k):
    hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
    lp, en = token_logprobs(hh, WW, y, chunk=4, with_entropy=True, kernel=k)
    en.sum().backward()                                         # no gradient reaches the log-probs; the entropy's is expanded
    return hh.grad, WW.grad
a, b = entropy_only("torch"), entropy_only("triton")
out["entropy_only_rel"] = [rel(b[0], a[0]), rel(b[1], a[1])]
def logp_sum(k):
    hh, WW = h.clone().requires_grad_(), W.clone().requires_grad_()
    token_logprobs(hh, WW, y, chunk=4, kernel=k).sum().backward()
    return hh.grad, WW.grad
a, b = logp_sum("torch"), logp_sum("triton")
out["logp_sum_rel"] = [rel(b[0], a[0]), rel(b[1], a[1])]
hd = torch.randn(11, 8, dtype=torch.float64); Wd = torch.randn(50, 8, dtype=torch.float64)
try:
    token_logprobs(hd, Wd, torch.randint(0, 50, (11,)), kernel="triton"); out["float64"] = "accepted"
except ValueError as e:
    out["float64"] = str(e)

from test_logprob_memory import LiveBytes   # (tests/ is on the path) follows every storage the backward creates until it is freed
N, H, V, c = 256, 32, 2048, 128   # two chunks: a buffer kept per chunk would show as twice the one expected
hb = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True); wb = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
lp = token_logprobs(hb, wb, torch.randint(0, V, (N,)), chunk=c, kernel="triton")
with LiveBytes() as m:
    lp.sum().backward()
fixed = 4 * V * H + 2 * V * H + 2 * N * H
out["backward_bytes_per_chunk_entry"] = (m.peak - fixed) / (c * V)

from transformers import Qwen2Config, Qwen2ForCausalLM
from grpo_nb.learner import PolicyLogProbs
cfg = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
torch.manual_seed(1); model = Qwen2ForCausalLM(cfg)
ids = torch.randint(0, 128, (1, 24)); pos = torch.arange(24)[None]; score = torch.arange(8, 23); tgt = ids[0, score + 1]
res = {}
for k in ("torch", "triton"):
    m2 = PolicyLogProbs(Qwen2ForCausalLM(cfg)); m2.load_state_dict(PolicyLogProbs(model).state_dict())
    lp, en = m2(ids, pos, score, tgt, chunk=6, temperature=0.9, with_entropy=True, kernel=k)
    (lp.sum() + 0.1 * en.sum()).backward()
    res[k] = (lp.detach(), en.detach(), m2.policy.get_output_embeddings().weight.grad.clone())
out["module_rel"] = [rel(b, a) for a, b in zip(res["torch"], res["triton"])]
print("RESULT " + json.dumps(out))

import runpy, sys   # then the benchmark's smoke run, as `python bench/logprob_head.py --smoke --out OUT` runs it
sys.argv = [BENCH, "--smoke", "--out", BENCH_OUT]
try: runpy.run_path(BENCH, run_name="__main__")
except SystemExit as e: print(f"BENCH_EXIT {e.code or 0}")
else: print("BENCH_EXIT 0")
'''


def _run(code:str, tmp_path:Path, *args:str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(SIDE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)


pytestmark = pytest.mark.skipif(not (SIDE / "triton").is_dir(),
                                reason="triton for the interpreter is not installed in .venv/triton-interp (make venv installs it)")


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    "One child process: the checks (`CHECKS`), then bench/logprob_head.py --smoke; its output and the benchmark's record file."
    tmp = tmp_path_factory.mktemp("triton")
    bench_out = tmp / "head.json"
    code = f"BENCH, BENCH_OUT = {str(ROOT / 'bench/logprob_head.py')!r}, {str(bench_out)!r}\n" + CHECKS
    return _run(code, tmp), bench_out


def test_triton_head_matches_the_loop(child):
    p, _ = child
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))[7:])
    for c in out["cases"]:
        logp, ent, gh, gw = c["rel"]   # relative to the loop's largest value
        assert logp < 1e-6 and (ent is None or ent < 1e-4), c   # the entropy is a difference of two sums: their order shows
        g_tol = 1e-4 if "float32" in c["dtype"] else 1.5e-2     # bf16: dz is rounded to bf16 (one rounding, about 4e-3 relative)
        assert gh < g_tol and gw < g_tol, c
        assert c["ignored_logp"] == 0.0
    assert max(out["entropy_only_rel"]) < 1e-5 and max(out["logp_sum_rel"]) < 1e-5, out
    assert "Fix: --learner.logprob_kernel=torch" in out["float64"], out["float64"]
    assert 1.5 <= out["backward_bytes_per_chunk_entry"] <= 2.5, out["backward_bytes_per_chunk_entry"]   # one bf16 [chunk, V] buffer
    assert max(out["module_rel"]) < 1e-5, out["module_rel"]


def test_logprob_head_bench_smoke(child):
    "bench/logprob_head.py --smoke, run as `__main__` in the checks' child process: it exits 0 and writes both records."
    p, out = child
    assert p.returncode == 0 and "BENCH_EXIT 0" in p.stdout.splitlines(), p.stdout[-2000:] + p.stderr[-3000:]
    recs = json.loads(out.read_text())["records"]
    assert [r["with_entropy"] for r in recs] == [False, True]
    for r in recs:
        assert set(r["kernels"]) == {"torch", "triton"} and all(set(k["step_s"]) == {"mean", "median", "p90"} for k in r["kernels"].values())
        assert r["max_abs_diff_triton_vs_torch"]["logp"] < 1e-5
