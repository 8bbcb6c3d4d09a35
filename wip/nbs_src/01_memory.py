# %%
#| default_exp memory

# %% [markdown]
# # Memory
# > Where every byte of a GRPO job goes: learners (ZeRO 0-3, offload, activations, logits, gathered parameters) and rollout engines (weights, KV cache), with a verdict and the change that makes it fit

# %% [markdown]
# Before booking sixteen nodes, one wants to know whether a 32B policy fits on eight learners, how long
# a sequence can be, and how many sequences a vLLM engine can hold. This notebook derives the answer
# term by term, each term a small pure function of explicit numbers, and then checks the sum against
# `torch.cuda.max_memory_allocated()` of real DeepSpeed steps on H100/H200 GPUs
# (`bench/memory_accuracy.py`, rendered at the end).
#
# **Symbols.** `P` parameters, `N` learner GPUs (the ZeRO data-parallel world), `B` sequences in one
# micro-batch, `T` tokens per sequence, `V` vocabulary, `h` hidden size, `i` MLP (intermediate) size,
# `L` layers, `a` attention heads, `k` key/value heads, `d` head dimension, `q = a·d`, `kv = k·d`,
# `TP` tensor-parallel GPUs of one engine, `U` vLLM's `gpu_memory_utilization`. Bytes are bytes;
# tables print GiB (2³⁰ bytes) and say so. "GB" in the seed documents is read as 10⁹ bytes.
#
# **What is modelled.** The learner is a HF `transformers` causal LM (sdpa attention, bf16 weights)
# trained by DeepSpeed 0.19.8 with grpo-nb's learner config (`grpo_nb.learner.ds_config`: bf16, torch's
# fused AdamW, DeepSpeed's default buckets, fp32 gradient accumulation under ZeRO-1), and either HF's
# own `labels=` loss (`logits="full"`) or grpo-nb's chunked log-probs (`grpo_nb.loss.token_logprobs`
# inside the output projection, `grpo_nb.learner.LogProbHead`; `logits="chunked"`, the trainer's path). The terms follow
# DeepSpeed's source (file and function named in each section), so a term that is off can be traced.
#
# ## Where this departs from the usual rules of thumb, and why
#
# | Rule of thumb | What it says | What is computed here | Why |
# |---|---|---|---|
# | "16 bytes per parameter" (ZeRO paper) | 2 (bf16 weights) + 2 (grads) + 12 (fp32 master, m, v) | the same states, split by ZeRO stage, *plus* the transient fp32 gradient DeepSpeed builds at the optimizer step and its bucket buffers | DeepSpeed converts the bf16 gradient partition to fp32 at `step()`; at small `N` that transient decides the peak |
# | DeepSpeed's estimator `estimate_zero3_model_states_mem_needs` | `4·largest_layer + 18·P/N` | model states, activations, logits, gathered parameters, buckets, each named | activations and logits dominate RL learners; the estimator leaves them out |
# | Korthikanti et al. (2022) | activations ≈ `s·b·h·(34 + 5·a·s/h)` bytes per layer | the tensors HF's modules actually save (fp32 RMSNorm inputs, SwiGLU, rotary, sdpa without the `a·s²` matrix) | flash/sdpa never stores the attention matrix; HF's RMSNorm saves an fp32 copy of its input |
# | "logits are B·T·V·4 bytes" | one fp32 copy | the loss head's real peak: 12 bytes per token×vocab entry for HF's loss, a few `[chunk, V]` buffers plus one `[V, h]` fp32 gradient for the chunked path | cross-entropy's backward holds log-softmax, its gradient and the NLL gradient at once |
# | ZeRO-3 "only one layer is gathered" | `2·largest_layer` | a simulation of DeepSpeed's reuse-distance rule (`stage3_max_reuse_distance`) over the forward/backward trace | with the defaults, a small model stays mostly gathered from forward to backward, a large one keeps up to ~10⁹ parameters gathered |

# %%
#| export
from __future__ import annotations
import dataclasses, functools, json, math, sys
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Literal, Optional

# %%
#| hide
from fastcore.test import test_eq, test_close, test_fail
import io, contextlib, tempfile
import grpo_nb.memory as lib
from grpo_nb.config import TrainConfig, load_config, derive
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config, LlamaConfig, Olmo2Config
import matplotlib.pyplot as plt

# %% [markdown]
# ## Model shapes
#
# Everything below is a function of a handful of numbers from a model's `config.json`. `ModelShape`
# holds them, plus the three architectural details that change parameter counts: tied input/output
# embeddings, biases on the q/k/v projections (Qwen2.5) and RMSNorms on queries and keys (Qwen3 norms
# each head's `d` values; OLMo-2 norms the whole `q` and `kv` projections).

# %%
#| export
GiB = 2**30
Family = Literal["qwen2", "qwen3", "llama", "olmo2"]

@dataclass(frozen=True)
class ModelShape:
    "The shape numbers of a decoder-only transformer, as in its HF `config.json`."
    name:str # display name, e.g. "Qwen2.5-7B"
    family:str # "qwen2" | "qwen3" | "llama" | "olmo2" (HF `model_type`)
    hidden:int # `h`, hidden_size
    intermediate:int # `i`, intermediate_size of the SwiGLU MLP
    layers:int # `L`, num_hidden_layers
    heads:int # `a`, num_attention_heads
    kv_heads:int # `k`, num_key_value_heads (GQA when < heads)
    head_dim:int # `d`, head_dim (hidden // heads unless the config says otherwise)
    vocab:int # `V`, vocab_size (rows of the embedding matrix)
    tie_word_embeddings:bool # the output projection reuses the embedding matrix
    attention_bias:bool=False # biases on q/k/v projections (Qwen2.5)
    qk_norm:str="none" # "none", "head" (RMSNorm over d, Qwen3) or "full" (over q and kv, OLMo-2)

    @property
    def q(self) -> int: return self.heads * self.head_dim
    @property
    def kv(self) -> int: return self.kv_heads * self.head_dim

# %% [markdown]
# The built-in table holds the published `config.json` values of the common open models (base and
# instruct variants share shapes). `OLMo-2-7B`/`13B` are the `1124` releases, `OLMo-2-32B` the `0325`.

# %%
#| export
def _shape(name, family, h, i, L, a, k, d, V, tied, bias=False, qk="none"):
    return ModelShape(name, family, h, i, L, a, k, d, V, tied, bias, qk)

ARCHS:dict[str, ModelShape] = {s.name: s for s in [
    _shape("Qwen2.5-0.5B", "qwen2",  896,  4864, 24, 14,  2,  64, 151936, True,  bias=True),
    _shape("Qwen2.5-1.5B", "qwen2", 1536,  8960, 28, 12,  2, 128, 151936, True,  bias=True),
    _shape("Qwen2.5-3B",   "qwen2", 2048, 11008, 36, 16,  2, 128, 151936, True,  bias=True),
    _shape("Qwen2.5-7B",   "qwen2", 3584, 18944, 28, 28,  4, 128, 152064, False, bias=True),
    _shape("Qwen2.5-14B",  "qwen2", 5120, 13824, 48, 40,  8, 128, 152064, False, bias=True),
    _shape("Qwen2.5-32B",  "qwen2", 5120, 27648, 64, 40,  8, 128, 152064, False, bias=True),
    _shape("Qwen2.5-72B",  "qwen2", 8192, 29568, 80, 64,  8, 128, 152064, False, bias=True),
    _shape("Qwen3-0.6B",   "qwen3", 1024,  3072, 28, 16,  8, 128, 151936, True,  qk="head"),
    _shape("Qwen3-1.7B",   "qwen3", 2048,  6144, 28, 16,  8, 128, 151936, True,  qk="head"),
    _shape("Qwen3-4B",     "qwen3", 2560,  9728, 36, 32,  8, 128, 151936, True,  qk="head"),
    _shape("Qwen3-8B",     "qwen3", 4096, 12288, 36, 32,  8, 128, 151936, False, qk="head"),
    _shape("Qwen3-14B",    "qwen3", 5120, 17408, 40, 40,  8, 128, 151936, False, qk="head"),
    _shape("Qwen3-32B",    "qwen3", 5120, 25600, 64, 64,  8, 128, 151936, False, qk="head"),
    _shape("Llama-3.1-8B", "llama", 4096, 14336, 32, 32,  8, 128, 128256, False),
    _shape("Llama-3.1-70B","llama", 8192, 28672, 80, 64,  8, 128, 128256, False),
    _shape("Llama-3.2-1B", "llama", 2048,  8192, 16, 32,  8,  64, 128256, True),
    _shape("Llama-3.2-3B", "llama", 3072,  8192, 28, 24,  8, 128, 128256, True),
    _shape("OLMo-2-7B",    "olmo2", 4096, 11008, 32, 32, 32, 128, 100352, False, qk="full"),
    _shape("OLMo-2-13B",   "olmo2", 5120, 13824, 40, 40, 40, 128, 100352, False, qk="full"),
    _shape("OLMo-2-32B",   "olmo2", 5120, 27648, 64, 40,  8, 128, 100352, False, qk="full"),
]}
"Built-in architectures: display name -> shape (published `config.json` values)."

# %% [markdown]
# ## Exact parameter counts
#
# One decoder layer holds the attention projections `h·q` (query), `2·h·kv` (key, value), `q·h`
# (output), the SwiGLU MLP `3·h·i` (gate, up, down), two RMSNorm weights of `h` each, and optionally
# q/k/v biases (`q + 2·kv`) and q/k norms (`2·d` per layer for Qwen3, `q + kv` for OLMo-2). Around the
# `L` layers sit the embedding `V·h`, the final norm `h` and — unless tied — the output projection
# `V·h`. "Non-embedding" counts leave out both `V·h` matrices, as the model cards do.

# %%
#| export
def layer_modules(s:ModelShape, # the model
                 ) -> dict[str, int]: # module name -> parameter count, in forward order
    "Parameters of one decoder layer, module by module (what ZeRO-3 gathers and releases)."
    bias = s.attention_bias
    m = {"input_norm": s.hidden,
         "q_proj": s.hidden * s.q + (s.q if bias else 0),
         "k_proj": s.hidden * s.kv + (s.kv if bias else 0),
         "v_proj": s.hidden * s.kv + (s.kv if bias else 0)}
    if s.qk_norm == "head": m.update(q_norm=s.head_dim, k_norm=s.head_dim)
    if s.qk_norm == "full": m.update(q_norm=s.q, k_norm=s.kv)
    m.update(o_proj=s.q * s.hidden, post_norm=s.hidden,
             gate_proj=s.hidden * s.intermediate, up_proj=s.hidden * s.intermediate,
             down_proj=s.intermediate * s.hidden)
    return m

def param_counts(s:ModelShape, # the model
                ) -> dict[str, int]: # embed, layer, layers, final_norm, lm_head, total, non_embedding
    "Exact parameter counts of `s`, derived from its shape."
    layer = sum(layer_modules(s).values())
    embed, head = s.vocab * s.hidden, 0 if s.tie_word_embeddings else s.vocab * s.hidden
    total = embed + s.layers * layer + s.hidden + head
    return dict(embed=embed, layer=layer, layers=s.layers * layer, final_norm=s.hidden, lm_head=head,
                total=total, non_embedding=total - embed - head)

# %%
c = param_counts(ARCHS["Qwen2.5-7B"])
print(f"Qwen2.5-7B: {c['total']:,} parameters ({c['total']/1e9:.2f}B), {c['non_embedding']/1e9:.2f}B without embeddings")
test_eq(c["total"], 7_615_616_512)

# %% [markdown]
# `PUBLISHED` keeps the sizes the model cards and HF's safetensors metadata publish, as printed there;
# the table below sets the computed counts beside them.

# %%
#| export
PUBLISHED:dict[str, tuple[str, Optional[str]]] = {  # name -> (total, non-embedding) in billions, as published
    "Qwen2.5-0.5B": ("0.49", "0.36"), "Qwen2.5-1.5B": ("1.54", "1.31"), "Qwen2.5-3B": ("3.09", "2.77"),
    "Qwen2.5-7B": ("7.61", "6.53"), "Qwen2.5-14B": ("14.7", "13.1"), "Qwen2.5-32B": ("32.8", "31.0"),
    "Qwen2.5-72B": ("72.7", "70.0"),
    "Qwen3-0.6B": ("0.6", "0.44"), "Qwen3-1.7B": ("1.7", "1.4"), "Qwen3-4B": ("4.0", "3.6"), "Qwen3-8B": ("8.2", "6.95"),
    "Qwen3-14B": ("14.8", "13.2"), "Qwen3-32B": ("32.8", "31.2"),
    "Llama-3.1-8B": ("8.03", None), "Llama-3.1-70B": ("70.6", None), "Llama-3.2-1B": ("1.24", None),
    "Llama-3.2-3B": ("3.21", None), "OLMo-2-7B": ("7.30", None), "OLMo-2-13B": ("13.7", None), "OLMo-2-32B": ("32.2", None),
}
"Published sizes in billions: Qwen2.5/Qwen3 model cards (non-embedding as they state it), Llama and OLMo-2 HF safetensors totals."

def matches_published(count:int, # exact parameter count
                      published:str, # the published figure in billions, e.g. "7.61"
                     ) -> bool:
    "Whether `count` agrees with a published figure to within one unit of its last digit (cards round or truncate)."
    unit = 10 ** -len(published.partition(".")[2])
    return abs(count / 1e9 - float(published)) < unit

# %%
print(f"{'model':<14} {'params':>16} {'B':>7} {'published':>9} {'non-emb B':>9} {'published':>9}")
for name, s in ARCHS.items():
    c, (pub, pub_ne) = param_counts(s), PUBLISHED[name]
    print(f"{name:<14} {c['total']:>16,} {c['total']/1e9:>7.3f} {pub:>9} {c['non_embedding']/1e9:>9.3f} {pub_ne or '':>9}")
    assert matches_published(c["total"], pub), name

# %% [markdown]
# Every total agrees with its published figure to the last published digit (`matches_published`; the
# cards sometimes truncate rather than round). Two of Qwen's own statements do not: the Qwen2.5-32B
# card's headline "32.5B" (its safetensors hold the count above, shown as 32.8B on its HF page), and the
# non-embedding figures of Qwen2.5-14B/32B/72B, which sit below `total − 2·V·h`:

# %%
for name in ["Qwen2.5-14B", "Qwen2.5-32B", "Qwen2.5-72B"]:
    ne = param_counts(ARCHS[name])["non_embedding"] / 1e9
    print(f"{name}: non-embedding {ne:.3f}B from the shape, {PUBLISHED[name][1]}B on the card ({ne - float(PUBLISHED[name][1]):+.2f}B)")

# %% [markdown]
# The exact check is against transformers itself: building each family's model on the meta device (no
# memory, no weights) and counting its parameters.

# %%
_HF = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig, "olmo2": Olmo2Config}
def hf_count(s):
    cfg = _HF[s.family](hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers,
                        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                        vocab_size=s.vocab, tie_word_embeddings=s.tie_word_embeddings)
    with torch.device("meta"): m = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in m.parameters())
for name in ["Qwen2.5-7B", "Qwen3-0.6B", "Llama-3.2-1B", "OLMo-2-32B"]:
    test_eq(hf_count(ARCHS[name]), param_counts(ARCHS[name])["total"])
print("transformers agrees exactly on one model of each family")

# %% [markdown]
# ## Shapes from a `config.json`
#
# A local HF directory (or the `config.json` itself) gives the shape of any model of these families
# and of most other Llama-like ones: missing `head_dim` means `hidden // heads`, missing
# `num_key_value_heads` means no GQA, and the family decides biases and q/k norms unless the config
# says otherwise (`attention_bias`). Multimodal configs nest the language model under `text_config`.

# %%
#| export
_FAMILY_DEFAULTS = {"qwen2": (True, "none"), "qwen3": (False, "head"), "olmo2": (False, "full"), "llama": (False, "none")}

def shape_from_hf(cfg:dict, # a parsed HF config.json (or `PretrainedConfig.to_dict()`)
                  name:str="", # display name (default: the config's `_name_or_path` or model_type)
                 ) -> ModelShape:
    "The `ModelShape` of a HF config dict."
    cfg = cfg.get("text_config") or cfg
    mt = cfg.get("model_type", "llama")
    family = mt if mt in _FAMILY_DEFAULTS else "llama"
    try: h, a = cfg["hidden_size"], cfg["num_attention_heads"]
    except KeyError as e: raise ValueError(f"config.json has no {e.args[0]!r}: not a decoder-only LM config this planner knows.") from None
    bias_default, qk = _FAMILY_DEFAULTS[family]
    return ModelShape(name or cfg.get("_name_or_path") or mt, family, h, cfg["intermediate_size"], cfg["num_hidden_layers"],
                      a, cfg.get("num_key_value_heads") or a, cfg.get("head_dim") or h // a, cfg["vocab_size"],
                      bool(cfg.get("tie_word_embeddings", False)), bool(cfg.get("attention_bias", bias_default)), qk)

def get_shape(model:str|Path|ModelShape, # built-in name (case-insensitive, org prefix and -Instruct ignored), HF dir or config.json
             ) -> ModelShape:
    "Resolve a model argument to its shape."
    if isinstance(model, ModelShape): return model
    p = Path(model)
    if p.is_dir(): p = p / "config.json"
    if p.is_file(): return shape_from_hf(json.loads(p.read_text()), name=str(model))
    key = str(model).split("/")[-1].lower().removesuffix("-instruct").removesuffix("-base")
    for k in ("-1124", "-0325", "-0425"): key = key.replace(k, "")
    for name, s in ARCHS.items():
        if name.lower() == key: return s
    raise ValueError(f"unknown model {str(model)!r}: give a HF model directory (with config.json) or one of the "
                     f"built-in names: {', '.join(ARCHS)}.")

# %%
with tempfile.TemporaryDirectory() as td:
    cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True).to_dict()
    (Path(td) / "config.json").write_text(json.dumps(cfg))
    s = get_shape(td)
print(s)
test_eq(param_counts(s)["total"], param_counts(ARCHS["Qwen3-0.6B"])["total"])
test_eq(get_shape("Qwen/Qwen2.5-7B-Instruct"), ARCHS["Qwen2.5-7B"])
test_eq(get_shape("allenai/OLMo-2-1124-7B"), ARCHS["OLMo-2-7B"])
test_fail(lambda: get_shape("gpt-5"), contains="built-in names")

# %% [markdown]
# ## The learner, term by term
#
# A learner GPU holds *model states* (weights, gradients, optimizer states), *activations* saved for
# backward, the *loss head's* logits, ZeRO-3's *gathered* parameters, DeepSpeed's *buffers*, and a few
# *fixed* allocations. Not all of them peak together, so the planner adds them up at four moments of a
# step and takes the largest:
#
# | phase | what is alive |
# |---|---|
# | `loss` | states, all saved activations, the loss head at its peak (start of backward) |
# | `backward_start` | states, all saved activations, the first (last-layer) backward working set |
# | `backward_end` | states, all gradients, the last (first-layer) backward working set |
# | `step` | states, all gradients, the optimizer step's fp32 gradient |
#
# ### Weights
#
# Mixed precision keeps the model in bf16: **2 bytes per parameter**. ZeRO-0/1/2 keep all of them on
# every learner; ZeRO-3 keeps a `1/N` partition (`deepspeed/runtime/zero/partition_parameters.py`),
# except parameters smaller than `stage3_param_persistence_threshold` (10⁵ elements: norms, biases),
# which stay whole everywhere. `offload="all"` moves the partition to CPU memory.

# %%
#| export
Zero = Literal[0, 1, 2, 3]
Offload = Literal["none", "optimizer", "all"]

def weights_bytes(n_params:int, # `P`
                  zero:int, # ZeRO stage 0-3
                  learners:int, # `N`
                  offload:str="none", # "none" | "optimizer" | "all" (parameters to CPU, ZeRO-3 only)
                  persistent:int=0, # parameters below the persistence threshold (whole on every GPU under ZeRO-3)
                 ) -> int: # bytes per GPU
    "bf16 weights resident on one learner GPU."
    if zero < 3: return 2 * n_params
    return 2 * persistent + (0 if offload == "all" else 2 * math.ceil(n_params / learners))

# %%
P7 = param_counts(ARCHS["Qwen2.5-7B"])["total"]
print(f"Qwen2.5-7B bf16 weights: {weights_bytes(P7, 0, 1)/1e9:.1f} GB whole, {weights_bytes(P7, 3, 8)/1e9:.2f} GB per GPU under ZeRO-3 on 8")
test_eq(weights_bytes(1000, 3, 4), 500); test_eq(weights_bytes(1000, 2, 4), 2000); test_eq(weights_bytes(1000, 3, 4, "all"), 0)

# %% [markdown]
# ### Optimizer states
#
# AdamW keeps, per parameter it updates, an fp32 *master* copy (4 bytes: updates of size lr·g are below
# bf16's resolution) and two fp32 moments `m`, `v` (8 bytes). That is **12 bytes per parameter**, split
# over `N` from ZeRO-1 on. An 8-bit optimizer (bitsandbytes `AdamW8bit`) stores the moments in 1 byte
# each plus one fp32 scale per 256-value block, but still needs the 4-byte master. `offload` of the
# optimizer moves all of it to CPU memory (`host_bytes`).

# %%
#| export
Optimizer = Literal["adamw", "adamw-8bit"]

def moment_bytes_per_param(optimizer:str="adamw", # "adamw" (fp32 m, v) | "adamw-8bit" (int8 m, v + block scales)
                          ) -> float:
    "Bytes of optimizer moments per parameter."
    if optimizer == "adamw": return 8.0
    if optimizer == "adamw-8bit": return 2.0 + 2 * 4 / 256
    raise ValueError(f"optimizer must be 'adamw' or 'adamw-8bit' (got {optimizer!r}).")

def optimizer_bytes(n_params:int, # `P`
                    zero:int, # ZeRO stage 0-3
                    learners:int, # `N`
                    offload:str="none", # optimizer states on CPU unless "none"
                    optimizer:str="adamw", # "adamw" | "adamw-8bit"
                   ) -> int: # bytes per GPU
    "fp32 master weights + moments on one learner GPU."
    if offload != "none": return 0
    owned = n_params if zero == 0 else math.ceil(n_params / learners)
    return int(owned * (4 + moment_bytes_per_param(optimizer)))

# %%
print(f"Qwen2.5-7B AdamW states: {optimizer_bytes(P7, 0, 1)/1e9:.1f} GB whole; 8-bit: {optimizer_bytes(P7, 0, 1, optimizer='adamw-8bit')/1e9:.1f} GB")
test_eq(optimizer_bytes(1000, 3, 2), 6000); test_eq(optimizer_bytes(1000, 0, 2), 12000); test_eq(optimizer_bytes(1000, 3, 2, "optimizer"), 0)

# %% [markdown]
# ### Gradients and DeepSpeed's buffers
#
# Backward produces bf16 gradients (2 bytes per parameter) — DeepSpeed's gradient accumulation dtype
# defaults to the model's dtype. Where they live depends on the stage:
#
# - **ZeRO-0** keeps every parameter's `.grad`: `2·P`. With `N > 1`, its all-reduce flattens up to
#   5·10⁸ elements at a time (`engine.allreduce_gradients`).
# - **ZeRO-1** in grpo-nb's learner accumulates gradients in fp32 (`grpo_nb.learner.ds_config` sets
#   `grad_accum_dtype: fp32`, which selects DeepSpeed's `BF16_Optimizer`): a persistent fp32 buffer of
#   all gradients (`4·P`, `bf16_optimizer.py`, `fp32_groups_gradients_flat`) plus the bf16 `.grad` of
#   every parameter until the optimizer step (`2·P`); the fp32 buffer is what Adam reads, so the step
#   needs no further copy.
# - **ZeRO-2** copies each gradient, as it is produced, into a `reduce_bucket_size` buffer (`ipg`
#   bucket, 5·10⁸ elements by default: **1 GB** whatever the model's size; two with `overlap_comm`),
#   reduces it and keeps only its own `2·P/N` partition (`stage_1_and_2.py`,
#   `reduce_independent_p_g_buckets_and_remove_grads`, `setup_buckets`).
# - **ZeRO-3** keeps a flat `2·P/N` buffer of gradient partitions and the same bucket, both allocated
#   once at start-up (`stage3.py`, `grad_partitions_flat_buffer`, `ipg_buckets`).
#
# With optimizer offload, ZeRO-2/3 move the gradient partition to CPU too; the bucket stays.
#
# One gradient escapes these rules. With tied embeddings the output projection and the embedding are
# one parameter, used first in the forward and last in the backward; autograd sums both contributions
# before the parameter's gradient hook fires, so the head's bf16 `[V, h]` gradient waits in autograd's
# buffer through the whole backward (ZeRO-2/3; under ZeRO-0/1 it is part of `.grad` anyway), and the
# embedding's own dense `[V, h]` gradient joins it at the very end: `embedding_grad_bytes`.

# %%
#| export
@dataclass(frozen=True)
class ZeroKnobs:
    "DeepSpeed `zero_optimization` settings that change memory (DeepSpeed's defaults)."
    reduce_bucket_size:int=500_000_000 # elements of the gradient reduce bucket (ZeRO-1/2/3)
    overlap_comm:Optional[bool]=None # two buckets instead of one; None: DeepSpeed's default (True only for ZeRO-3)
    allreduce_bucket_size:int=500_000_000 # elements flattened at once by ZeRO-0's all-reduce (N > 1)
    stage3_prefetch_bucket_size:int=50_000_000 # elements ZeRO-3 gathers ahead of use
    stage3_max_live_parameters:int=1_000_000_000 # ZeRO-3 stops prefetching above this many gathered elements
    stage3_max_reuse_distance:int=1_000_000_000 # ZeRO-3 keeps a gathered parameter if it is used again within this many elements
    stage3_param_persistence_threshold:int=100_000 # parameters smaller than this stay whole on every GPU
    sub_group_size:int=1_000_000_000 # ZeRO-3 optimizer sub-group (its fp32 gradient is built one sub-group at a time)

    def overlap(self, zero:int) -> bool: return (zero == 3) if self.overlap_comm is None else self.overlap_comm

# %%
#| export
def grads_bytes(n_params:int, # `P`
                zero:int, # ZeRO stage 0-3
                learners:int, # `N`
                offload:str="none", # gradient partitions go to CPU with the optimizer (ZeRO-2/3)
               ) -> int: # bytes per GPU once backward has finished
    "Gradients held on one learner GPU at the end of backward (bf16; ZeRO-1 adds its fp32 accumulator)."
    if zero == 0: return 2 * n_params
    if zero == 1: return 2 * n_params + 4 * n_params
    return 0 if offload != "none" else 2 * math.ceil(n_params / learners)

def buffers_bytes(n_params:int, # `P`
                  zero:int, # ZeRO stage 0-3
                  learners:int, # `N`
                  knobs:ZeroKnobs=ZeroKnobs(), # DeepSpeed bucket sizes
                 ) -> int: # bytes per GPU
    "DeepSpeed's gradient communication buffers."
    if zero <= 1: return (2 if zero == 0 else 4) * min(n_params, knobs.allreduce_bucket_size) if learners > 1 else 0
    return 2 * knobs.reduce_bucket_size * (2 if knobs.overlap(zero) else 1)

# %%
#| export
def embedding_grad_bytes(s:ModelShape, # the model
                         zero:int, # ZeRO stage 0-3
                         phase:str, # "backward_start" (the head's gradient is waiting) or "backward_end" (the embedding's joins)
                        ) -> int: # bytes on top of `grads_bytes`
    "Transient `[V, h]` bf16 gradients of the embedding and a tied output projection during backward."
    vh2 = 2 * s.vocab * s.hidden
    waiting = vh2 if s.tie_word_embeddings and zero >= 2 else 0
    if phase == "backward_start": return waiting
    return waiting + (vh2 if zero >= 2 or s.tie_word_embeddings else 0)

# %%
print(f"ZeRO-2 bucket: {buffers_bytes(P7, 2, 8)/1e9:.1f} GB, ZeRO-3 (overlap_comm): {buffers_bytes(P7, 3, 8)/1e9:.1f} GB")
test_eq(grads_bytes(1000, 0, 4), 2000); test_eq(grads_bytes(1000, 1, 4), 6000); test_eq(grads_bytes(1000, 2, 4), 500); test_eq(buffers_bytes(1000, 0, 1), 0)

# %% [markdown]
# ### The optimizer step's transient
#
# DeepSpeed does not run Adam on bf16 gradients. At `step()` it builds an fp32 copy of the gradients a
# learner owns, on top of everything above. ZeRO-0 with torch's AdamW (`fp16/unfused_optimizer.py`,
# `fp32_param.grad = fp16_param.grad.to(fp32)`) needs **4 bytes per parameter**; ZeRO-2
# (`stage_1_and_2.py`, `step`) and ZeRO-3 (`stage3.py`, one `sub_group_size` sub-group at a time) first
# flatten the bf16 partition and then convert it: **6 bytes per owned parameter**. (ZeRO-1's fp32
# accumulator, above, already is that copy.) torch's *fused*
# AdamW then updates in place; its `foreach` implementation would
# add an fp32 copy of `v`'s square root, and the single-tensor one (torch's default on CPU) two per tensor
# it updates (`adam=`; ZeRO-2 frees its bf16 partition before the update). With the optimizer offloaded,
# the step runs on the CPU.

# %%
#| export
def step_transient_bytes(n_params:int, # `P`
                         zero:int, # ZeRO stage 0-3
                         learners:int, # `N`
                         offload:str="none", # no GPU transient when the optimizer is on CPU
                         knobs:ZeroKnobs=ZeroKnobs(), # sub_group_size bounds ZeRO-3's fp32 gradient
                         adam:str="fused", # torch AdamW implementation: "fused" | "foreach" | "single-tensor"
                         largest:int=0, # elements of the largest parameter (ZeRO-0's optimizer sees parameters one by one)
                        ) -> int: # bytes per GPU, alive only during `step()`
    "fp32 gradient copies built by DeepSpeed's optimizer step, and AdamW's own temporaries."
    if adam not in ("fused", "foreach", "single-tensor"): raise ValueError(f"adam must be fused, foreach or single-tensor (got {adam!r}).")
    if offload != "none": return 0
    own = n_params if zero == 0 else math.ceil(n_params / learners)
    if zero == 3: own = min(own, knobs.sub_group_size)
    tensor = largest if zero == 0 else own  # ZeRO-1/2/3 hand Adam one flat tensor (per ZeRO-3 sub-group)
    tmp = {"fused": 0, "foreach": 4 * own, "single-tensor": 8 * tensor}[adam]  # sqrt(v), and (single-tensor) sqrt(v)/c
    if zero == 1: return tmp  # BF16_Optimizer steps on its fp32 accumulator
    if zero == 0: return 4 * own + tmp  # fp32 copies of every .grad, alive through the update
    convert = 6 * own  # a flat bf16 copy of the partition, then its fp32 copy
    update = 4 * own + tmp - (2 * own if zero == 2 else 0)  # the fp32 copy during Adam (ZeRO-2 has freed its bf16 partition)
    return max(convert, update)

# %%
test_eq(step_transient_bytes(1000, 0, 4), 4000); test_eq(step_transient_bytes(1000, 1, 4), 0); test_eq(step_transient_bytes(1000, 2, 4), 1500)
test_eq(step_transient_bytes(1000, 3, 4, adam="single-tensor"), 3000); test_eq(step_transient_bytes(1000, 0, 4, adam="single-tensor", largest=100), 4800)

# %% [markdown]
# ### Activations
#
# Autograd keeps, per token and per layer, the tensors each module needs for its backward. For HF's
# Llama-like layers in bf16 (2 bytes per value) with sdpa or flash attention:
#
# | module | saved for backward | bytes per token |
# |---|---|---|
# | RMSNorm (×2) | its input cast to fp32, the normalised bf16 value, its output (the next matmul's input) | 2 × (4h + 2h + 2h) |
# | q/k projections + rotary | the projection output, `rotate_half` of it, the rotated result | 3 × 2q + 3 × 2kv |
# | q/k RMSNorm (Qwen3, OLMo-2) | as above, on `q` and `kv` values instead of `h` | + 6q + 6kv |
# | v projection | its output | 2kv |
# | attention (sdpa/flash) | output, its contiguous copy (o_proj's input), fp32 log-sum-exp per head | 2q + 2q + 4a |
# | SwiGLU MLP | gate output, SiLU output, up output, their product | 4 × 2i |
#
# which sums to **`16h + 10q + 8kv + 8i`** bytes per token and layer (`16h + 16q + 14kv + 8i` with
# q/k norms). The residual stream itself is not saved (additions need no inputs), and flash/sdpa never
# store the `a·T²` attention matrix that Korthikanti et al. count; `eager` attention does (fp32
# softmax output, bf16 probabilities: `6·a·T` per token and layer). The count assumes attention without
# an explicit mask (causal flash/sdpa, or the varlen flash kernel grpo-nb's learner uses for packed rows):
# given a padding or packed-sequence mask, HF's sdpa path repeats the KV heads for GQA (`2q` instead of
# `2kv` saved for keys and for values) and materialises an `[L, L]` boolean mask.
#
# With **gradient checkpointing** (HF's `gradient_checkpointing_enable`, non-reentrant), each layer
# keeps only its input (`2h`), and backward recomputes one layer at a time. Backward of a layer also
# needs a *working set* of gradients: three `[tokens, i]` bf16 gradients in the MLP and two `[tokens, h]`
# ones on the residual path.

# %%
#| export
Attn = Literal["sdpa", "flash_attention_2", "eager"]

def layer_activation_bytes(s:ModelShape, # the model
                           seq_len:int, # `T` (only eager attention depends on it)
                           attn:str="sdpa", # "sdpa" | "flash_attention_2" | "eager"
                          ) -> int: # bytes per token, one layer, no checkpointing
    "Bytes one decoder layer saves for backward, per token."
    h, q, kv, i = s.hidden, s.q, s.kv, s.intermediate
    b = 16 * h + 10 * q + 8 * kv + 8 * i + 4 * s.heads + 8
    if s.qk_norm != "none": b += 6 * q + 6 * kv
    if attn == "eager": b += 6 * s.heads * seq_len
    return b

def backward_working_bytes(s:ModelShape, # the model
                          ) -> int: # bytes per token
    "Gradient tensors alive at once while one layer runs backward (bf16)."
    return 3 * 2 * s.intermediate + 2 * 2 * s.hidden

# %%
s05 = ARCHS["Qwen2.5-0.5B"]
print(f"Qwen2.5-0.5B: {layer_activation_bytes(s05, 1024):,} bytes per token per layer, "
      f"{layer_activation_bytes(s05, 1024) * s05.layers / 2**20:.2f} MiB per token for the whole model")
test_eq(layer_activation_bytes(s05, 1024), 16*896 + 10*896 + 8*128 + 8*4864 + 4*14 + 8)

# %% [markdown]
# The whole model's saved activations for `tokens = B·T` tokens (plus the final norm's `8h`), and the
# extra alive while the first layer to run backward does so:

# %%
#| export
def activations_bytes(s:ModelShape, # the model
                      tokens:int, # B·T tokens in one micro-batch
                      seq_len:int, # `T`
                      grad_ckpt:bool=True, # gradient checkpointing (keep only each layer's input)
                      attn:str="sdpa", # attention implementation
                     ) -> dict[str, int]: # saved (all layers), working (one layer's backward) in bytes
    "Activation memory of one micro-batch: saved for backward, and one layer's backward working set."
    per_layer = layer_activation_bytes(s, seq_len, attn)
    saved_per_layer = 2 * s.hidden if grad_ckpt else per_layer
    saved = tokens * (s.layers * saved_per_layer + 8 * s.hidden)
    working = tokens * (backward_working_bytes(s) + (per_layer if grad_ckpt else 0))
    return {"saved": saved, "working": working}

# %%
a = activations_bytes(s05, 8 * 1024, 1024, grad_ckpt=False)
print({k: f"{v/2**30:.2f} GiB" for k, v in a.items()}, "without checkpointing;",
      {k: f"{v/2**30:.2f} GiB" for k, v in activations_bytes(s05, 8 * 1024, 1024).items()}, "with")

# %% [markdown]
# ### The loss head: logits
#
# The output projection turns `B·T` hidden states into `B·T·V` logits — for Qwen's `V = 151,936`, a
# 1,024-token sequence has 156M of them. HF's `labels=` loss (`ForCausalLMLoss`) casts them to fp32,
# and `cross_entropy` saves its fp32 log-softmax. Backward of the loss then holds, at once, the
# log-softmax (4 bytes per entry), the NLL gradient (4) and the log-softmax gradient (4): **12 bytes per
# token×vocab entry**, 14 if the caller still holds the bf16 logits of the model's output (forward peaks
# at 2 + 4 + 4 = 10).
#
# grpo-nb's `token_logprobs` (issue 4, `grpo_nb.loss`) never materialises them: it walks `chunk`
# tokens at a time and recomputes each chunk in backward. Its peak is about eight bytes per entry of
# *one chunk* (the fp32 logits and their exponentials), plus the fp32 `[V, h]` accumulator of the output
# projection's gradient and its bf16 matmul result (6 bytes per entry of `V·h`), plus the `[B·T, h]`
# gradient of the hidden states.

# %%
#| export
LogitsMode = Literal["chunked", "full"]

def logits_bytes(tokens:int, # B·T tokens in the micro-batch
                 vocab:int, # `V`
                 hidden:int, # `h`
                 mode:str="chunked", # "chunked" (grpo_nb.loss.token_logprobs) | "full" (HF labels= loss)
                 chunk:int=1024, # tokens per chunk (learner.logprob_chunk)
                 keep_logits:bool=False, # "full": the caller still holds the model output's bf16 logits in backward
                ) -> int: # peak bytes of the loss head during forward + backward
    "Peak memory of computing per-token log-probs (or the LM loss) and their gradient."
    if mode == "full": return tokens * vocab * (14 if keep_logits else 12)
    if mode == "chunked": return 8 * min(chunk, tokens) * vocab + 6 * vocab * hidden + 2 * tokens * hidden
    raise ValueError(f"logits mode must be 'chunked' or 'full' (got {mode!r}).")

# %%
full, ch = logits_bytes(8192, 151936, 896, "full"), logits_bytes(8192, 151936, 896, "chunked", 1024)
print(f"8×1024 tokens, V=151,936: HF loss {full/2**30:.1f} GiB, chunked (1,024) {ch/2**30:.2f} GiB")
test_eq(logits_bytes(10, 100, 4, "full"), 12000)

# %% [markdown]
# ### ZeRO-3's gathered parameters (the "all-gather" peak)
#
# Under ZeRO-3 each module's parameters are all-gathered (full size, bf16) before the module runs and
# released afterwards — *unless* DeepSpeed's coordinator sees the same parameter used again within
# `stage3_max_reuse_distance` elements of the recorded trace (`partitioned_param_coordinator.py`,
# `__params_to_release`). Forward of layer `l` is followed by the forward of the layers after it, the
# output projection, and then their backward (with checkpointing, their recomputed forward too), so
# layer `l` stays gathered when the parameters used in between — the later layers twice (three times
# with checkpointing) plus the head — stay below the distance (10⁹ by default). Small models therefore
# stay mostly gathered from forward to backward; large ones keep the last layers within that distance,
# plus up to `stage3_prefetch_bucket_size` elements fetched ahead and the module being computed. That is
# the seeds' "OOM during all-gather". The first step records the trace and releases everything; the
# planner gives the steady state from step 2 on.
#
# `zero3_gathered` replays that rule over the forward/backward order of modules (with checkpointing,
# each layer runs forward again right before its backward). grpo-nb's chunked log-probs run inside the
# output projection's module (`grpo_nb.learner.LogProbHead`), so ZeRO-3 gathers and releases its weight
# like any other module's.

# %%
#| export
def _trace(s:ModelShape, grad_ckpt:bool, threshold:int) -> list[tuple[str, int, int]]:
    "(module, partitioned elements, its largest parameter) in the order a step uses them."
    mods = layer_modules(s)
    layer_n, layer_big = sum(n for n in mods.values() if n >= threshold), max(mods.values())
    embed = ("embed", s.vocab * s.hidden, s.vocab * s.hidden)
    head = embed if s.tie_word_embeddings else ("head", s.vocab * s.hidden, s.vocab * s.hidden)
    L = [(f"layer{l}", layer_n, layer_big) for l in range(s.layers)]
    back = [x for l in reversed(L) for x in ([l, l] if grad_ckpt else [l])]
    return [embed, *L, head, head, *back, embed]

@functools.lru_cache(maxsize=256)
def zero3_gathered(s:ModelShape, # the model
                   grad_ckpt:bool=True, # checkpointing re-gathers each layer in backward
                   knobs:ZeroKnobs=ZeroKnobs(), # reuse distance, prefetch bucket, persistence threshold
                  ) -> dict[str, int]: # elements gathered at the loss, at the start and end of backward; peak
    "Elements ZeRO-3 holds gathered (full size, on every GPU) at each moment of a steady-state step."
    tr = _trace(s, grad_ckpt, knobs.stage3_param_persistence_threshold)
    until = {}  # trace position -> last position up to which this use keeps the module gathered
    for pos, (name, n, _) in enumerate(tr):
        seen, keep = 0, pos
        for r in range(pos + 1, len(tr)):
            if seen >= knobs.stage3_max_reuse_distance: break
            if tr[r][0] == name: keep = r; break
            seen += tr[r][1]
        until[pos] = keep
    def live(t):
        kept = {tr[p][0]: tr[p][1] for p in range(t) if until[p] >= t}
        name = tr[t][0]
        cur = tr[t][1] if name in kept else tr[t][2]  # a kept layer is whole; otherwise its largest module
        kept.pop(name, None)
        held = sum(kept.values())
        nxt = [(n, big) for nm, n, big in tr[t + 1:t + 3] if nm not in kept and nm != name]
        bucket = knobs.stage3_prefetch_bucket_size
        fetch = 0 if not bucket else min(sum(n for n, _ in nxt), bucket + max((b for _, b in nxt), default=0),
                                         max(0, knobs.stage3_max_live_parameters - held))  # stops once the bucket is full (+ one parameter)
        return held + cur + fetch
    L = s.layers
    at = [live(t) for t in range(len(tr))]
    return {"loss": at[L + 2], "backward_start": at[L + 3], "backward_end": at[len(tr) - 2], "peak": max(at)}

def persistent_params(s:ModelShape, # the model
                      threshold:int=100_000, # stage3_param_persistence_threshold
                     ) -> int: # elements
    "Parameters ZeRO-3 never partitions (smaller than the threshold: norms, biases)."
    return sum(n for n in layer_modules(s).values() if n < threshold) * s.layers + s.hidden

# %%
for name in ["Qwen2.5-0.5B", "Qwen2.5-7B", "Qwen2.5-32B"]:
    g, P = zero3_gathered(ARCHS[name]), param_counts(ARCHS[name])["total"]
    print(f"{name:<13} gathered at the loss {2*g['loss']/1e9:5.2f} GB, peak {2*g['peak']/1e9:5.2f} GB "
          f"(whole model in bf16: {2*P/1e9:6.1f} GB)")
g0 = zero3_gathered(ARCHS["Qwen2.5-32B"], knobs=ZeroKnobs(stage3_max_reuse_distance=0))
print(f"Qwen2.5-32B with stage3_max_reuse_distance=0: peak {2*g0['peak']/1e9:.2f} GB")

# %% [markdown]
# ### Fixed allocations and what `max_memory_allocated` does not see
#
# Inside PyTorch's allocator a few allocations do not scale with anything above: the cuBLAS workspace
# (`CUBLAS_WORKSPACE_CONFIG`, 32 MiB on Hopper here) and small tensors (rotary tables, loss scalars,
# DeepSpeed flags). Outside it — invisible to `max_memory_allocated` but not to the GPU — are the CUDA
# context and kernels (about 0.5-1 GiB per process), NCCL's buffers (a few hundred MiB per
# communicator) and the allocator's *fragmentation*: the caching allocator reserves whole segments, and
# reserved memory runs 5-20% above allocated memory in long jobs. The planner keeps these as named
# numbers; `peak_bytes` is what `max_memory_allocated` reports, `total_bytes` what the GPU must have.

# %%
#| export
@dataclass(frozen=True)
class Overheads:
    "Memory outside the formulas: inside the allocator (fixed) and outside it (context, NCCL, fragmentation)."
    fixed_bytes:int=64 * 2**20 # allocator-visible constants: cuBLAS workspace (32 MiB) + small tensors
    cuda_context_bytes:int=1 * GiB # CUDA context, kernels, cuDNN/cuBLAS handles (not in max_memory_allocated)
    nccl_bytes:int=GiB // 2 # NCCL communicator buffers when N > 1 (not in max_memory_allocated)
    fragmentation:float=1.10 # reserved / allocated of PyTorch's caching allocator
    engine_cuda_graph_bytes:int=GiB // 2 # vLLM CUDA graphs (0 with enforce_eager)

# %% [markdown]
# ### A reference policy
#
# A KL penalty needs log-probs of a frozen reference model. On the GPU it costs its bf16 weights
# (sharded `1/N` when run under ZeRO-3, as open-instruct does) — its no-grad forward runs before the
# policy's and its activations are gone by then. On the CPU it costs no GPU memory but `2·P` bytes of
# host memory and a slow forward.

# %%
#| export
RefPolicy = Literal["none", "gpu", "cpu"]

def ref_policy_bytes(n_params:int, # `P`
                     where:str="none", # "none" | "gpu" | "cpu"
                     zero:int=3, # a ZeRO-3 reference is partitioned over the learners
                     learners:int=1, # `N`
                    ) -> int: # GPU bytes per learner
    "GPU memory of a frozen bf16 reference policy."
    if where != "gpu": return 0
    return 2 * (math.ceil(n_params / learners) if zero == 3 else n_params)

# %% [markdown]
# ## Adding it up
#
# `learner_memory` evaluates every term for one configuration and adds them per phase. Its result
# lists each term's bytes *at the peak phase* (so the terms sum to `peak_bytes`), every phase's
# breakdown, the host memory that offload uses, and `total_bytes` with the overheads.

# %%
#| export
@dataclass
class LearnerMemory:
    "Per-GPU memory of one learner; the terms are their values at the peak phase and sum to `peak_bytes`."
    params_bytes:int # bf16 weights (ZeRO-3: the partition and persistent small parameters)
    grads_bytes:int # bf16 gradients (alive at the peak phase)
    optimizer_bytes:int # fp32 master weights + optimizer moments
    activations_bytes:int # saved activations + one layer's backward working set (at the peak phase)
    logits_bytes:int # the loss head (at the peak phase)
    gathered_params_bytes:int # ZeRO-3 parameters gathered at the peak phase
    buffers_bytes:int # DeepSpeed reduce / all-reduce buckets
    step_transient_bytes:int # fp32 gradient copy of the optimizer step (at the peak phase)
    ref_policy_bytes:int # reference policy weights on the GPU
    fixed_bytes:int # cuBLAS workspace and small tensors
    peak_bytes:int # sum of the above: what torch.cuda.max_memory_allocated() should report
    peak_phase:str # "loss" | "backward_start" | "backward_end" | "step"
    total_bytes:int # peak × fragmentation + CUDA context + NCCL: what the GPU must have
    host_bytes:int # CPU memory for offloaded states and a CPU reference policy
    phases:dict # phase -> {term: bytes}

# %%
#| export
TERMS = ["params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
         "gathered_params_bytes", "buffers_bytes", "step_transient_bytes", "ref_policy_bytes", "fixed_bytes"]

def learner_memory(model:str|ModelShape, # built-in name, HF dir/config.json, or a `ModelShape`
                   learners:int=1, # `N`: learner GPUs (ZeRO data-parallel world)
                   zero:int=3, # ZeRO stage 0-3
                   offload:str="none", # "none" | "optimizer" | "all"
                   micro_batch:int=1, # `B`: sequences per micro-batch (1 with packing)
                   seq_len:int=2048, # `T`: tokens per sequence (the pack length with packing)
                   grad_ckpt:bool=True, # gradient checkpointing
                   attn:str="sdpa", # "sdpa" | "flash_attention_2" | "eager"
                   logits:str="chunked", # "chunked" (grpo-nb) | "full" (HF labels= loss)
                   logprob_chunk:int=1024, # tokens per chunk of the chunked log-probs
                   optimizer:str="adamw", # "adamw" | "adamw-8bit"
                   ref_policy:str="none", # "none" | "gpu" | "cpu"
                   keep_logits:bool=False, # logits="full": the caller holds the output logits through backward
                   adam:str="fused", # torch AdamW implementation: "fused" (grpo-nb on GPU) | "foreach" | "single-tensor" (CPU)
                   knobs:ZeroKnobs=ZeroKnobs(), # DeepSpeed buckets and ZeRO-3 settings
                   overheads:Overheads=Overheads(), # fixed and outside-the-allocator memory
                  ) -> LearnerMemory:
    "Per-GPU memory of a DeepSpeed learner, term by term and phase by phase."
    s = get_shape(model)
    _check_learner(zero, offload, learners, micro_batch, seq_len, attn, logits, logprob_chunk, optimizer, ref_policy)
    P, tokens = param_counts(s)["total"], micro_batch * seq_len
    pers = persistent_params(s, knobs.stage3_param_persistence_threshold)
    w = weights_bytes(P, zero, learners, offload, pers)
    opt = optimizer_bytes(P, zero, learners, offload, optimizer)
    g_end = grads_bytes(P, zero, learners, offload)
    g_start = {1: 4 * P, 3: g_end}.get(zero, 0)  # ZeRO-1's fp32 accumulator and ZeRO-3's partition buffer exist from start-up
    buf = buffers_bytes(P, zero, learners, knobs)
    buf_fwd = buf if zero == 3 else 0  # ZeRO-2 allocates its bucket at the first gradient
    buf_bwd = buf if zero >= 2 else 0  # ZeRO-0/1 all-reduce after backward
    act = activations_bytes(s, tokens, seq_len, grad_ckpt, attn)
    head = logits_bytes(tokens, s.vocab, s.hidden, logits, logprob_chunk, keep_logits)
    gath = {k: 2 * v for k, v in zero3_gathered(s, grad_ckpt, knobs).items()} if zero == 3 else {}
    ref = ref_policy_bytes(P, ref_policy, zero, learners)
    base = dict(params_bytes=w, optimizer_bytes=opt, ref_policy_bytes=ref, fixed_bytes=overheads.fixed_bytes)
    zero_terms = dict.fromkeys(TERMS, 0)
    phases = {
        "loss": {**zero_terms, **base, "grads_bytes": g_start, "buffers_bytes": buf_fwd, "activations_bytes": act["saved"],
                 "logits_bytes": head, "gathered_params_bytes": gath.get("loss", 0)},
        "backward_start": {**zero_terms, **base, "grads_bytes": g_start + embedding_grad_bytes(s, zero, "backward_start"), "buffers_bytes": buf_bwd,
                           "activations_bytes": act["saved"] + act["working"], "gathered_params_bytes": gath.get("backward_start", 0)},
        "backward_end": {**zero_terms, **base, "grads_bytes": g_end + embedding_grad_bytes(s, zero, "backward_end"), "buffers_bytes": buf,
                         "activations_bytes": act["working"], "gathered_params_bytes": gath.get("backward_end", 0)},
        "step": {**zero_terms, **base, "grads_bytes": g_end, "buffers_bytes": buf if zero == 3 else 0,
                 "step_transient_bytes": step_transient_bytes(P, zero, learners, offload, knobs, adam, s.vocab * s.hidden)},
    }
    totals = {k: sum(v.values()) for k, v in phases.items()}
    phase = max(totals, key=totals.get)
    peak = totals[phase]
    total = int(peak * overheads.fragmentation) + overheads.cuda_context_bytes + (overheads.nccl_bytes if learners > 1 else 0)
    own = math.ceil(P / learners)
    host = ((int(own * (4 + moment_bytes_per_param(optimizer))) + 4 * own) if offload != "none" else 0) \
           + (2 * own if offload == "all" else 0) + (2 * P if ref_policy == "cpu" else 0)  # states + fp32 grads; bf16 params
    return LearnerMemory(**phases[phase], peak_bytes=peak, peak_phase=phase, total_bytes=total, host_bytes=host, phases=phases)

def _check_learner(zero, offload, learners, micro_batch, seq_len, attn, logits, chunk, optimizer, ref_policy):
    if zero not in (0, 1, 2, 3): raise ValueError(f"zero must be 0, 1, 2 or 3 (got {zero}).")
    if offload not in ("none", "optimizer", "all"): raise ValueError(f"offload must be none, optimizer or all (got {offload!r}).")
    if offload != "none" and zero < 2: raise ValueError(f"offload={offload!r} needs ZeRO stage 2 or 3 (got {zero}); use --zero 3.")
    if offload == "all" and zero != 3: raise ValueError("offload='all' (parameters) needs ZeRO-3; use --zero 3 or --offload optimizer.")
    for n, v in [("learners", learners), ("micro_batch", micro_batch), ("seq_len", seq_len), ("logprob_chunk", chunk)]:
        if v < 1: raise ValueError(f"{n} must be at least 1 (got {v}).")
    if attn not in ("sdpa", "flash_attention_2", "eager"): raise ValueError(f"attn must be sdpa, flash_attention_2 or eager (got {attn!r}).")
    if logits not in ("chunked", "full"): raise ValueError(f"logits must be 'chunked' or 'full' (got {logits!r}).")
    moment_bytes_per_param(optimizer)
    if ref_policy not in ("none", "gpu", "cpu"): raise ValueError(f"ref_policy must be none, gpu or cpu (got {ref_policy!r}).")

# %%
m = learner_memory("Qwen2.5-7B", learners=8, zero=3, micro_batch=2, seq_len=4096)
print(f"peak {m.peak_bytes/GiB:.1f} GiB in phase {m.peak_phase!r}; with overheads {m.total_bytes/GiB:.1f} GiB")
for k in TERMS: print(f"  {k:<22} {getattr(m, k)/GiB:7.2f} GiB")
test_eq(sum(getattr(m, k) for k in TERMS), m.peak_bytes)

# %% [markdown]
# A hand-checked case: a 1,000-parameter toy would drown in the 1 GB bucket, so the check uses ZeRO-0
# on one GPU, where the step phase is `2P` weights + `12P` Adam + `2P` gradients + `4P` fp32
# transient = **20 bytes per parameter** — 4 more than the "16 bytes" rule, which forgets the transient.

# %%
m0 = learner_memory("Qwen2.5-0.5B", learners=1, zero=0, micro_batch=1, seq_len=16, overheads=Overheads(fixed_bytes=0))
P05 = param_counts(s05)["total"]
test_eq(m0.peak_phase, "step"); test_eq(m0.peak_bytes, 20 * P05)
print(f"Qwen2.5-0.5B, ZeRO-0, one GPU, 16 tokens: {m0.peak_bytes/1e9:.2f} GB = 20 × {P05/1e9:.3f}B")

# %% [markdown]
# Where the peak sits moves with the configuration. Without checkpointing, activations decide; with
# HF's full logits, the loss head does; under ZeRO-0/1 on few GPUs, the optimizer step does:

# %%
for kw in [dict(zero=3, grad_ckpt=False, logits="chunked"), dict(zero=3, grad_ckpt=True, logits="full"),
           dict(zero=3, grad_ckpt=True, logits="chunked"), dict(zero=0, grad_ckpt=True, logits="chunked")]:
    m = learner_memory("Qwen2.5-1.5B", learners=1, micro_batch=8, seq_len=1024, **kw)
    print(f"{str(kw):<62} peak {m.peak_bytes/GiB:5.1f} GiB at {m.peak_phase}")

# %% [markdown]
# ## Rollout engines
#
# A vLLM engine of `TP` GPUs splits attention heads, MLP columns and the (64-padded) vocabulary over
# its GPUs; norms are replicated. Key/value heads are split too — unless there are fewer of them than
# GPUs, in which case each GPU keeps one (vLLM replicates KV heads; `TP` must then be a multiple of
# `k`). Every token in the cache stores a key and a value per layer:
#
# $$\text{KV bytes per token per GPU} = 2 \cdot L \cdot \frac{k}{TP} \cdot d \cdot \text{dtype bytes}$$
#
# (with `k/TP` at least 1). vLLM gives itself `U × GPU memory`; from that it subtracts the weights, the
# peak activations of a profiling forward over `max_num_batched_tokens` tokens and its sampler's
# logits, CUDA graphs and non-torch memory; the rest is the KV cache, in blocks of 16 tokens.

# %%
#| export
def kv_heads_per_gpu(s:ModelShape, # the model
                     tp:int=1, # GPUs of one engine
                    ) -> int:
    "Key/value heads one engine GPU stores (vLLM splits them, or replicates when there are fewer than TP)."
    if s.heads % tp: raise ValueError(f"TP={tp} must divide the {s.heads} attention heads of {s.name}; "
                                      f"valid TP: {', '.join(str(t) for t in valid_tps(s))}.")
    if tp >= s.kv_heads:
        if tp % s.kv_heads: raise ValueError(f"TP={tp} must be a multiple of the {s.kv_heads} KV heads of {s.name}; "
                                             f"valid TP: {', '.join(str(t) for t in valid_tps(s))}.")
        return 1
    if s.kv_heads % tp: raise ValueError(f"TP={tp} must divide the {s.kv_heads} KV heads of {s.name}; "
                                         f"valid TP: {', '.join(str(t) for t in valid_tps(s))}.")
    return s.kv_heads // tp

def valid_tps(s:ModelShape, # the model
              limit:int=64, # largest TP considered
             ) -> list[int]:
    "Tensor-parallel sizes vLLM accepts for `s`."
    return [t for t in range(1, limit + 1) if s.heads % t == 0 and (s.kv_heads % t == 0 if t < s.kv_heads else t % s.kv_heads == 0)]

def kv_bytes_per_token(s:ModelShape, # the model
                       tp:int=1, # GPUs of one engine
                       dtype_bytes:int=2, # 2 for bf16/fp16 cache, 1 for fp8
                      ) -> int: # bytes per token per GPU
    "KV-cache bytes one token costs on each engine GPU: 2·L·(k/TP)·d·dtype_bytes."
    return 2 * s.layers * kv_heads_per_gpu(s, tp) * s.head_dim * dtype_bytes

# %%
for name in ["Qwen2.5-7B", "Qwen3-32B", "Llama-3.1-70B"]:
    s = ARCHS[name]
    print(f"{name:<14} KV per token: TP=1 {kv_bytes_per_token(s)/1024:6.1f} KiB, TP=4 {kv_bytes_per_token(s, 4)/1024:6.1f} KiB per GPU")
test_eq(kv_bytes_per_token(ARCHS["Qwen2.5-7B"]), 2 * 28 * 4 * 128 * 2)  # 57,344 bytes
test_eq(kv_bytes_per_token(ARCHS["Qwen2.5-7B"], tp=4), 2 * 28 * 1 * 128 * 2)
test_fail(lambda: kv_bytes_per_token(ARCHS["Qwen2.5-7B"], tp=3), contains="valid TP: 1, 2, 4")

# %%
#| export
def engine_weights_bytes(s:ModelShape, # the model
                         tp:int=1, # GPUs of one engine
                         dtype_bytes:int=2, # bf16 weights
                        ) -> int: # bytes per GPU
    "Weights on one engine GPU: heads, MLP columns and padded vocabulary split TP ways, norms replicated."
    h, d, kvg = s.hidden, s.head_dim, kv_heads_per_gpu(s, tp)
    q, kv, i = s.q // tp, kvg * d, math.ceil(s.intermediate / tp)
    vocab = math.ceil(math.ceil(s.vocab / 64) * 64 / tp)
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    if s.attention_bias: layer += q + 2 * kv
    if s.qk_norm == "head": layer += 2 * d
    if s.qk_norm == "full": layer += s.q + s.kv
    n = vocab * h * (1 if s.tie_word_embeddings else 2) + s.layers * layer + h
    return n * dtype_bytes

def engine_activation_bytes(s:ModelShape, # the model
                            tp:int=1, # GPUs of one engine
                            max_num_batched_tokens:int=8192, # tokens of vLLM's profiling forward
                            max_num_seqs:int=256, # sequences the sampler handles at once
                           ) -> int: # bytes per GPU
    "Peak of vLLM's no-grad profiling forward: residual, norm and MLP buffers, plus fp32 sampler logits."
    per_token = 2 * (2 * s.hidden) + 2 * (3 * math.ceil(s.intermediate / tp))  # residual + normed; gate_up + act
    return max_num_batched_tokens * per_token + 2 * 4 * max_num_seqs * s.vocab

# %%
#| export
@dataclass
class EngineMemory:
    "Per-GPU memory of one rollout engine (vLLM) and what its KV cache holds."
    tp:int # GPUs of the engine
    weights_bytes:int # bf16 weights on one GPU
    activation_bytes:int # profiling-forward peak that vLLM reserves
    overhead_bytes:int # CUDA context, CUDA graphs, NCCL
    budget_bytes:int # gpu_memory_utilization × GPU memory
    kv_bytes_per_token:int # per GPU
    kv_cache_bytes:int # what is left for the KV cache (0 when nothing is left)
    max_tokens:int # tokens the cache holds (whole 16-token blocks)
    tokens_per_seq:int # one sequence's cache footprint (prompt + generation, rounded up to blocks)
    max_concurrent_seqs:int # sequences of `tokens_per_seq` that fit at once (≤ max_num_seqs)
    fits:bool # weights fit and at least one whole sequence fits in the cache

def engine_memory(model:str|ModelShape, # built-in name, HF dir/config.json, or a `ModelShape`
                  tp:int=1, # tensor-parallel GPUs of one engine
                  gpu_memory_utilization:float=0.9, # `U`
                  gpu_mem_gib:float=80.0, # memory of one GPU in GiB
                  seq_len:int=2048, # prompt + generated tokens of one sequence
                  kv_dtype_bytes:int=2, # 2 (bf16) or 1 (fp8 KV cache)
                  max_num_seqs:int=256, # vLLM's limit on concurrent sequences
                  max_num_batched_tokens:int=8192, # vLLM's tokens per forward (chunked prefill)
                  enforce_eager:bool=False, # no CUDA graphs
                  overheads:Overheads=Overheads(), # context, NCCL, CUDA-graph sizes
                 ) -> EngineMemory:
    "Weights, KV budget, cache capacity and concurrency of one vLLM engine GPU."
    s = get_shape(model)
    if not 0 < gpu_memory_utilization <= 1: raise ValueError(f"gpu_memory_utilization must be in (0, 1] (got {gpu_memory_utilization}).")
    kvt = kv_bytes_per_token(s, tp, kv_dtype_bytes)
    w = engine_weights_bytes(s, tp)
    act = engine_activation_bytes(s, tp, max_num_batched_tokens, max_num_seqs)
    over = overheads.cuda_context_bytes + (0 if enforce_eager else overheads.engine_cuda_graph_bytes) + (overheads.nccl_bytes if tp > 1 else 0)
    budget = int(gpu_memory_utilization * gpu_mem_gib * GiB)
    cache = max(0, budget - w - act - over)
    max_tokens = cache // kvt // 16 * 16
    per_seq = math.ceil(seq_len / 16) * 16
    return EngineMemory(tp, w, act, over, budget, kvt, cache, max_tokens, per_seq,
                        min(max_num_seqs, max_tokens // per_seq), max_tokens >= per_seq)

# %%
e = engine_memory("Qwen2.5-7B", tp=1, gpu_memory_utilization=0.9, gpu_mem_gib=80, seq_len=4096)
print(f"Qwen2.5-7B on one 80 GiB GPU at U=0.9: weights {e.weights_bytes/GiB:.1f} GiB, KV cache {e.kv_cache_bytes/GiB:.1f} GiB "
      f"= {e.max_tokens:,} tokens = {e.max_concurrent_seqs} sequences of 4,096 tokens")
test_eq(e.max_tokens, e.kv_cache_bytes // 57344 // 16 * 16)

# %% [markdown]
# ## The verdict, and the change that makes it fit
#
# `plan` puts learner and engine together against the GPU's memory. When something does not fit, it
# tries the usual changes one at a time — checkpointing, chunked log-probs, more learners, a smaller
# micro-batch, offload, a shorter sequence (`pack_length`); for the engine a larger TP or a higher
# `gpu_memory_utilization` — and reports each one that works, with its new footprint. The same search
# gives the minimum learner count and the minimum TP for a model.

# %%
#| export
def _learner_fits(m:LearnerMemory, gpu_mem_gib:float) -> bool: return m.total_bytes <= gpu_mem_gib * GiB

def min_learner_gpus(model:str|ModelShape, # the model
                     gpu_mem_gib:float=80.0, # memory of one GPU in GiB
                     max_gpus:int=4096, # give up above this many
                     **kw, # any other `learner_memory` argument (zero, micro_batch, seq_len, ...)
                    ) -> Optional[int]: # smallest N that fits, or None
    "Fewest learner GPUs on which one learner fits (memory never grows with N)."
    kw.setdefault("zero", 3)
    fits = lambda n: _learner_fits(learner_memory(model, learners=n, **kw), gpu_mem_gib)
    if not fits(max_gpus): return None
    lo, hi = 1, max_gpus
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo

def min_engine_tp(model:str|ModelShape, # the model
                  **kw, # any other `engine_memory` argument (gpu_memory_utilization, gpu_mem_gib, seq_len, ...)
                 ) -> Optional[int]: # smallest valid TP that fits, or None
    "Smallest tensor-parallel size whose engine holds its weights and at least one sequence."
    s = get_shape(model)
    return next((t for t in valid_tps(s) if engine_memory(s, tp=t, **kw).fits), None)

# %%
for name in ["Qwen2.5-7B", "OLMo-2-32B", "Llama-3.1-70B"]:
    n = min_learner_gpus(name, gpu_mem_gib=80, micro_batch=1, seq_len=4096)
    print(f"{name:<14} min learner GPUs (80 GiB, ZeRO-3, 1×4096, checkpointing): {n}; min engine TP: {min_engine_tp(name, seq_len=4096)}")

# %%
#| export
@dataclass
class Plan:
    "A whole job's verdict: learner and engine memory per GPU, whether they fit, and what to change."
    model:ModelShape # the model
    settings:dict # the arguments the plan was made with
    learner:LearnerMemory # per learner GPU
    engine:EngineMemory # per engine GPU
    learner_fits:bool # learner total ≤ GPU memory
    engine_fits:bool # engine weights and one sequence fit in its budget
    advice:list # changes that make it fit (or the headroom, when it does)

    @property
    def fits(self) -> bool: return self.learner_fits and self.engine_fits

# %%
#| export
def _gib(b) -> str: return f"{b / GiB:.1f} GiB"

def _advice(s, st:dict, lm:LearnerMemory, em:EngineMemory, lfit:bool, efit:bool) -> list[str]:
    "Single changes that make a non-fitting plan fit, each with its new footprint."
    G, out = st["gpu_mem_gib"], []
    lkw = {k: st[k] for k in _LEARNER_ARGS}
    def tot(**ch): return learner_memory(s, **{**lkw, **ch})
    def ok(**ch):
        try: return _learner_fits(tot(**ch), G)
        except ValueError: return False
    if not lfit:
        if not st["grad_ckpt"] and ok(grad_ckpt=True): out.append(f"--grad-ckpt: learner {_gib(tot(grad_ckpt=True).total_bytes)}")
        if st["logits"] == "full" and ok(logits="chunked"): out.append(f"--logits chunked: learner {_gib(tot(logits='chunked').total_bytes)}")
        for z in sorted({st["zero"], 3}):
            n = min_learner_gpus(s, G, **{**{k: v for k, v in lkw.items() if k != "learners"}, "zero": z})
            if n and n > st["learners"]:
                out.append(f"{'--zero 3 ' if z != st['zero'] else ''}--learner-gpus {n}: learner {_gib(tot(zero=z, learners=n).total_bytes)}")
        b = next((b for b in range(st["micro_batch"] - 1, 0, -1) if ok(micro_batch=b)), None)
        if b: out.append(f"--micro-batch {b}: learner {_gib(tot(micro_batch=b).total_bytes)}")
        for off in ("optimizer", "all"):
            if off != st["offload"] and ok(offload=off, zero=3):
                z = "" if st["zero"] == 3 else "--zero 3 "
                out.append(f"{z}--offload {off}: learner {_gib(tot(offload=off, zero=3).total_bytes)} (slower; host memory {_gib(tot(offload=off, zero=3).host_bytes)})")
                break
        t = next((t for t in range(st["seq_len"] // 256 * 256, 0, -256) if t < st["seq_len"] and ok(seq_len=t)), None)
        if t: out.append(f"--seq-len {t} (learner.pack_length): learner {_gib(tot(seq_len=t).total_bytes)}")
        if not out: out.append("no single change makes the learner fit: combine more learners with offload, or use larger GPUs")
    if not efit:
        ekw, n0 = {"gpu_memory_utilization": st["gpu_memory_utilization"], "gpu_mem_gib": G, "seq_len": st["engine_seq_len"]}, len(out)
        tp = next((t for t in valid_tps(s) if t > st["engine_tp"] and engine_memory(s, tp=t, **ekw).fits), None)
        if tp: out.append(f"--engine-tp {tp}: {engine_memory(s, tp=tp, **ekw).max_concurrent_seqs} sequences of {st['engine_seq_len']} tokens per engine")
        if st["gpu_memory_utilization"] < 0.95 and engine_memory(s, tp=st["engine_tp"], **{**ekw, "gpu_memory_utilization": 0.95}).fits:
            out.append("--gpu-memory-utilization 0.95 (engine GPUs must not be shared)")
        if len(out) == n0: out.append(f"no valid engine TP holds one sequence of {st['engine_seq_len']} tokens: shorten --seq-len or use larger GPUs")
    if lfit and efit:
        b = max((b for b in (st["micro_batch"] * 2 ** j for j in range(1, 8)) if ok(micro_batch=b)), default=None)
        out.append(f"fits: learner headroom {_gib(G * GiB - lm.total_bytes)}" + (f", micro-batch up to {b} fits" if b else "")
                   + f"; each engine holds {em.max_concurrent_seqs} sequences of {st['engine_seq_len']} tokens")
    return out

# %% [markdown]
# (The engine here is one GPU's view: an engine with `TP` GPUs holds `max_concurrent_seqs` sequences in
# total, because each GPU caches its share of every sequence's heads.)

# %%
#| export
_LEARNER_ARGS = ("learners", "zero", "offload", "micro_batch", "seq_len", "grad_ckpt", "attn", "logits",
                 "logprob_chunk", "optimizer", "ref_policy")

def plan(model:str|ModelShape, # built-in name, HF dir/config.json, or a `ModelShape`
         learners:int=1, # `N` learner GPUs
         zero:int=3, # ZeRO stage
         offload:str="none", # "none" | "optimizer" | "all"
         micro_batch:int=1, # `B` sequences per micro-batch
         seq_len:int=2048, # `T` tokens per sequence (prompt + generation, or the pack length)
         grad_ckpt:bool=True, # gradient checkpointing
         engine_tp:int=1, # GPUs per rollout engine
         gpu_memory_utilization:float=0.9, # vLLM's `U`
         gpu_mem_gib:float=80.0, # memory of one GPU in GiB
         attn:str="sdpa", # learner attention implementation
         logits:str="chunked", # "chunked" | "full"
         logprob_chunk:int=1024, # tokens per log-prob chunk
         optimizer:str="adamw", # "adamw" | "adamw-8bit"
         ref_policy:str="none", # "none" | "gpu" | "cpu"
         engine_seq_len:Optional[int]=None, # prompt + generated tokens per engine sequence (default: seq_len)
        ) -> Plan:
    "Learner and engine memory per GPU for one configuration, with the verdict and the changes that make it fit."
    s = get_shape(model)
    st = dict(learners=learners, zero=zero, offload=offload, micro_batch=micro_batch, seq_len=seq_len, grad_ckpt=grad_ckpt,
              engine_tp=engine_tp, gpu_memory_utilization=gpu_memory_utilization, gpu_mem_gib=gpu_mem_gib, attn=attn,
              logits=logits, logprob_chunk=logprob_chunk, optimizer=optimizer, ref_policy=ref_policy,
              engine_seq_len=engine_seq_len or seq_len)
    if gpu_mem_gib <= 0: raise ValueError(f"gpu_mem_gib must be > 0 (got {gpu_mem_gib}).")
    lm = learner_memory(s, **{k: st[k] for k in _LEARNER_ARGS})
    em = engine_memory(s, engine_tp, gpu_memory_utilization, gpu_mem_gib, st["engine_seq_len"])
    lfit, efit = _learner_fits(lm, gpu_mem_gib), em.fits
    return Plan(s, st, lm, em, lfit, efit, _advice(s, st, lm, em, lfit, efit))

# %%
p = plan("OLMo-2-32B", learners=8, zero=3, micro_batch=1, seq_len=10240, engine_tp=2, gpu_memory_utilization=0.55, gpu_mem_gib=95)
print("fits:", p.fits, "| learner", _gib(p.learner.total_bytes), "| engine KV", _gib(p.engine.kv_cache_bytes))
for a in p.advice: print("  ", a)

# %% [markdown]
# ## `grpo_nb plan`
#
# The command prints the plan as a table, or as JSON whose keys are stable (scripts and `preflight`
# read them): `model.{params, layers, hidden, vocab, kv_heads, head_dim}`, `learner.{params_bytes,
# grads_bytes, optimizer_bytes, activations_bytes, logits_bytes, gathered_params_bytes, peak_bytes}` per
# GPU (plus the other terms, `total_bytes` and the phases), `engine.{weights_bytes, kv_bytes_per_token,
# kv_cache_bytes, max_concurrent_seqs}` per GPU (plus the rest), `fits` and `advice`.
#
# **Exit codes.** A plan that does not fit is still a plan: the command prints it with `fits: false` and
# the advice, and exits **0** — deciding to stop a submission is `grpo_nb preflight`'s job. Bad
# arguments (an unknown model, a TP that does not divide the heads, offload without ZeRO-2/3) exit
# **2** with the fix on stderr.

# %%
#| export
def plan_json(p:Plan, # a plan
             ) -> dict: # JSON-ready
    "The plan as plain data with the documented keys."
    c = param_counts(p.model)
    return {"model": {"name": p.model.name, "params": c["total"], "layers": p.model.layers, "hidden": p.model.hidden,
                      "vocab": p.model.vocab, "kv_heads": p.model.kv_heads, "head_dim": p.model.head_dim,
                      "heads": p.model.heads, "intermediate": p.model.intermediate, "tie_word_embeddings": p.model.tie_word_embeddings},
            "settings": p.settings, "learner": asdict(p.learner), "engine": asdict(p.engine),
            "learner_fits": p.learner_fits, "engine_fits": p.engine_fits, "fits": p.fits, "advice": p.advice}

def format_plan(p:Plan, # a plan
               ) -> str: # a readable table
    "The plan as a table (GiB = 2³⁰ bytes)."
    s, st, lm, em, c = p.model, p.settings, p.learner, p.engine, param_counts(p.model)
    G = st["gpu_mem_gib"]
    rows = [f"model   {s.name}: {c['total']/1e9:.2f}B parameters, {s.layers} layers, h={s.hidden}, V={s.vocab}, "
            f"{s.heads} heads / {s.kv_heads} KV heads × {s.head_dim}",
            f"learner per GPU: {st['learners']} GPU(s), ZeRO-{st['zero']}, offload {st['offload']}, micro-batch {st['micro_batch']} × "
            f"{st['seq_len']} tokens, checkpointing {'on' if st['grad_ckpt'] else 'off'}, {st['logits']} log-probs"]
    rows += [f"  {k.removesuffix('_bytes').replace('_', ' '):<20} {getattr(lm, k)/GiB:8.2f} GiB" for k in TERMS]
    rows += [f"  {'peak (allocated)':<20} {lm.peak_bytes/GiB:8.2f} GiB   at phase {lm.peak_phase!r}",
             f"  {'total on the GPU':<20} {lm.total_bytes/GiB:8.2f} GiB   of {G:.1f} GiB: {'fits' if p.learner_fits else 'DOES NOT FIT'}"]
    if lm.host_bytes: rows.append(f"  {'host (CPU) memory':<20} {lm.host_bytes/GiB:8.2f} GiB")
    rows += [f"engine per GPU: TP={em.tp}, gpu_memory_utilization {st['gpu_memory_utilization']:g}, {st['engine_seq_len']} tokens per sequence",
             f"  {'weights':<20} {em.weights_bytes/GiB:8.2f} GiB",
             f"  {'activations':<20} {em.activation_bytes/GiB:8.2f} GiB",
             f"  {'context, graphs':<20} {em.overhead_bytes/GiB:8.2f} GiB",
             f"  {'KV cache':<20} {em.kv_cache_bytes/GiB:8.2f} GiB   ({em.kv_bytes_per_token/1024:.1f} KiB per token: {em.max_tokens:,} tokens)",
             f"  {'concurrent seqs':<20} {em.max_concurrent_seqs:8d}       {'fits' if p.engine_fits else 'DOES NOT FIT'}",
             f"verdict: {'fits' if p.fits else 'does not fit'}"]
    rows += [f"  - {a}" for a in p.advice]
    return "\n".join(rows)

# %%
print(format_plan(plan("Qwen2.5-7B", learners=4, micro_batch=2, seq_len=4096, engine_tp=1)))

# %%
#| export
def plan_cli(argv:list[str]|None=None) -> int:
    "`grpo_nb plan --model NAME|PATH ...`: per-GPU memory of learners and engines, the verdict and the fix."
    import argparse
    p = argparse.ArgumentParser(prog="grpo_nb plan",
        description="Per-GPU memory of DeepSpeed learners and vLLM engines, with a verdict and the change that makes it fit.",
        epilog="Exit 0 with a plan (fits or not, see `fits`), 2 on bad arguments. GiB = 2^30 bytes.")
    p.add_argument("--model", help=f"built-in name ({', '.join(ARCHS)}) or a HF model directory / config.json")
    p.add_argument("--learner-gpus", type=int, default=1, help="learner GPUs N (ZeRO world)")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=3, help="DeepSpeed ZeRO stage")
    p.add_argument("--offload", choices=["none", "optimizer", "all"], default="none", help="ZeRO offload to CPU")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch B")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence T (prompt + generation, or the pack length)")
    p.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True, help="gradient checkpointing")
    p.add_argument("--engine-tp", type=int, default=1, help="GPUs per vLLM engine")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's fraction of an engine GPU")
    p.add_argument("--gpu-mem-gib", type=float, default=80.0, help="memory of one GPU in GiB")
    p.add_argument("--logits", choices=["chunked", "full"], default="chunked", help="chunked log-probs (grpo-nb) or HF's full-logits loss")
    p.add_argument("--logprob-chunk", type=int, default=1024, help="tokens per log-prob chunk")
    p.add_argument("--optimizer", choices=["adamw", "adamw-8bit"], default="adamw", help="optimizer state format")
    p.add_argument("--ref-policy", choices=["none", "gpu", "cpu"], default="none", help="where a KL reference policy lives")
    p.add_argument("--attn", choices=["sdpa", "flash_attention_2", "eager"], default="sdpa", help="learner attention kernel")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--list-models", action="store_true", help="list the built-in models and exit")
    try: a = p.parse_args(argv)
    except SystemExit as e: return int(e.code or 0)
    if a.list_models:
        for n, s in ARCHS.items(): print(f"{n:<14} {param_counts(s)['total']/1e9:7.2f}B")
        return 0
    if not a.model:
        print("grpo_nb plan: error: --model is required (a built-in name or a HF model directory). "
              "Fix: --model Qwen2.5-7B; see --list-models.", file=sys.stderr); return 2
    try:
        pl = plan(a.model, a.learner_gpus, a.zero, a.offload, a.micro_batch, a.seq_len, a.grad_ckpt, a.engine_tp,
                  a.gpu_memory_utilization, a.gpu_mem_gib, a.attn, a.logits, a.logprob_chunk, a.optimizer, a.ref_policy)
    except ValueError as e:
        print(f"grpo_nb plan: error: {e}", file=sys.stderr); return 2
    print(json.dumps(plan_json(pl), indent=2) if a.json else format_plan(pl))
    return 0

# %%
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = plan_cli(["--model", "Qwen3-8B", "--learner-gpus", "8", "--micro-batch", "4", "--seq-len", "8192", "--json"])
j = json.loads(out.getvalue())
test_eq(rc, 0)
test_eq(set(j["model"]) >= {"params", "layers", "hidden", "vocab", "kv_heads", "head_dim"}, True)
test_eq(set(j["learner"]) >= {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
                              "gathered_params_bytes", "peak_bytes"}, True)
test_eq(set(j["engine"]) >= {"weights_bytes", "kv_bytes_per_token", "kv_cache_bytes", "max_concurrent_seqs"}, True)
print({k: j[k] for k in ("fits", "advice")})
err = io.StringIO()
with contextlib.redirect_stderr(err): test_eq(plan_cli(["--model", "Qwen3-8B", "--engine-tp", "3"]), 2)
print(err.getvalue())

# %% [markdown]
# ## From a `TrainConfig`
#
# `grpo_nb preflight` and the trainer call the same planner on a whole config: the learner world is
# `sum(cluster.learners_per_node)`, a micro-batch is `micro_batch_size` sequences of
# `max_prompt_tokens + max_new_tokens` tokens (or one packed sequence of `pack_length`), the log-probs
# are chunked by `logprob_chunk`, and the GPU size is `cluster.gpu_mem_gib`.

# %%
#| export
def plan_config(cfg, # a `grpo_nb.config.TrainConfig`
                model:str|ModelShape|None=None, # override `cfg.model.name_or_path` (e.g. a shape for a built-in tiny model)
               ) -> Plan:
    "The memory plan of a whole training config."
    from grpo_nb.config import derive
    L, R, D, C = cfg.learner, cfg.rollout, cfg.data, cfg.cluster
    seq = D.max_prompt_tokens + R.max_new_tokens
    T, B = (L.pack_length, 1) if L.pack_length else (seq, L.micro_batch_size)
    try: s = get_shape(model if model is not None else cfg.model.name_or_path)
    except ValueError as e:
        raise ValueError(f"model.name_or_path: {e} Fix: point --model.name_or_path at a HF directory, or pass model= to plan_config.") from None
    return plan(s, derive(cfg).learner_world_size, L.zero_stage, L.offload, B, T, cfg.model.gradient_checkpointing,
                R.tensor_parallel_size, R.gpu_memory_utilization, C.gpu_mem_gib, cfg.model.attn_implementation,
                "chunked", L.logprob_chunk, "adamw", L.ref_policy, engine_seq_len=seq)

# %%
cfg = load_config("default", ["--model.name_or_path=Qwen2.5-1.5B", "--cluster.learners_per_node=[4]", "--learner.micro_batch_size=4",
                              "--rollout.max_new_tokens=2048"])
pc = plan_config(cfg)
print(f"default config with Qwen2.5-1.5B: learner {_gib(pc.learner.total_bytes)} per GPU, fits={pc.fits}")
test_eq(pc.settings["seq_len"], 512 + 2048)

# %% [markdown]
# ## Memory against sequence length and learner count
#
# Stacked by term, at each setting's peak phase. The first plot shows why RL learners run out of memory
# on long sequences: without checkpointing the saved activations grow with `T`, and HF's full-logits
# loss grows with `T·V`; chunked log-probs and checkpointing flatten both. The second shows ZeRO-3's
# states shrinking as `1/N` until buckets, gathered parameters and activations — none of which shrink —
# are all that is left.

# %%
#| export
def plot_terms(model:str|ModelShape, # the model
               sweep:str, # the `learner_memory` argument to vary, e.g. "seq_len" or "learners"
               values:list, # its values
               gpu_mem_gib:Optional[float]=None, # draw the GPU's capacity
               ax=None, # matplotlib axes (default: a new figure)
               **kw, # the other `learner_memory` arguments
              ):
    "Stacked bars of the learner's per-GPU memory by term, against one swept argument."
    import matplotlib.pyplot as plt
    ms = [learner_memory(model, **{**kw, sweep: v}) for v in values]
    ax = ax or plt.subplots(figsize=(8, 3.6))[1]
    bottom = [0.0] * len(values)
    for k in TERMS:
        ys = [getattr(m, k) / GiB for m in ms]
        if not any(ys): continue
        ax.bar([str(v) for v in values], ys, bottom=bottom, label=k.removesuffix("_bytes").replace("_", " "))
        bottom = [b + y for b, y in zip(bottom, ys)]
    if gpu_mem_gib: ax.axhline(gpu_mem_gib, color="k", ls="--", lw=1, label=f"{gpu_mem_gib:g} GiB GPU")
    ax.set_xlabel(sweep); ax.set_ylabel("GiB per GPU (at the peak phase)"); ax.legend(fontsize=7, ncol=2)
    return ax

# %%
fig, axs = plt.subplots(1, 2, figsize=(13, 4))
plot_terms("Qwen2.5-7B", "seq_len", [1024, 2048, 4096, 8192, 16384], gpu_mem_gib=80, ax=axs[0], learners=8, zero=3,
           micro_batch=1, grad_ckpt=False, logits="full")
axs[0].set_title("Qwen2.5-7B, 8 learners, ZeRO-3, no checkpointing, HF loss")
plot_terms("Qwen2.5-7B", "seq_len", [1024, 2048, 4096, 8192, 16384], gpu_mem_gib=80, ax=axs[1], learners=8, zero=3,
           micro_batch=1, grad_ckpt=True, logits="chunked")
axs[1].set_title("same, with checkpointing and chunked log-probs"); plt.tight_layout()

# %%
ax = plot_terms("Qwen2.5-32B", "learners", [4, 8, 16, 32, 64], gpu_mem_gib=80, zero=3, micro_batch=1, seq_len=8192)
ax.set_title("Qwen2.5-32B, ZeRO-3, 1 × 8192 tokens, checkpointing, chunked log-probs");

# %% [markdown]
# ## An interactive planner
#
# In Jupyter, `planner_widget()` gives sliders and menus for every `plan` argument and redraws the
# table. A static page cannot run it, so the cell below also prints the plan of its default settings.

# %%
#| export
def planner_widget(model:str="Qwen2.5-7B", # initial model
                  ):
    "An ipywidgets form around `plan` (returns the widget; display it in Jupyter)."
    import ipywidgets as W
    out = W.Output()
    ctl = dict(model=W.Dropdown(options=list(ARCHS), value=model, description="model"),
               learners=W.IntSlider(8, 1, 128, description="learner GPUs"), zero=W.Dropdown(options=[0, 1, 2, 3], value=3, description="ZeRO"),
               offload=W.Dropdown(options=["none", "optimizer", "all"], value="none", description="offload"),
               micro_batch=W.IntSlider(1, 1, 32, description="micro-batch"),
               seq_len=W.Dropdown(options=[512, 1024, 2048, 4096, 8192, 16384, 32768], value=4096, description="seq len"),
               grad_ckpt=W.Checkbox(True, description="checkpointing"), logits=W.Dropdown(options=["chunked", "full"], value="chunked", description="log-probs"),
               engine_tp=W.Dropdown(options=[1, 2, 4, 8], value=1, description="engine TP"),
               gpu_memory_utilization=W.FloatSlider(0.9, min=0.3, max=0.98, step=0.01, description="vLLM U"),
               gpu_mem_gib=W.Dropdown(options=[24, 40, 48, 80, 94, 96, 141, 192], value=80, description="GPU GiB"))
    def redraw(*_):
        out.clear_output()
        with out:
            try: print(format_plan(plan(**{k: c.value for k, c in ctl.items()})))
            except ValueError as e: print(f"error: {e}")
    for c in ctl.values(): c.observe(redraw, "value")
    redraw()
    return W.VBox([W.HBox(list(ctl.values())[i:i + 4]) for i in range(0, len(ctl), 4)] + [out])

# %%
w = planner_widget()
w

# %%
print(format_plan(plan("Qwen2.5-7B", learners=8, micro_batch=1, seq_len=4096)))

# %% [markdown]
# ## Effective batch, and the seeds' scaling table computed
#
# The seed guide on Qwen3-4B (RTX 4090, ZeRO-3, 2,048 tokens) scales with
#
# $$\text{effective batch} = \text{micro-batch} \times \text{accumulation} \times \text{GPUs},$$
#
# the same rule `grpo_nb.config.derive` applies (`effective_batch`). Its table is recomputed below —
# the effective batch through `derive`, the memory through the planner with HF's loss, as the seed's
# script uses — against the 24 GB of its cards. The guide page
# [Memory tables](guides/memory_tables.ipynb) goes through every number of the seeds.

# %%
rows = [(64, 4, 2, 8, "~18GB"), (128, 8, 2, 8, "~12GB"), (256, 16, 2, 8, "~8GB"), (256, 8, 4, 8, "~18GB"), (512, 16, 4, 8, "~14GB")]
print(f"{'target':>6} {'GPUs':>4} {'micro':>5} {'accum':>5} | {'derive':>6} | {'seed says':>9} | {'planned GB':>10} {'fits 24 GB':>10}")
for target, n, mb, acc, said in rows:
    c = load_config("default", [f"--cluster.learners_per_node=[{n}]", "--cluster.gpus_per_node=16", f"--learner.micro_batch_size={mb}",
                                f"--learner.gradient_accumulation_steps={acc}", f"--rollout.prompts_per_step={target // 8}"])
    eff = derive(c).effective_batch
    m = learner_memory("Qwen3-4B", learners=n, zero=3, micro_batch=mb, seq_len=2048, grad_ckpt=True, logits="full")
    print(f"{target:>6} {n:>4} {mb:>5} {acc:>5} | {eff:>6} | {said:>9} | {m.total_bytes/1e9:>10.1f} {str(m.total_bytes <= 24e9):>10}")
    assert eff == target

# %% [markdown]
# The effective batches are right; the memory column is not (last two columns). The model states
# alone, `16·P/N`, and the HF loss's 12 bytes per token×vocab entry over Qwen3's 151,936-token
# vocabulary already exceed the seed's figures:

# %%
P4 = param_counts(ARCHS["Qwen3-4B"])["total"]
print(f"model states on 4 GPUs: {16 * P4 / 4 / 1e9:.1f} GB; HF loss of one 2×2,048-token micro-batch: "
      f"{logits_bytes(2 * 2048, 151936, 2560, 'full') / 1e9:.1f} GB")

# %% [markdown]
# Chunked log-probs and eight or more GPUs are what makes Qwen3-4B at 2,048 tokens trainable on 24 GB cards:

# %%
for n, mb in [(8, 2), (16, 2), (16, 4)]:
    m = learner_memory("Qwen3-4B", learners=n, zero=3, micro_batch=mb, seq_len=2048, logits="chunked")
    print(f"{n:>2} GPUs, micro-batch {mb}, chunked log-probs: {m.total_bytes/1e9:5.1f} GB per GPU")

# %% [markdown]
# ## Checked against GPU measurements
#
# `bench/memory_accuracy.py` runs real DeepSpeed steps (random-init Qwen2.5 shapes, bf16, sdpa, three
# optimizer steps, each configuration in a fresh process) on H100/H200 GPUs and records
# `torch.cuda.max_memory_allocated()` next to the planner's `peak_bytes`. The target is every
# configuration within 10%; where one is not, the per-phase columns say which phase (and so which
# terms) the planner gets wrong. This cell renders whatever `bench/results/memory_accuracy.json` holds.

# %%
#| export
def accuracy_table(path:str|Path="bench/results/memory_accuracy.json", # the benchmark's output
                  ) -> str: # a table, or why there is none
    "Predicted vs measured peak memory from `bench/memory_accuracy.py`."
    p = Path(path)
    if not p.exists(): return f"no measurements yet ({p} does not exist): run `python bench/memory_accuracy.py` on a GPU machine."
    d = json.loads(p.read_text())
    recs = d["records"]
    rows = [f"{'configuration':<34} {'N':>2} {'Z':>1} {'B×T':>8} {'ckpt':>4} {'logits':>7} | {'predicted':>9} {'measured':>9} {'error':>7} | "
            f"{'phase (pred)':<14} {'fwd+bwd':>8} {'step':>8}"]
    for r in recs:
        meas = r.get("measured_bytes")
        fb = max((s["fwd_bwd_peak"] for s in r.get("steps", [])), default=None)
        st = max((s["step_peak"] for s in r.get("steps", [])), default=None)
        f = lambda b: f"{b / GiB:8.2f}" if b else f"{'-':>8}"
        err = f"{100 * r['error']:+6.1f}%" if r.get("error") is not None else r.get("status", "")[:7]
        rows.append(f"{r['name']:<34} {r['learners']:>2} {r['zero']:>1} {str(r['micro_batch']) + '×' + str(r['seq_len']):>8} "
                    f"{'on' if r['grad_ckpt'] else 'off':>4} {r['logits']:>7} | {r['predicted_bytes'] / GiB:9.2f} {f(meas):>9} {err:>7} | "
                    f"{r.get('predicted_phase', ''):<14} {f(fb)} {f(st)}")
    ok = [r for r in recs if r.get("error") is not None]
    dev = sorted({r["device"] for r in ok}) or ["-"]
    rows.append(f"device: {', '.join(dev)}; GiB = 2^30 bytes; {len(ok)} measured, "
                f"{sum(abs(r['error']) <= 0.10 for r in ok)} within 10%" + (" (CPU smoke run)" if d["meta"].get("smoke") else ""))
    return "\n".join(rows)

# %%
ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "settings.ini").exists())
print(accuracy_table(ROOT / "bench/results/memory_accuracy.json"))
