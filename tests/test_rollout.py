"""Rollout engines without vLLM or Ray: the transformers backend's sampling semantics, batching and the call helpers.
(The real vLLM engine in a Ray actor is exercised in tests/test_weight_sync_vllm.py, which starts it once for all checks.)"""
import threading
import pytest
import torch
from transformers import Qwen2Config

from grpo_nb.actors import call
from grpo_nb.rollout import (HFEngine, SamplingSpec, Sample, _cut, engine_env, gather, generate_batched, nucleus_mask,
                             sampling_spec, split_evenly, submit)

CFG = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=128, eos_token_id=1, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def engine():
    return HFEngine(CFG, device="cpu", seed=0)


def forward_logprobs(model, prompt, completion, temperature=1.0, top_p=1.0):
    with torch.no_grad():
        z = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float() / temperature
    z = z.masked_fill(nucleus_mask(z, top_p), float("-inf"))
    return z.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_samples_shape_order_and_logprobs(engine):
    out = engine.generate([[5, 6, 7], [8, 9], [10]], SamplingSpec(n=3, max_new_tokens=5, temperature=0.9, top_p=0.95, seed=4))
    assert [(s.prompt_index, s.sample_index) for s in out] == [(p, k) for p in range(3) for k in range(3)]
    assert [s.prompt_ids for s in out[::3]] == [[5, 6, 7], [8, 9], [10]]
    for s in out:
        assert isinstance(s, Sample) and len(s.logprobs) == len(s.completion_ids) and 1 <= len(s.completion_ids) <= 5
        assert torch.allclose(torch.tensor(s.logprobs), forward_logprobs(engine.model, s.prompt_ids, s.completion_ids, 0.9, 0.95), atol=1e-5)
        assert s.finish_reason == ("stop" if s.completion_ids[-1] == 1 else "length")


def test_seeded_reproducible_and_greedy_is_argmax(engine):
    spec = SamplingSpec(n=4, max_new_tokens=6, temperature=1.0, seed=11)
    a, b = engine.generate([[3, 4]], spec), engine.generate([[3, 4]], spec)
    assert [s.completion_ids for s in a] == [s.completion_ids for s in b]
    assert len({tuple(s.completion_ids) for s in a}) > 1
    g = engine.generate([[3, 4]], SamplingSpec(max_new_tokens=6, temperature=0.0, ignore_eos=True))[0]
    assert len(g.completion_ids) == 6 and g.finish_reason == "length"
    with torch.no_grad():
        logits = engine.model(torch.tensor([g.prompt_ids + g.completion_ids])).logits[0]
    assert [int(logits[1 + i].argmax()) for i in range(6)] == g.completion_ids
    assert torch.allclose(torch.tensor(g.logprobs), forward_logprobs(engine.model, g.prompt_ids, g.completion_ids), atol=1e-5)


def test_stop_token_ends_completion(engine):
    g = engine.generate([[3, 4]], SamplingSpec(max_new_tokens=6, temperature=0.0, ignore_eos=True))[0]
    stop = g.completion_ids[2]
    s = engine.generate([[3, 4]], SamplingSpec(max_new_tokens=6, temperature=0.0, stop_token_ids=[stop]))[0]
    first = g.completion_ids.index(stop)
    assert s.completion_ids == g.completion_ids[:first + 1] and s.finish_reason == "stop"


def test_cut_stop_strings():
    dec = lambda t: "".join(chr(96 + x) for x in t)      # 1 -> "a", 2 -> "b", ...
    assert _cut([1, 2, 3, 4, 5], set(), ["cd"], dec) == (4, True)     # "abcd" holds "cd": ends after token 4
    assert _cut([1, 2, 3], set(), ["zz"], dec) == (3, False)
    assert _cut([1, 9, 3, 9], {9}, ["c"], dec) == (2, True)           # the stop token comes first


def test_text_prompts_need_a_tokenizer(engine):
    with pytest.raises(ValueError, match="tokenizer"):
        engine.generate(["hello"], SamplingSpec())


def test_batched_over_engines_keeps_prompt_order(engine):
    other = HFEngine(CFG, device="cpu", seed=0)
    prompts = [[5], [6, 7], [8], [9, 10], [11]]
    out = generate_batched([engine, other], prompts, SamplingSpec(n=2, max_new_tokens=3, temperature=0.0))
    assert [s.prompt_index for s in out] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [s.prompt_ids for s in out[::2]] == prompts
    alone = engine.generate(prompts, SamplingSpec(n=2, max_new_tokens=3, temperature=0.0))
    assert [s.completion_ids for s in out] == [s.completion_ids for s in alone]   # same weights, greedy: same tokens


def test_split_evenly():
    assert split_evenly(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_evenly(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_gather_raises_first_error_without_waiting_for_the_rest():
    gate = threading.Event()
    class Obj:
        def block(self): gate.wait(30); return 1
        def fail(self): raise RuntimeError("engine 3 out of memory")
    o = Obj()
    with pytest.raises(RuntimeError, match="out of memory"):
        gather([submit(o, "block"), submit(o, "fail")], timeout_s=20)
    gate.set()
    assert call(o, "block") == 1


def test_spec_validation_and_config_mapping():
    from grpo_nb.config import RolloutConfig
    with pytest.raises(ValueError, match="temperature"): SamplingSpec(temperature=-1)
    s = sampling_spec(RolloutConfig(num_samples_per_prompt=4, max_new_tokens=32, temperature=0.7, top_p=0.9, seed=3))
    assert (s.n, s.max_new_tokens, s.temperature, s.top_p, s.seed) == (4, 32, 0.7, 0.9, 3)


def test_engine_env():
    cpu2 = engine_env("vllm", 2, "cpu", cpu_cores=[4, 5])
    assert cpu2["VLLM_CPU_OMP_THREADS_BIND"] == "4|5" and cpu2["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    gpu = engine_env("vllm", 1, "cuda")
    assert gpu["NCCL_CUMEM_ENABLE"] == "0" and gpu["NCCL_NVLS_ENABLE"] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in gpu
