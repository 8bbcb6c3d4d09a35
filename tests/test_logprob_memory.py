"""The chunked log-prob head holds at most two fp32 [chunk, V] buffers at a time, forward and backward (what the planner's
`grpo_nb.memory.logits_bytes` counts: 8 bytes per chunk token per vocabulary entry), measured on CPU by following
every tensor they create until it is freed."""
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo_nb.loss import token_logprobs


class LiveBytes(TorchDispatchMode):
    "Bytes of the storages created inside the mode and still referenced, and their peak (storages seen once each)."
    def __init__(self):
        super().__init__(); self.live, self.now, self.peak = {}, 0, 0
    def _free(self, key):
        self.now -= self.live.pop(key, 0)
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and (key := t.untyped_storage().data_ptr()) and key not in self.live:
                self.live[key] = t.untyped_storage().nbytes(); self.now += self.live[key]; self.peak = max(self.peak, self.now)
                weakref.finalize(t, self._free, key)
        return out


def test_backward_holds_two_fp32_chunk_buffers_at_most():
    torch.manual_seed(0)
    N, H, V, c = 1024, 64, 4096, 256
    h = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
    lp = token_logprobs(h, w, torch.randint(0, V, (N,)), chunk=c)
    with LiveBytes() as m:
        lp.sum().backward()
    fixed = 4 * V * H + 2 * V * H + 2 * N * H   # the fp32 [V, H] accumulator, its bf16 result, the hidden states' gradient
    per = (m.peak - fixed) / (c * V)
    assert 7.5 <= per <= 8.5, per   # two fp32 [c, V] buffers (8 bytes per entry); three would be 12


def test_forward_with_entropy_holds_two_fp32_chunk_buffers_at_most():
    # the forward keeps [N] results only; inside a chunk it needs the logits and one more [c, V] buffer (the softmax for the
    # entropy, or logsumexp's own work where the kernel has one), and the previous chunk's softmax must be gone by then
    torch.manual_seed(0)
    N, H, V, c = 1024, 64, 4096, 256
    h = torch.randn(N, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, H, dtype=torch.bfloat16, requires_grad=True)
    tok = torch.randint(0, V, (N,))
    for with_entropy in (False, True):
        with LiveBytes() as m:
            token_logprobs(h, w, tok, chunk=c, with_entropy=with_entropy)
        fixed = 3 * 4 * N + 4 * N + 8 * N   # logp, lse, entropy [N] fp32; the valid mask; the clamped tokens
        per = (m.peak - fixed) / (c * V)
        assert per <= 8.5, (with_entropy, per)   # two fp32 [c, V] buffers at most (8 bytes per entry); three would be 12
