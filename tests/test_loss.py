"""The GRPO objective: hand-computed cases and properties of advantages, clipping, aggregation,
micro-batching across ranks, and the chunked log-probs (float64 gradcheck, equality with the naive path,
no [N, V] tensor ever allocated)."""
import importlib.util, json, math
from pathlib import Path
from typing import get_args, get_type_hints

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_nb.config import LearnerConfig
from grpo_nb.loss import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, agg_counts, clipped_pg, entropy_from_logits,
                          group_advantages, kl_penalty, loss_kwargs, policy_loss, tis_weights, token_logprobs,
                          token_logprobs_naive, zero_variance_groups)

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
F64 = torch.float64


# ---------------------------------------------------------------- advantages
@st.composite
def grouped_rewards(draw):
    P, G = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    vals = draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0, 0.1, 0.3, 2.5]), min_size=P * G, max_size=P * G))
    return torch.tensor(vals), G


@FAST
@given(grouped_rewards(), st.sampled_from(["std", "none", "rloo"]))
def test_advantages_sum_to_zero_in_every_group(rg, scale):
    r, G = rg
    a = group_advantages(r, G, scale).view(-1, G)
    flat = zero_variance_groups(r, G)
    assert torch.allclose(a.sum(-1), torch.zeros(len(a)), atol=1e-5)
    assert (a[flat] == 0).all()  # exactly zero, not round-off over eps
    rg_ = r.view(-1, G)
    if scale == "std" and (~flat).any():  # unit sample std where the group has any spread
        s = rg_.std(-1)
        assert torch.allclose(a[~flat].std(-1), (s / (s + 1e-6))[~flat], atol=1e-5)
    if scale == "rloo":  # r_i minus the mean of the others == G/(G-1) (r_i - mean)
        loo = torch.stack([torch.cat([row[:i], row[i + 1:]]).mean() for row in rg_ for i in range(G)]).view(-1, G)
        assert torch.allclose(a, torch.where(flat[:, None], 0.0, rg_ - loo), atol=1e-6)


def test_advantages_by_hand_and_errors():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.allclose(group_advantages(r, 4), torch.tensor([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]), atol=1e-5)
    assert torch.allclose(group_advantages(r, 4, "none")[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    assert zero_variance_groups(r, 4).tolist() == [False, True]
    assert zero_variance_groups(r, 4, per="sequence").tolist() == [False] * 4 + [True] * 4
    assert group_advantages(r.double(), 4).dtype == F64
    with pytest.raises(ValueError, match="groups of G=3"): group_advantages(r, 3)
    with pytest.raises(ValueError, match="reshape"): group_advantages(r.view(2, 4), 4)
    with pytest.raises(ValueError, match="--learner.advantage="): group_advantages(r, 4, "grpo")


# ---------------------------------------------------------------- clipping
@FAST
@given(st.integers(0, 10_000), st.integers(1, 40), st.floats(0.05, 0.5), st.floats(0.05, 0.5),
       st.one_of(st.none(), st.floats(1.5, 4.0)))
def test_clipped_regions_have_zero_gradient(seed, n, clip_low, clip_high, dual):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(1, n, generator=g, dtype=F64) * 3
    logp = (old + torch.randn(1, n, generator=g, dtype=F64) * 0.6).requires_grad_()  # ratios ~ e^N(0, 0.6²)
    adv = torch.randn(1, n, generator=g, dtype=F64)
    loss, m = policy_loss(logp, old, adv, torch.ones(1, n), clip_low, clip_high, dual_clip=dual)
    loss.backward()
    rho, A = (logp - old).exp().detach(), adv
    cut = ((A > 0) & (rho > 1 + clip_high)) | ((A < 0) & (rho < 1 - clip_low))
    if dual is not None: cut |= (A < 0) & (rho > dual)
    assert (logp.grad[cut] == 0).all()
    assert torch.allclose(logp.grad[~cut], (-A * rho / n)[~cut])  # d(-Aρ)/dlogp = -Aρ, token-mean weight 1/n
    assert math.isclose(m["clip_frac"].item(), cut.double().mean().item(), abs_tol=1e-6)
    assert math.isclose(m["clip_frac_high"].item(), ((A > 0) & (rho > 1 + clip_high)).double().mean().item(), abs_tol=1e-6)


def test_policy_loss_by_hand():
    old = torch.log(torch.tensor([[0.2, 0.4, 0.1]]))
    logp = (old + torch.log(torch.tensor([[0.5, 1.0, 2.0]]))).requires_grad_()
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3))
    loss.backward()
    assert math.isclose(loss.item(), -(0.5 + 1.0 + 1.28) / 3, rel_tol=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([[-0.5 / 3, -1.0 / 3, 0.0]]))
    assert math.isclose(m["clip_frac_high"].item(), 1 / 3, rel_tol=1e-6) and m["clip_frac_low"].item() == 0
    assert math.isclose(m["ratio_max"].item(), 2.0, rel_tol=1e-6) and m["tokens"].item() == 3
    # negative advantage: ratio 0.5 is clipped at 0.8 (no gradient), ratio 5 is capped by the dual clip at 3
    x = torch.tensor([0.5, 1.5, 0.5, 1.5, 5.0], requires_grad=True)
    clipped_pg(x, torch.tensor([1.0, 1, -1, -1, -1]), dual_clip=3.0).sum().backward()
    assert x.grad.tolist() == [-1.0, 0.0, 0.0, 1.0, 0.0]
    assert clipped_pg(torch.tensor(5.0), torch.tensor(-1.0), dual_clip=3.0).item() == 3.0


def test_masked_garbage_does_not_leak():
    logp = torch.tensor([[-1.0, float("inf")], [-2.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.1, -50.0], [-2.0, 0.0]])
    loss, m = policy_loss(logp, old, torch.tensor([1.0, -1.0]), torch.tensor([[1, 0], [1, 0]]), rollout_logp=old,
                          ref_logp=old, kl_beta=0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and (logp.grad[:, 1] == 0).all()
    assert all(torch.isfinite(v) for v in m.values())


def test_kl_tis_entropy_terms_by_hand():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref, eng = torch.tensor([[-2.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    ent = torch.tensor([[0.3, 0.9]], requires_grad=True)
    loss, m = policy_loss(logp, None, torch.tensor([2.0]), torch.ones(1, 2), rollout_logp=eng, tis_cap=1.2,
                          ref_logp=ref, kl="k1", kl_beta=0.5, entropy=ent, entropy_coef=0.1)
    w = torch.tensor([min(math.exp(0.5), 1.2), math.exp(-1.0)])  # min(π_old/π_engine, cap); old = logp (ratio 1)
    expect = ((-2.0 * w) + 0.5 * torch.tensor([1.0, 0.0]) - 0.1 * torch.tensor([0.3, 0.9])).mean()
    assert math.isclose(loss.item(), expect.item(), rel_tol=1e-6)
    assert math.isclose(m["kl"].item(), 0.5, rel_tol=1e-6) and math.isclose(m["entropy"].item(), 0.6, rel_tol=1e-6)
    assert math.isclose(m["tis_clip_frac"].item(), 0.5) and math.isclose(m["tis_weight_mean"].item(), w.mean().item(), rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(ent.grad, torch.tensor([[-0.05, -0.05]]))
    assert torch.allclose(tis_weights(torch.tensor([0.0]), torch.tensor([-5.0]), None), torch.tensor([math.exp(5)]))
    assert torch.allclose(kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0]), "k2"), torch.tensor([0.5]))
    assert torch.allclose(kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0]), "k3"), torch.tensor([math.exp(-1)]))
    with pytest.raises(ValueError, match="needs ref_logp"): policy_loss(logp, None, torch.ones(1), torch.ones(1, 2), kl_beta=0.1)
    with pytest.raises(ValueError, match="with_entropy=True"): policy_loss(logp, None, torch.ones(1), torch.ones(1, 2), entropy_coef=0.1)
    with pytest.raises(ValueError, match="--learner.agg="): policy_loss(logp, None, torch.ones(1), torch.ones(1, 2), agg="mean")
    with pytest.raises(ValueError, match="--learner.kl="): kl_penalty(logp, ref, "k4")


# ---------------------------------------------------------------- aggregation and micro-batching
@st.composite
def batches(draw):
    B, T = draw(st.integers(2, 7)), draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    return B, T, lengths, draw(st.integers(0, 10_000))


def _batch(B, T, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T) < torch.tensor(lengths)[:, None]).float()
    r = lambda: torch.randn(B, T, generator=g, dtype=F64) * 0.4 - 1.0
    return mask, r(), r(), torch.randn(B, generator=g, dtype=F64), r(), r(), torch.rand(B, T, generator=g, dtype=F64)


@FAST
@given(batches(), st.sampled_from(sorted(AGGREGATIONS)), st.integers(0, 10_000), st.booleans(), st.integers(1, 2))
def test_microbatches_and_ranks_reproduce_full_batch_gradient(batch, agg, split_seed, extras, world):
    B, T, lengths, seed = batch
    mask, logp0, old, adv, ref, eng, ent0 = _batch(B, T, lengths, seed)

    def grads(rows, **more):
        x, e = logp0.clone().requires_grad_(), ent0.clone().requires_grad_()
        kw = dict(rollout_logp=eng[rows], ref_logp=ref[rows], kl_beta=0.3, entropy_coef=0.05) if extras else {}
        loss, _ = policy_loss(x[rows], old[rows], adv[rows], mask[rows], agg=agg, entropy=e[rows], **kw, **more)
        loss.backward()
        ge = torch.zeros_like(e) if e.grad is None else e.grad  # no entropy term without entropy_coef
        return torch.cat([x.grad.flatten(), ge.flatten()]), loss.detach()

    g_full, l_full = grads(list(range(B)))
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(split_seed)).tolist()
    cuts = sorted(set(torch.randint(1, B, (2,), generator=torch.Generator().manual_seed(split_seed + 1)).tolist()))
    parts = [p for p in (perm[a:b] for a, b in zip([0, *cuts], [*cuts, B])) if p]  # micro-batches, any order
    ranks = [parts[r::world] for r in range(world)]  # micro-batches dealt out to `world` simulated ranks
    N, S = sum(agg_counts(mask[p]) for p in parts).tolist()  # all-reduce of the per-micro-batch counts
    total_g, total_l = torch.zeros_like(g_full), 0.0
    for rank in ranks:  # each rank accumulates its micro-batches; the ranks' gradients are summed
        for p in rank:
            g, l = grads(p, num_tokens=N, num_seqs=S, norm_len=T)
            total_g, total_l = total_g + g, total_l + l
    assert torch.allclose(total_g, g_full, atol=1e-12, rtol=1e-10)
    assert torch.allclose(total_l, l_full, atol=1e-12, rtol=1e-10)


@FAST
@given(batches(), st.sampled_from(sorted(AGGREGATIONS)))
def test_packed_equals_padded(batch, agg):
    B, T, lengths, seed = batch
    mask, logp, old, adv, *_ = _batch(B, T, lengths, seed)
    padded, _ = policy_loss(logp, old, adv, mask, agg=agg)
    keep = mask.bool()  # pack the response tokens of all sequences into one row, plus two padding tokens
    ids = torch.arange(B)[:, None].expand(B, T)[keep]
    cat = lambda x, fill: torch.cat([x, torch.full((2,), fill, dtype=x.dtype)])[None]
    packed, _ = policy_loss(cat(logp[keep], 0.0), cat(old[keep], 0.0), cat(adv[:, None].expand(B, T)[keep], 9.0),
                            cat(mask[keep], 0.0), agg=agg, seq_ids=cat(ids, -1), norm_len=T)
    assert torch.allclose(packed, padded, atol=1e-12)


@FAST
@given(batches())
def test_aggregation_modes_differ_exactly_as_derived(batch):
    B, T, lengths, seed = batch
    mask, logp, old, adv, *_ = _batch(B, T, lengths, seed)
    L = {a: policy_loss(logp, old, adv, mask, agg=a, norm_len=T)[0].item() for a in AGGREGATIONS}
    tok = clipped_pg((logp - old).exp(), adv[:, None]) * mask  # per-token losses [B, T]
    n = mask.to(F64).sum(-1)
    N, S = n.sum().item(), (n > 0).sum().item()
    if N == 0:
        assert all(v == 0 for v in L.values()); return
    seq_means = (tok.sum(-1) / n.clamp(min=1))[n > 0]
    assert math.isclose(L["token-mean"], tok.sum().item() / N, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(L["token-mean"], ((n[n > 0] / N) * seq_means).sum().item(), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(L["seq-mean-token-mean"], seq_means.mean().item(), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(L["seq-mean-token-sum-norm"], L["token-mean"] * N / (S * T), rel_tol=1e-9, abs_tol=1e-12)
    if len(set(n[n > 0].tolist())) == 1:  # equal lengths: token-mean == seq-mean
        assert math.isclose(L["seq-mean-token-mean"], L["token-mean"], rel_tol=1e-9, abs_tol=1e-12)


def test_sum_norm_packed_needs_constant():
    with pytest.raises(ValueError, match="norm_len="):
        policy_loss(torch.zeros(3), None, torch.ones(3), torch.ones(3), agg="seq-mean-token-sum-norm", seq_ids=torch.tensor([0, 0, 1]))


# ---------------------------------------------------------------- chunked log-probs
def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 4, generator=g, dtype=F64, requires_grad=True)
    W = torch.randn(7, 4, generator=g, dtype=F64, requires_grad=True)
    y = torch.tensor([3, -100, 0, 6, 2])
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, y, chunk=2, temperature=1.3, with_entropy=True), (h, W))
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, y.clamp(min=0), chunk=3), (h, W))


@FAST
@given(st.integers(1, 40), st.integers(1, 16), st.sampled_from([0.6, 1.0, 1.7]), st.booleans(), st.booleans(), st.integers(0, 999))
def test_chunked_equals_naive_float64(n, chunk, tau, with_entropy, three_d, seed):
    g = torch.Generator().manual_seed(seed)
    V, H = 23, 8
    h = torch.randn(n, H, generator=g, dtype=F64).requires_grad_()
    W = torch.randn(V, H, generator=g, dtype=F64).requires_grad_()
    y = torch.randint(-1, V, (n,), generator=g)  # -1: ignored positions
    gl, ge = torch.randn(n, generator=g, dtype=F64), torch.randn(n, generator=g, dtype=F64)
    shape = (1, n) if three_d else (n,)
    out = []
    for f in (lambda: token_logprobs(h.view(*shape, H), W, y.view(shape), chunk=chunk, temperature=tau, with_entropy=with_entropy),
              lambda: token_logprobs_naive(h.view(*shape, H), W, y.view(shape), temperature=tau, with_entropy=with_entropy)):
        h.grad = W.grad = None
        r = f()
        lp, en = r if with_entropy else (r, torch.zeros_like(r))
        assert lp.shape == shape
        ((lp.view(-1) * gl).sum() + (en.view(-1) * ge).sum()).backward()
        out.append((lp.detach(), en.detach(), h.grad.clone(), W.grad.clone()))
    for a, b in zip(*out): assert torch.allclose(a, b, atol=1e-10, rtol=1e-9)
    assert (out[0][0].view(-1)[y < 0] == 0).all()


def test_bf16_matches_naive_with_fp32_outputs():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 32, generator=g).bfloat16().requires_grad_()
    W = (torch.randn(300, 32, generator=g) / 6).bfloat16().requires_grad_()
    y = torch.randint(0, 300, (64,), generator=g)
    lp, en = token_logprobs(h, W, y, chunk=10, with_entropy=True)
    assert lp.dtype == en.dtype == torch.float32
    lp.sum().backward(); gh, gw = h.grad.float(), W.grad.float()
    h.grad = W.grad = None
    ln, enn = token_logprobs_naive(h, W, y, with_entropy=True); ln.sum().backward()
    assert torch.allclose(lp, ln, atol=1e-4) and torch.allclose(en, enn, atol=1e-4)
    assert h.grad.dtype == W.grad.dtype == torch.bfloat16
    assert (gh - h.grad.float()).norm() / h.grad.float().norm() < 1e-2
    assert (gw - W.grad.float()).norm() / W.grad.float().norm() < 1e-2
    assert torch.allclose(entropy_from_logits(torch.zeros(3, 8)), torch.full((3,), math.log(8)))


class LargestTensor(TorchDispatchMode):
    "Records the largest number of elements of any tensor an op returns."
    def __init__(self): super().__init__(); self.largest = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor): self.largest = max(self.largest, t.numel())
        return out


def test_chunked_never_allocates_the_full_logits():
    N, V, H, chunk = 256, 500, 8, 32
    h = torch.randn(N, H, requires_grad=True); W = torch.randn(V, H, requires_grad=True)
    y = torch.randint(0, V, (N,))
    for f, bound in ((lambda: token_logprobs(h, W, y, chunk=chunk, with_entropy=True), chunk * V),
                     (lambda: token_logprobs_naive(h, W, y, with_entropy=True), None)):
        with LargestTensor() as mode:
            lp, en = f(); (lp.sum() + en.sum()).backward()
        if bound: assert mode.largest <= max(bound, V * H), mode.largest  # one [chunk, V] buffer or the [V, H] gradient
        else: assert mode.largest >= N * V  # the naive path does hold [N, V]


def test_token_logprobs_input_errors():
    with pytest.raises(ValueError, match="leading dims"): token_logprobs(torch.randn(4, 3), torch.randn(5, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[V, H\]"): token_logprobs(torch.randn(4, 3), torch.randn(5, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature > 0"): token_logprobs(torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long), temperature=0)


# ---------------------------------------------------------------- configs and the benchmark script
def test_registries_cover_the_config_choices_and_kwargs_map():
    hints = get_type_hints(LearnerConfig)
    for field, reg in (("advantage", ADVANTAGES), ("agg", AGGREGATIONS), ("kl", KL_ESTIMATORS)):
        assert set(get_args(hints[field])) == set(reg), field
    kw = loss_kwargs(LearnerConfig(dual_clip=3.0, agg="seq-mean-token-sum-norm"))
    assert kw["dual_clip"] == 3.0 and kw["agg"] == "seq-mean-token-sum-norm" and kw["tis_cap"] == 2.0
    x = torch.zeros(2, 3, requires_grad=True)
    loss, m = policy_loss(x, None, torch.tensor([1.0, -1.0]), torch.ones(2, 3), **kw)
    assert m["clip_frac"].item() == 0 and math.isclose(loss.item(), 0.0, abs_tol=1e-12)


def test_benchmark_smoke(tmp_path):
    path = Path(__file__).resolve().parents[1] / "bench" / "logprob_memory.py"
    spec = importlib.util.spec_from_file_location("logprob_memory", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    out = tmp_path / "lpm.json"
    assert mod.main(["--smoke", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["smoke"] and len(data["records"]) == 5  # 2 H × 2 N, plus one chunk-size sweep point
    for r in data["records"]:
        assert {"hidden", "tokens", "vocab", "chunk", "naive_extra_bytes", "chunked_extra_bytes", "naive_s", "chunked_s", "device"} <= set(r)
        assert r["chunked_s"] > 0 and (r["max_abs_diff_logp"] < 1e-2 if r["naive_ran"] else r["naive_s"] is None)
