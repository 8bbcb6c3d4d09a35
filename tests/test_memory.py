"""The memory planner: exact parameter counts, exact KV bytes per token, term arithmetic on
hand-computed cases, phases, the verdict search, and the `grpo_nb plan` command's JSON keys and exit codes."""
import contextlib, io, json, math
import pytest
from grpo_nb.results import accuracy_table
from grpo_nb.memory import (ARCHS, PUBLISHED, ModelShape, ZeroKnobs, Overheads, param_counts, layer_modules, get_shape,
                            matches_published, weights_bytes, optimizer_bytes, grads_bytes, buffers_bytes, step_transient_bytes,
                            layer_activation_bytes, activations_bytes, logits_bytes, zero3_gathered, learner_memory,
                            kv_bytes_per_token, engine_memory, min_learner_gpus, min_engine_tp, plan, plan_cli, plan_config, TERMS)

TOY = ModelShape("toy", "qwen2", hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=32,
                 tie_word_embeddings=True, attention_bias=True)


# ---------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("name", list(ARCHS))
def test_counts_match_published_sizes(name):
    assert matches_published(param_counts(ARCHS[name])["total"], PUBLISHED[name][0])


@pytest.mark.parametrize("name,total,non_emb", [
    ("Qwen2.5-7B", 7_615_616_512, 6_525_621_760), ("Llama-3.1-8B", 8_030_261_248, 6_979_588_096),
    ("Qwen3-0.6B", 596_049_920, 440_467_456), ("OLMo-2-32B", 32_234_279_936, 31_206_675_456)])
def test_exact_counts(name, total, non_emb):
    c = param_counts(ARCHS[name])
    assert (c["total"], c["non_embedding"]) == (total, non_emb)


def test_toy_count_by_hand():
    # layer: q 8·8+8, k 8·4+4, v 8·4+4, o 8·8, mlp 3·8·16, norms 2·8 ; model: embed 32·8 (tied) + 2 layers + final norm 8
    layer = (64 + 8) + (32 + 4) + (32 + 4) + 64 + 384 + 16
    assert param_counts(TOY)["total"] == 256 + 2 * layer + 8


# (the exact check against transformers' own modules, built on the meta device, runs in nbs/01_memory.ipynb:
#  importing transformers here would cost most of this file's time budget)


def test_shape_from_config_json(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
           "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for arg in (tmp_path, tmp_path / "config.json"):
        s = get_shape(str(arg))
        assert (s.head_dim, s.attention_bias) == (64, True)
        assert param_counts(s)["total"] == param_counts(ARCHS["Qwen2.5-0.5B"])["total"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": {**cfg, "model_type": "qwen2"}}))
    assert get_shape(str(tmp_path)).hidden == 896
    with pytest.raises(ValueError, match="built-in names"): get_shape("no-such-model")
    assert get_shape("meta-llama/Llama-3.1-8B-Instruct") is ARCHS["Llama-3.1-8B"]


# ---------------------------------------------------------------- KV cache
@pytest.mark.parametrize("name,tp,expected", [
    ("Qwen2.5-7B", 1, 2 * 28 * 4 * 128 * 2), ("Qwen2.5-7B", 2, 2 * 28 * 2 * 128 * 2), ("Qwen2.5-7B", 4, 2 * 28 * 1 * 128 * 2),
    ("Llama-3.1-70B", 8, 2 * 80 * 1 * 128 * 2), ("OLMo-2-7B", 1, 2 * 32 * 32 * 128 * 2),
    ("Qwen2.5-0.5B", 2, 2 * 24 * 1 * 64 * 2), ("Qwen2.5-0.5B", 14, 2 * 24 * 1 * 64 * 2)])  # kv_heads=2 < TP: replicated
def test_kv_bytes_per_token_exact(name, tp, expected):
    assert kv_bytes_per_token(ARCHS[name], tp) == expected
    assert kv_bytes_per_token(ARCHS[name], tp, dtype_bytes=1) == expected // 2


def test_invalid_tp_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid TP: 1, 2, 4"): kv_bytes_per_token(ARCHS["Qwen2.5-7B"], 3)


def test_engine_budget_arithmetic():
    e = engine_memory("Qwen2.5-7B", tp=2, gpu_memory_utilization=0.8, gpu_mem_gib=80, seq_len=1000)
    assert e.budget_bytes == int(0.8 * 80 * 2**30)
    assert e.kv_cache_bytes == e.budget_bytes - e.weights_bytes - e.activation_bytes - e.overhead_bytes
    assert e.max_tokens % 16 == 0 and e.max_tokens == e.kv_cache_bytes // e.kv_bytes_per_token // 16 * 16
    assert e.tokens_per_seq == 1008 and e.max_concurrent_seqs == min(256, e.max_tokens // 1008)
    tight = engine_memory("Qwen2.5-72B", tp=1, gpu_memory_utilization=0.9, gpu_mem_gib=80)
    assert not tight.fits and tight.kv_cache_bytes == 0


# ---------------------------------------------------------------- learner terms by hand
def test_state_terms_by_hand():
    P, N = 1000, 4
    assert [weights_bytes(P, z, N) for z in range(4)] == [2000, 2000, 2000, 500]
    assert weights_bytes(P, 3, N, persistent=10) == 520 and weights_bytes(P, 3, N, "all") == 0
    assert [optimizer_bytes(P, z, N) for z in range(4)] == [12000, 3000, 3000, 3000]
    assert optimizer_bytes(P, 3, N, "optimizer") == 0
    assert optimizer_bytes(P, 3, N, optimizer="adamw-8bit") == int(250 * (4 + 2 + 8 / 256))
    assert [grads_bytes(P, z, N) for z in range(4)] == [2000, 6000, 500, 500]
    assert [step_transient_bytes(P, z, N) for z in range(4)] == [4000, 0, 1500, 1500]
    k = ZeroKnobs(reduce_bucket_size=100)
    assert [buffers_bytes(P, z, N, k) for z in range(4)] == [2000, 4000, 200, 400]
    assert buffers_bytes(P, 0, 1, k) == 0


def test_activation_terms_by_hand():
    h, q, kv, i, a = 8, 8, 4, 16, 2
    per = 16 * h + 4 * q + 4 * kv + 8 * i + 4 * a + 8
    assert layer_activation_bytes(TOY, 10) == per
    assert layer_activation_bytes(TOY, 10, "eager") == 16 * h + 8 * q + 8 * i + 8 + 6 * a * 10   # repeated KV heads, o_proj's copy; no lse
    no = activations_bytes(TOY, tokens=6, seq_len=3, grad_ckpt=False)
    assert no["saved"] == 6 * (2 * per + 8 * h) and no["working"] == 6 * (6 * i + 4 * h)
    ck = activations_bytes(TOY, tokens=6, seq_len=3, grad_ckpt=True)
    assert ck["saved"] == 6 * (2 * 2 * h + 8 * h) and ck["working"] == 6 * (6 * i + 4 * h + per)


def test_logits_terms_by_hand():
    assert logits_bytes(10, 100, 4, "full") == 10 * 100 * 12
    assert logits_bytes(10, 100, 4, "full", keep_logits=True) == 10 * 100 * 14
    assert logits_bytes(10, 100, 4, "chunked", chunk=4) == 8 * 4 * 100 + 6 * 100 * 4 + 2 * 10 * 4
    assert logits_bytes(10, 100, 4, "chunked", chunk=64) == logits_bytes(10, 100, 4, "chunked", chunk=10)
    assert logits_bytes(10, 100, 4, "chunked-triton", chunk=4) == 2 * 4 * 100 + 6 * 100 * 4 + 2 * 10 * 4   # one bf16 [chunk, V] buffer
    with pytest.raises(ValueError): logits_bytes(10, 100, 4, "half")


def test_zero3_reuse_distance():
    s = ARCHS["Qwen2.5-0.5B"]
    P = param_counts(s)["total"]
    assert zero3_gathered(s)["loss"] > 0.7 * P  # a small model stays mostly gathered from forward to backward
    small = zero3_gathered(s, knobs=ZeroKnobs(stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0))
    assert small["loss"] <= s.vocab * s.hidden  # nothing kept: only the module being computed


def test_learner_terms_sum_to_peak_and_zero0_is_20_bytes():
    for kw in [dict(zero=0), dict(zero=2, learners=4), dict(zero=3, learners=8, grad_ckpt=False, logits="full"),
               dict(zero=3, learners=2, offload="all", ref_policy="gpu")]:
        m = learner_memory("Qwen2.5-1.5B", micro_batch=2, seq_len=1024, **kw)
        assert sum(getattr(m, k) for k in TERMS) == m.peak_bytes
        assert m.peak_bytes == max(sum(v.values()) for v in m.phases.values())
    m = learner_memory("Qwen2.5-0.5B", zero=0, micro_batch=1, seq_len=16, overheads=Overheads(fixed_bytes=0))
    assert (m.peak_phase, m.peak_bytes) == ("step", 20 * param_counts(ARCHS["Qwen2.5-0.5B"])["total"])


def test_more_learners_never_need_more_memory():
    peaks = [learner_memory("Qwen2.5-14B", learners=n, zero=3, seq_len=4096).peak_bytes for n in (1, 2, 4, 8, 16, 64)]
    assert peaks == sorted(peaks, reverse=True)


def test_offload_and_bad_combinations():
    on, off = (learner_memory("Qwen2.5-7B", learners=4, zero=3, offload=o) for o in ("none", "optimizer"))
    assert off.optimizer_bytes == 0 and off.host_bytes > 0 and off.peak_bytes < on.peak_bytes
    with pytest.raises(ValueError, match="ZeRO stage 2 or 3"): learner_memory("Qwen2.5-7B", zero=1, offload="optimizer")
    with pytest.raises(ValueError, match="needs ZeRO-3"): learner_memory("Qwen2.5-7B", zero=2, offload="all")


def test_min_learners_and_tp_are_minimal():
    kw = dict(micro_batch=1, seq_len=4096)
    n = min_learner_gpus("Qwen2.5-32B", gpu_mem_gib=80, **kw)
    fits = lambda n: learner_memory("Qwen2.5-32B", learners=n, zero=3, **kw).total_bytes <= 80 * 2**30
    assert n > 1 and fits(n) and not fits(n - 1)
    tp = min_engine_tp("Llama-3.1-70B", gpu_mem_gib=80, seq_len=4096)
    assert tp == 2 and not engine_memory("Llama-3.1-70B", tp=1, gpu_mem_gib=80, seq_len=4096).fits


def test_verdict_and_advice():
    p = plan("Qwen2.5-72B", learners=2, zero=3, micro_batch=1, seq_len=8192, engine_tp=1, gpu_mem_gib=80)
    assert not p.fits and not p.learner_fits and not p.engine_fits
    assert any(a.startswith("--learner-gpus") for a in p.advice) and any(a.startswith("--engine-tp") for a in p.advice)
    ok = plan("Qwen2.5-0.5B", learners=1, micro_batch=1, seq_len=1024)
    assert ok.fits and ok.advice[0].startswith("fits")


def test_plan_config_reads_train_config():
    from grpo_nb.config import load_config
    cfg = load_config("default", ["--model.name_or_path=Qwen2.5-1.5B", "--learner.pack_length=8192", "--cluster.learners_per_node=[2,2]",
                                  "--cluster.nodes=2"])
    p = plan_config(cfg)
    assert (p.settings["learners"], p.settings["micro_batch"], p.settings["seq_len"]) == (4, 1, 8192)
    assert p.settings["engine_seq_len"] == cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    assert plan_config(load_config("default")).fits   # a built-in tiny policy is planned from its config, without building it
    with pytest.raises(ValueError, match="model.name_or_path"): plan_config(load_config("default", ["--model.name_or_path=no-such-model"]))


def test_plan_config_follows_the_logprob_kernel():
    from grpo_nb.config import load_config
    base = ["--model.name_or_path=Qwen2.5-1.5B", "--learner.pack_length=8192", "--learner.logprob_chunk=2048", "--cluster.device=cuda"]
    loop, fused = (plan_config(load_config("default", [*base, f"--learner.logprob_kernel={k}"])) for k in ("torch", "triton"))
    assert (loop.settings["logits"], fused.settings["logits"]) == ("chunked", "chunked-triton")
    assert loop.learner.phases["loss"]["logits_bytes"] - fused.learner.phases["loss"]["logits_bytes"] == 6 * 2048 * 151936
    cpu = plan_config(load_config("default", [*base[:-1], "--cluster.device=cpu"]))   # auto on a CPU learner: the loop
    assert cpu.settings["logits"] == "chunked"


# ---------------------------------------------------------------- the command
def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = plan_cli(argv)
    return rc, out.getvalue(), err.getvalue()


def test_cli_json_keys():
    rc, out, _ = run(["--model", "Qwen2.5-7B", "--learner-gpus", "8", "--zero", "3", "--offload", "none", "--micro-batch", "2",
                      "--seq-len", "4096", "--grad-ckpt", "--engine-tp", "2", "--gpu-memory-utilization", "0.85", "--gpu-mem-gib", "80", "--json"])
    j = json.loads(out)
    assert rc == 0
    assert {"params", "layers", "hidden", "vocab", "kv_heads", "head_dim"} <= set(j["model"])
    assert {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes", "gathered_params_bytes",
            "peak_bytes"} <= set(j["learner"])
    assert {"weights_bytes", "kv_bytes_per_token", "kv_cache_bytes", "max_concurrent_seqs"} <= set(j["engine"])
    assert isinstance(j["fits"], bool) and isinstance(j["advice"], list)
    assert j["engine"]["kv_bytes_per_token"] == 2 * 28 * 2 * 128 * 2
    assert j["model"]["params"] == 7_615_616_512


def test_cli_exit_codes():
    rc, out, _ = run(["--model", "Qwen2.5-72B", "--learner-gpus", "1", "--json"])  # does not fit: still a plan, exit 0
    assert rc == 0 and json.loads(out)["fits"] is False and json.loads(out)["advice"]
    rc, out, _ = run(["--model", "Qwen2.5-7B", "--no-grad-ckpt"])
    assert rc == 0 and "checkpointing off" in out
    for argv, text in [(["--model", "nope"], "built-in names"), (["--model", "Qwen2.5-7B", "--engine-tp", "3"], "valid TP"),
                       (["--model", "Qwen2.5-7B", "--zero", "1", "--offload", "optimizer"], "ZeRO stage 2 or 3"),
                       ([], "--model is required")]:
        rc, _, err = run(argv)
        assert rc == 2 and text in err, (argv, err)
    rc, _, _ = run(["--model", "Qwen2.5-7B", "--zero", "5"])  # argparse's own usage error
    assert rc == 2
    assert run(["--help"])[0] == 0


def test_cli_router_reaches_plan():
    from grpo_nb.cli import main
    with contextlib.redirect_stdout(io.StringIO()) as out: rc = main(["plan", "--model", "Qwen3-8B", "--json"])
    assert rc == 0 and json.loads(out.getvalue())["model"]["layers"] == 36


def test_accuracy_table(tmp_path):
    assert "no measurements yet" in accuracy_table(tmp_path / "missing.json")
    rec = {"name": "x", "learners": 1, "zero": 3, "micro_batch": 2, "seq_len": 128, "grad_ckpt": True, "logits": "full",
           "predicted_bytes": 110 * 2**20, "measured_bytes": 100 * 2**20, "error": 0.1, "device": "NVIDIA H200",
           "predicted_phase": "loss", "steps": [{"fwd_bwd_peak": 100 * 2**20, "step_peak": 90 * 2**20}]}
    (tmp_path / "r.json").write_text(json.dumps({"meta": {}, "records": [rec]}))
    t = accuracy_table(tmp_path / "r.json")
    assert "+10.0%" in t and "NVIDIA H200" in t and "1 within 10%" in t


def test_score_head_is_one_model_for_both_seed002_tables():
    """Seed 002's reward model: `learner_memory(head="score")` is what `classifier_memory` reports (its numbers are
    pinned: the activation count of autograd's saved tensors, page 01), and the LM head would predict more."""
    from grpo_nb.memory import learner_memory
    from grpo_nb.reward_model import classifier_memory, seed_table
    pinned = {(4, 2, 3): (24157373440, 28183723520, "step"), (8, 2, 2): (19664159360, 23241188032, "backward_end")}
    for (n, p, z), want in pinned.items():
        m = classifier_memory("Qwen3-4B", gpus=n, micro_batch_pairs=p, seq_len=2048, zero=z)
        s = learner_memory("Qwen3-4B", learners=n, zero=z, micro_batch=2 * p, seq_len=2048, head="score")
        assert (m["peak_bytes"], m["total_bytes"], m["peak_phase"]) == want == (s.peak_bytes, s.total_bytes, s.peak_phase)
        lm = learner_memory("Qwen3-4B", learners=n, zero=z, micro_batch=2 * p, seq_len=2048)
        assert lm.total_bytes >= s.total_bytes and lm.phases["loss"]["logits_bytes"] > 10 * s.phases["loss"]["logits_bytes"]
    for r in seed_table("Qwen3-4B", 2048, 24.0):
        s = learner_memory("Qwen3-4B", learners=r["gpus"], zero=3, micro_batch=2 * r["micro_batch_pairs"], seq_len=2048, head="score")
        assert abs(s.total_bytes / 2**30 - r["total_gib"]) < 1e-9
    with pytest.raises(ValueError, match="head must be"): learner_memory("Qwen3-4B", head="value")


def test_the_planners_sync_bucket_is_the_syncs():
    "The planner counts the weight sync's receive buffers by the bucket the sync uses."
    from grpo_nb.memory import SYNC_BUCKET_BYTES
    from grpo_nb.weight_sync import DEFAULT_BUCKET_BYTES
    assert SYNC_BUCKET_BYTES == DEFAULT_BUCKET_BYTES


def test_config_plan_names_the_longest_pack_that_fits():
    base = ["--config", "default", "--model.name_or_path=Qwen2.5-0.5B", "--cluster.device=cuda", "--cluster.gpus_per_node=1",
            "--cluster.learners_per_node=[1]", "--rollout.placement=colocated", "--rollout.gpu_memory_utilization=0.3",
            "--learner.zero_stage=0", "--learner.micro_batch_size=64"]
    rc, out, _ = run(base + ["--learner.pack_length=8192", "--json"])
    m = json.loads(out)["micro_batches"]
    assert rc == 0 and m["pack_length"] == 8192 and m["per_step"] > m["per_step_at_longest"] == 1 and m["longest_pack"] % 1024 == 0
    rc, out, _ = run(base + ["--learner.pack_length=8192"])
    assert f"--learner.pack_length={m['longest_pack']} still fits" in out   # the text names the flag to pass
    rc, out, _ = run(base + [f"--learner.pack_length={m['longest_pack']}"])
    assert rc == 0 and "still fits and runs" not in out   # already the longest: no pack to suggest (the engine's sleep has its own line)
    rc, out, _ = run(["--config", "demo", "--json"])
    assert "micro_batches" not in json.loads(out)   # CPU runs: no GPU to fill


def test_memory_accuracy_repredict_keeps_the_measured_prediction(tmp_path):
    "bench/memory_accuracy.py --repredict: today's planner in predicted_bytes, the prediction the run had kept, measurements untouched."
    import shutil, subprocess, sys
    from pathlib import Path
    ROOT = Path(__file__).resolve().parents[1]
    f = tmp_path / "memory_accuracy.json"
    shutil.copy(ROOT / "bench/results/memory_accuracy.json", f)
    d = json.loads(f.read_text())
    r = next(r for r in d["records"] if r.get("measured_bytes"))
    r.pop("predicted_bytes_recorded", None); r["predicted_bytes"] = 123; f.write_text(json.dumps(d))
    subprocess.run([sys.executable, str(ROOT / "bench/memory_accuracy.py"), "--repredict", "--out", str(f)], check=True, capture_output=True)
    new = next(x for x in json.loads(f.read_text())["records"] if x["name"] == r["name"])
    want = learner_memory(r["model"], **{k: r[k] for k in ("learners", "zero", "micro_batch", "seq_len", "grad_ckpt", "logits", "logprob_chunk", "attn")})
    assert (new["predicted_bytes"], new["predicted_bytes_recorded"], new["measured_bytes"]) == (want.peak_bytes, 123, r["measured_bytes"])
