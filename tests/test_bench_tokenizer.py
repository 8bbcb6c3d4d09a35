"""The benchmarks' tokenizer and prompts: a prompt of n digits is n tokens whichever tokenizer class transformers picks
(its own Qwen2Tokenizer for Qwen2 directories, the saved fast tokenizer for others), and every id decodes."""
import sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import digit_prompts, save_bench_tokenizer  # noqa: E402


@pytest.mark.parametrize("model_type", ["qwen2", "olmo2"])
def test_prompts_have_the_length_they_say(tmp_path, model_type):
    from transformers import AutoConfig, AutoTokenizer
    V = 512
    AutoConfig.for_model(model_type, vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(tmp_path)
    save_bench_tokenizer(V, tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    for n in (1, 8, 128):
        for p in digit_prompts(4, n, seed=n):
            ids = tok(p)["input_ids"]
            assert len(ids) == n and all(4 <= i <= 13 for i in ids), (type(tok).__name__, p, ids)
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 0)
    assert [tok.decode([i]).strip() for i in range(14, V - 1)] == [f"t{i}" for i in range(14, V - 1)]   # every id past the digits decodes to its own `t<id>`
    if model_type == "qwen2": assert tok.encode("\n", add_special_tokens=False) == [V - 1]   # one token, as in Qwen's vocabulary (verl's rollout checks it)


def test_toy_reward_reads_spaced_and_joined_tokens():
    from e2e_vs_trl import toy_reward
    assert toy_reward("t10 t11 t12 t13") == 0.5 and toy_reward("t10t12t14") == 1.0 and toy_reward("") == 0.0
