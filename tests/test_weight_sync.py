"""Weight sync without vLLM or Ray: plans and buckets (fused groups can never be split), the wire format, the
side-channel group, the sender's NaN refusal, checksums and the whole protocol between a plain-module learner and a
transformers engine in this process. (ZeRO-3 learners + real vLLM engines, TP=1 and TP=2: test_weight_sync_vllm.py.)"""
import threading
import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import AutoModelForCausalLM, Qwen2Config

from grpo_nb.results import bench_table
from grpo_nb.rollout import HFEngine
from grpo_nb.weight_sync import (NonFiniteWeightsError, SyncPlan, WeightSyncError, WeightSyncSource,
                                 connect_weight_sync, join_group, load_into_module, make_plan, module_checksums,
                                 nonfinite_flags, nonfinite_params, open_store, engine_layout,
                                 pack_bucket, plan_buckets, receive_buckets, send_weights, sequence_logprobs, sync_plan, sync_unit,
                                 sync_weights, tensor_checksum, unpack_bucket, verify_sync, verify_weight_sync)

CFG = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=128, eos_token_id=1, tie_word_embeddings=True)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}   # vLLM's packed modules


def model(seed):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(CFG).float()


def fused_group(name):
    "The vLLM fused parameter a checkpoint tensor is loaded into (layer + fused module), or None."
    for fused, parts in FUSED.items():
        for p in parts:
            if f".{p}." in name: return name.split(f".{p}.")[0] + "." + fused
    return None


# ---- plans and buckets -------------------------------------------------------------------------------------------

param_names = st.builds(lambda l, p: f"model.layers.{l}.{p}.weight" if l >= 0 else f"{p}.weight",
                        st.integers(-1, 6), st.sampled_from(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                             "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                                                             "model.embed_tokens", "lm_head", "model.norm"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(param_names, st.integers(1, 10_000)), min_size=1, max_size=60, unique_by=lambda t: t[0]),
       st.one_of(st.none(), st.integers(1, 30_000)))
def test_no_bucket_can_split_a_fused_group_or_a_layer(sizes, cap):
    buckets = plan_buckets(sizes, cap)
    assert sorted(i for b in buckets for i in b) == list(range(len(sizes)))          # each tensor exactly once
    home = {}
    for k, b in enumerate(buckets):
        for i in b:
            for key in (sync_unit(sizes[i][0]), fused_group(sizes[i][0])):
                if key is not None: assert home.setdefault(key, k) == k, (key, buckets)   # whole layers, whole fused groups
        nb = sum(sizes[i][1] for i in b)
        assert cap is None or nb <= cap or len({sync_unit(sizes[i][0]) for i in b}) == 1  # bound, unless one big unit


def test_plan_of_a_real_model_is_layer_aligned_and_round_trips():
    m = model(0)
    plan = make_plan(m.named_parameters(), bucket_bytes=1)   # the smallest buckets: one unit each
    units = [sorted({sync_unit(s.name) for s in b}) for b in plan.buckets]
    assert units == [["model"], ["model.layers.0"], ["model.layers.1"], ["model.layers.2"]]   # model = embed_tokens + norm
    assert "lm_head.weight" not in {s.name for b in plan.buckets for s in b}            # tied: sent once
    assert plan.total_bytes == sum(p.numel() * 4 for p in m.parameters())
    assert SyncPlan.from_dict(plan.to_dict()) == plan
    assert len(make_plan(m.named_parameters(), None).buckets) == 1
    assert all(s.offset % 64 == 0 for b in plan.buckets for s in b)
    with pytest.raises(ValueError, match="bucket_bytes"): plan_buckets([("a.w", 1)], 0)


def test_pack_unpack_mixed_dtypes_and_size_check():
    ts = [torch.randn(3, 5), torch.arange(7), torch.randn(4).bfloat16(), torch.tensor(2.5)]
    plan = make_plan([(f"m.{i}.w", t) for i, t in enumerate(ts)], None)
    back = unpack_bucket(pack_bucket(ts, plan.buckets[0], plan.bucket_nbytes[0]), plan.buckets[0])
    assert all(torch.equal(t, u) and t.dtype == u.dtype and t.shape == u.shape for t, (_, u) in zip(ts, back))
    with pytest.raises(ValueError, match="make a new plan"):
        pack_bucket([torch.zeros(2)] + ts[1:], plan.buckets[0], plan.bucket_nbytes[0])


# ---- the group, sender and receiver in threads --------------------------------------------------------------------

def run_threads(*fns):
    out, errs = [None] * len(fns), []
    def wrap(i, f):
        try: out[i] = f()
        except BaseException as e: errs.append(e)
    ts = [threading.Thread(target=wrap, args=(i, f)) for i, f in enumerate(fns)]
    for t in ts: t.start()
    for t in ts: t.join(60)
    if errs: raise errs[0]
    return out


def test_send_receive_three_ranks_bit_exact():
    src, dst1, dst2 = model(0), model(1), model(2)
    store = open_store()
    groups = run_threads(*[lambda r=r: join_group("127.0.0.1", store.port, r, 3, "gloo", store=store if r == 0 else None)
                           for r in range(3)])
    plan = make_plan(src.named_parameters(), bucket_bytes=10_000)
    assert len(plan.buckets) > 2
    stats = run_threads(lambda: send_weights(src.named_parameters(), plan, groups[0]),
                        lambda: load_into_module(dst1, receive_buckets(groups[1], plan)),
                        lambda: load_into_module(dst2, receive_buckets(groups[2], plan)))
    assert stats[0]["bytes"] == plan.total_bytes and stats[1] == stats[2] == plan.num_tensors
    want = module_checksums(src.named_parameters())
    assert module_checksums(dst1.named_parameters()) == want == module_checksums(dst2.named_parameters())
    for g in groups: g.close()


def test_load_into_module_is_strict():
    m = model(0)
    with pytest.raises(WeightSyncError, match="no parameter"): load_into_module(m, [("nope.weight", torch.zeros(1))])
    with pytest.raises(WeightSyncError, match="shape"): load_into_module(m, [("model.norm.weight", torch.zeros(3))])
    with pytest.raises(WeightSyncError, match="stale"): load_into_module(m, [("model.norm.weight", torch.ones(32))])


def test_nonfinite_detected_by_name():
    m = model(0)
    assert nonfinite_params(m.named_parameters()) == []
    with torch.no_grad():
        m.model.layers[2].self_attn.v_proj.weight[0, 1] = float("inf"); m.model.norm.weight[5] = float("nan")
    assert nonfinite_params(m.named_parameters()) == ["model.layers.2.self_attn.v_proj.weight", "model.norm.weight"]


def test_nonfinite_flags_mixed_dtypes_empty_and_integer():
    ts = [torch.tensor([1.0, float("-inf")]), torch.empty(0), torch.arange(4), torch.tensor([float("nan")]).bfloat16(),
          torch.ones(3).half(), torch.tensor([2.0, float("nan")]).double()]
    assert nonfinite_flags(ts).tolist() == [True, False, False, True, False, True]


def test_checksum_of_a_misaligned_view():
    buf = torch.randn(11).bfloat16()
    assert tensor_checksum(buf[1:7]) == tensor_checksum(buf[1:7].clone()) != tensor_checksum(buf[2:8])


def test_bench_table_renders_missing_partial_and_failed_runs(tmp_path):
    import json
    assert bench_table(tmp_path / "none.json").startswith("_No results yet")
    (tmp_path / "r.json").write_text(json.dumps({"records": [{"model": "m", "bytes": 3_090_000_000, "floor_s": 0.0118, "gather_s": 0.002,
                                                               "send_s": 0.012, "load_s": 0.002, "total_s": 0.0165, "device": "2x H200"},
                                                              {"model": "m", "bytes": 1, "floor_s": None, "total_s": None}],
                                                  "errors": [{"stage": "floor", "error": "TimeoutError: hung"}]}))
    t = bench_table(tmp_path / "r.json")
    assert "| 1.40 |" in t and "**floor** (transformers) failed: TimeoutError" in t and t.count("\n| transformers | m |") == 2


def test_checksum_sees_one_ulp_and_order():
    a = torch.randn(1000)
    b, c = a.clone(), a.clone()
    b[[1, 2]] = b[[2, 1]]; c[999] = torch.nextafter(c[999], torch.tensor(10.0))
    assert len({tensor_checksum(x) for x in (a, b, c)}) == 3 and tensor_checksum(a) == tensor_checksum(a.clone())
    assert tensor_checksum(torch.arange(3, dtype=torch.uint8)) != tensor_checksum(torch.tensor([0, 2, 1], dtype=torch.uint8))


# ---- the protocol end to end: plain-module learner -> transformers engine ------------------------------------------

class Learner(WeightSyncSource):
    def __init__(self, m): self.model = m


def test_protocol_end_to_end_and_nan_refusal():
    learner, engine = Learner(model(0)), HFEngine(CFG, device="cpu", seed=5)
    info = connect_weight_sync([learner], [engine], tp=1)
    assert info["world_size"] == 2 and info["backend"] == "gloo"
    try:
        with pytest.raises(WeightSyncError, match="differ bit-wise"): verify_weight_sync([learner], [engine])
        with pytest.raises(WeightSyncError, match="log-prob"): verify_weight_sync([learner], [engine], checksums=False)
        stats = sync_weights([learner], [engine], bucket_bytes=30_000, version=3)
        assert stats["buckets"] > 1 and stats["bytes"] == sum(p.numel() * 4 for p in learner.model.parameters())
        rep = verify_weight_sync([learner], [engine], bucket_bytes=30_000)
        assert rep["max_abs_logprob_diff"] <= 1e-4 and "bit-identical" in rep["checksums"]
        # a change the log-probs might miss is still caught by the checksums
        with torch.no_grad(): learner.model.model.layers[1].mlp.down_proj.weight[0, 0] += 1e-7
        with pytest.raises(WeightSyncError, match="bit-wise"):
            verify_weight_sync([learner], [engine], atol=1.0)
        plan = sync_plan([learner])   # kept by the trainer: each later sync is one round trip
        st = sync_weights([learner], [engine], plan=plan, version=4)
        assert st["check_s"] == 0.0 and engine.weights_version() == 4
        # NaN: refused before the engine is called (no plan), or in the sync's header (plan kept); the engine keeps its weights
        before = module_checksums(engine.model.named_parameters())
        keep = learner.model.model.embed_tokens.weight[3, 3].item()
        with torch.no_grad(): learner.model.model.embed_tokens.weight[3, 3] = float("nan")
        with pytest.raises(NonFiniteWeightsError, match="model.embed_tokens.weight"):
            sync_weights([learner], [engine])
        with pytest.raises(NonFiniteWeightsError, match="model.embed_tokens.weight"):
            sync_weights([learner], [engine], plan=plan, version=5)
        assert module_checksums(engine.model.named_parameters()) == before and engine.weights_version() == 4
        with torch.no_grad(): learner.model.model.embed_tokens.weight[3, 3] = keep   # the group goes on after a refused sync
        sync_weights([learner], [engine], plan=plan, version=5)
        assert "bit-identical" in verify_weight_sync([learner], [engine], version=5)["checksums"]
    finally:
        learner.ws_close(); engine.close()


def test_verify_sync_with_custom_scorer_reports():
    engine = HFEngine(CFG, device="cpu", seed=0)
    score = lambda seqs, lens: sequence_logprobs(engine.model, seqs, lens)
    rep = verify_sync([engine], score, prompts=[[4, 5, 6]], max_new_tokens=4)
    assert rep["tokens"] == 4 and rep["max_abs_logprob_diff"] < 1e-5
    off = lambda seqs, lens: [[x + 1e-3 for x in row] for row in score(seqs, lens)]
    with pytest.raises(WeightSyncError, match="engine 0"): verify_sync([engine], off, prompts=[[4, 5, 6]], max_new_tokens=4)
    # identical weights (checksums equal on every parameter) outrank a log-prob difference: reported, not raised
    same = lambda layouts: [{n: e["checksum"] for n, e in lay.items()} for lay in layouts]
    rep = verify_sync([engine], off, prompts=[[4, 5, 6]], max_new_tokens=4, checksums=same)
    assert rep["exact"] and rep["logprob_within_atol"] is False and rep["max_abs_logprob_diff"] > rep["logprob_atol"]
    # ... but not where a parameter could only be compared by log-probs (held repacked)
    repacked = lambda: {n: e | ({"checksum": None} if n.endswith("up_proj.weight") else {}) for n, e in engine_layout(engine.model).items()}
    engine.weight_checksums = repacked
    with pytest.raises(WeightSyncError, match="log-prob"): verify_sync([engine], off, prompts=[[4, 5, 6]], max_new_tokens=4, checksums=same)
    assert verify_sync([engine], score, prompts=[[4, 5, 6]], max_new_tokens=4, checksums=same)["repacked"] == CFG.num_hidden_layers
