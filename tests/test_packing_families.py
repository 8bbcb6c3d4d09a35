"""The learner packs a micro-batch's sequences into one row and attends within each (varlen attention, or one sdpa
per sequence on CPU). That only holds where the model family hands the sequence bounds down to its attention
layers: for each family the planner knows, packed log-probs must equal those of each sequence run on its own."""
import pytest, torch
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from grpo_nb.learner import PolicyLogProbs, TrainBatch, make_micro_batch, varlen_attention


@pytest.mark.parametrize("family,kv_heads", [("qwen2", 2), ("olmo2", 4), ("llama", 2)])
def test_packed_logprobs_equal_each_sequence_alone(family, kv_heads):
    AttentionInterface.register("grpo_varlen", varlen_attention)
    cfg = AutoConfig.for_model(family, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=kv_heads, vocab_size=97, max_position_embeddings=256, tie_word_embeddings=False,
                               bos_token_id=2, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="grpo_varlen").float().eval()
    seqs, plens = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18], [3, 4, 5, 6]], [2, 3, 1]
    mb = make_micro_batch(TrainBatch(seqs, plens, [0.0] * 3), [0, 1, 2])
    bounds = dict(cu_seq_lens_q=mb.cu_seqlens, cu_seq_lens_k=mb.cu_seqlens, max_length_q=mb.max_len, max_length_k=mb.max_len)
    with torch.no_grad():
        packed, _ = PolicyLogProbs(model)(mb.input_ids, mb.position_ids, mb.score_idx, mb.targets, **bounds)
        unbounded, _ = PolicyLogProbs(model)(mb.input_ids, mb.position_ids, mb.score_idx, mb.targets)
        alone = []
        for s, p in zip(seqs, plens):
            lp = model(torch.tensor([s])).logits[0].log_softmax(-1)
            alone += [float(lp[i, s[i + 1]]) for i in range(p - 1, len(s) - 1)]
    alone = torch.tensor(alone)
    assert (packed - alone).abs().max() < 1e-5
    assert (unbounded - alone).abs().max() > 1e-2   # without the bounds the sequences see each other: the check can tell
