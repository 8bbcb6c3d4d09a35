# %% [markdown]
# # Memory tables, recomputed
# > The seed guides' per-GPU memory tables (7B and 32B on 2/8/16 learners, Qwen3-4B on 4-16 GPUs, several models on one GPU), recomputed term by term with `grpo_nb.memory`, and where they go wrong

# %% [markdown]
# The seed documents this project grew from answer the first question of every RL run — *does it fit?* —
# with tables of per-GPU memory. Several of their numbers are wrong in ways that matter: a "training
# state" that forgets the fp32 master weights, bf16 weights counted at fp32 size, activations guessed
# instead of derived, and no line at all for the logits, which dominate RL learners over 150k-token
# vocabularies. This page recomputes each table with the planner of [Memory](../01_memory.ipynb), so
# every number here comes from a cell, and says what the seed got wrong.
#
# The seeds write "GB"; this page reads that as 10⁹ bytes and prints GB too (the planner's own tables
# print GiB = 2³⁰ bytes). Each recomputation states its assumptions: the model (the seeds name OLMo
# and Qwen3), the sequence length, micro-batch, gradient checkpointing, and how log-probs are computed
# — HF-style full logits (what the seeds' code does) or grpo-nb's chunked log-probs.

# %%
#| hide
import json
from IPython.display import Markdown
import grpo_nb.memory as mem
from grpo_nb.memory import ARCHS, param_counts, learner_memory, engine_memory, min_learner_gpus, min_engine_tp, plan

# %%
#| hide
GB = 1e9
def gb(b, nd=1): return f"{b / GB:.{nd}f}"
def md_table(headers, rows):
    "A Markdown table from header names and rows of cells."
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return Markdown("\n".join(out))

# %% [markdown]
# ## 1. "Training state: 84 GB (7B), 384 GB (32B)"
#
# The 32B guide (seed 000) sizes the whole training state at 84 GB for a 7B model and 384 GB for a 32B
# one: 12 bytes per parameter. Mixed-precision AdamW keeps **16**: bf16 weights (2) and gradients (2),
# fp32 master weights (4) and two fp32 moments (8). The seed's 12 is the optimizer's share, or the
# total without the master copy. DeepSpeed adds a transient fp32 gradient copy at the optimizer step
# (6 bytes per owned parameter under ZeRO-1/2/3), which the table shows separately.

# %%
rows = []
for name, said in [("OLMo-2-7B", "84 GB"), ("OLMo-2-32B", "384 GB")]:
    P = param_counts(ARCHS[name])["total"]
    rows.append([name, f"{P / 1e9:.2f}B", said, f"{gb(12 * P)} GB", f"**{gb(16 * P)} GB**", f"{gb(6 * P)} GB"])
md_table(["model", "parameters", "seed", "12 bytes/param (the seed's rule)", "16 bytes/param (weights, grads, master, Adam)",
          "+ step transient (fp32 grads)"], rows)

# %% [markdown]
# ## 2. The per-GPU breakdowns of the 7B and 32B setups
#
# Seed 000 gives three ZeRO-3 breakdowns on 95 GB GPUs (GH200): 7B on 2 learners, 32B on 16 and on 8
# ("tight fit!"). Its parameter and gradient lines are right — `2·P/N` each — but its "optimizer states"
# line is `8·P/N`, the Adam moments only: the fp32 master weights (`4·P/N`) are missing. Its
# activations are a guessed 15-30 GB, and it has no line for the logits, the reduce buckets or the
# parameters ZeRO-3 gathers during forward and backward (its own "OOM during all-gather" issue).
#
# The recomputation uses the seed's settings: ZeRO-3, one packed sequence per micro-batch of the
# seed's `pack_length` (16,384 tokens for the 7B runs, 10,240 for 32B production), gradient
# checkpointing, and log-probs from the full logits as open-instruct computes them; the last column
# redoes the total with grpo-nb's chunked log-probs.

# %%
cases = [("OLMo-2-7B", 2, 16384, ("~7", "~7", "~28", "~15-25", "~57-67")),
         ("OLMo-2-32B", 16, 10240, ("~4", "~4", "~16", "~20-30", "~44-54")),
         ("OLMo-2-32B", 8, 10240, ("~8", "~8", "~32", "~20-30", "~68-78"))]
rows = []
for name, n, T, said in cases:
    m = learner_memory(name, learners=n, zero=3, micro_batch=1, seq_len=T, grad_ckpt=True, logits="full")
    c = learner_memory(name, learners=n, zero=3, micro_batch=1, seq_len=T, grad_ckpt=True, logits="chunked")
    ph = m.phases["loss"]  # the seed's lines are states + activations; show them at the loss phase, where this config peaks
    rows.append([f"{name}, {n} learners, 1×{T}", f"{said[0]} / {gb(ph['params_bytes'])}", f"{said[1]} / {gb(ph['grads_bytes'])}",
                 f"{said[2]} / **{gb(ph['optimizer_bytes'])}**", f"{said[3]} / {gb(ph['activations_bytes'])}",
                 f"– / **{gb(ph['logits_bytes'])}**", f"– / {gb(ph['gathered_params_bytes'] + ph['buffers_bytes'] + ph['fixed_bytes'])}",
                 f"{said[4]} / **{gb(m.peak_bytes)}** ({m.peak_phase})", f"{gb(m.total_bytes)}", f"{gb(c.total_bytes)}"])
md_table(["setup (ZeRO-3)", "params GB (seed / computed)", "grads", "optimizer (+ master)", "activations", "logits",
          "gathered + buckets + fixed", "peak allocated", "on the GPU (+context, NCCL, fragmentation)", "… with chunked log-probs"], rows)

# %% [markdown]
# Read against the GPU's 95 GB:

# %%
for name, n, T, _ in cases:
    for logits in ("full", "chunked"):
        m = learner_memory(name, learners=n, zero=3, micro_batch=1, seq_len=T, logits=logits)
        print(f"{name} on {n:>2} learners, 1×{T}, {logits:>7} log-probs: {gb(m.total_bytes)} GB of 95 -> "
              f"{'fits' if m.total_bytes <= 95e9 else 'does NOT fit'}")

# %% [markdown]
# The minimum learner counts follow from the same planner (95 GB GPUs, the same sequence lengths):

# %%
G95 = 95e9 / 2**30  # the seed's 95 GB in GiB, the planner's unit
rows = []
for name, T, said in [("OLMo-2-7B", 16384, "2"), ("OLMo-2-32B", 10240, "8")]:
    full = min_learner_gpus(name, gpu_mem_gib=G95, micro_batch=1, seq_len=T, logits="full")
    chunked = min_learner_gpus(name, gpu_mem_gib=G95, micro_batch=1, seq_len=T, logits="chunked")
    off = min_learner_gpus(name, gpu_mem_gib=G95, micro_batch=1, seq_len=T, logits="chunked", offload="optimizer")
    rows.append([name, T, said, full, chunked, off])
md_table(["model", "tokens per micro-batch", "seed: min learner GPUs", "computed (full logits)", "computed (chunked)",
          "chunked + optimizer offload"], rows)

# %% [markdown]
# ### The engines: "32B won't fit on 1 GPU"
#
# The seed runs vLLM at `gpu_memory_utilization` 0.65 (7B, TP 1) and 0.55 (32B, TP 2-4). The engine
# side is simpler: bf16 weights split over TP GPUs, and whatever is left of `U × 95 GB` holds the KV
# cache. OLMo-2-32B's weights alone exceed 0.55 of one GPU, so TP=1 is out at that setting — but not
# at 0.9, and at TP=2 there is room for more sequences than the seed's debug batches ever generate.

# %%
rows = []
for name, U, tps, T in [("OLMo-2-7B", 0.65, [1], 16384), ("OLMo-2-32B", 0.55, [1, 2, 4], 10240), ("OLMo-2-32B", 0.9, [1, 2], 10240)]:
    for tp in tps:
        e = engine_memory(name, tp=tp, gpu_memory_utilization=U, gpu_mem_gib=G95, seq_len=T)
        rows.append([name, U, tp, gb(e.weights_bytes), gb(e.kv_cache_bytes), f"{e.kv_bytes_per_token / 1024:.0f} KiB",
                     f"{e.max_tokens:,}", e.max_concurrent_seqs if e.fits else "does not fit"])
md_table(["model", "U", "TP", "weights GB/GPU", "KV cache GB/GPU", "KV per token per GPU", "tokens in cache", f"sequences of the pack length"], rows)

# %% [markdown]
# ## 3. Qwen3-4B on 4-16 RTX 4090s (seed 002)
#
# The Qwen3-4B guide explains ZeRO-3 with three component sizes, each off by a factor:

# %%
P4 = param_counts(ARCHS["Qwen3-4B"])["total"]
md_table(["component", "seed", "computed", "what went wrong"], [
    ["parameters in bf16", "≈ 16 GB", f"{gb(2 * P4)} GB", "16 GB is the fp32 size (4 bytes); bf16 is 2"],
    ["gradients", "another 16 GB", f"{gb(2 * P4)} GB", "gradients are bf16 too"],
    ["optimizer states (AdamW)", "32 GB", f"{gb(12 * P4)} GB", "fp32 m and v are 32 GB; the fp32 master weights add 16"],
    ["total without ZeRO", "~64 GB", f"{gb(16 * P4)} GB (+ {gb(4 * P4)} GB at the step)", "right by accident: the first two errors cancel the third"],
    ["ZeRO-3 on 8 GPUs", "~8 GB + activations", f"{gb(16 * P4 / 8)} GB of states + buckets, gathered parameters, activations, logits", "the states are right"],
])

# %% [markdown]
# Its scaling table (effective batch = micro-batch × accumulation × GPUs, which is right) gives memory
# per GPU of 8-18 GB for 2,048-token sequences on 24 GB cards. Recomputed with the seed's HF loss and
# gradient checkpointing, and with grpo-nb's chunked log-probs:

# %%
rows = []
for target, n, mb, acc, said in [(64, 4, 2, 8, "~18GB"), (128, 8, 2, 8, "~12GB"), (256, 16, 2, 8, "~8GB"),
                                 (256, 8, 4, 8, "~18GB"), (512, 16, 4, 8, "~14GB")]:
    full = learner_memory("Qwen3-4B", learners=n, zero=3, micro_batch=mb, seq_len=2048, logits="full")
    ch = learner_memory("Qwen3-4B", learners=n, zero=3, micro_batch=mb, seq_len=2048, logits="chunked")
    rows.append([target, n, mb, acc, mb * acc * n, said, f"{gb(full.total_bytes)} {'✓' if full.total_bytes <= 24e9 else '✗'}",
                 f"{gb(ch.total_bytes)} {'✓' if ch.total_bytes <= 24e9 else '✗'}"])
md_table(["target batch", "GPUs", "micro-batch", "accumulation", "mb×acc×GPUs", "seed: memory/GPU",
          "computed GB, HF loss (fits 24 GB?)", "computed GB, chunked"], rows)

# %% [markdown]
# Two more of its claims, computed: what gradient checkpointing saves ("~30-40%"), of the activations
# and of the peak, and whether memory per GPU "decreases linearly with more GPUs" — only the states do:

# %%
kw = dict(zero=3, micro_batch=2, seq_len=2048, logits="full")
a_off = learner_memory("Qwen3-4B", learners=8, grad_ckpt=False, **kw)
a_on = learner_memory("Qwen3-4B", learners=8, grad_ckpt=True, **kw)
print(f"checkpointing: activations at the loss {gb(a_off.phases['loss']['activations_bytes'])} -> "
      f"{gb(a_on.phases['loss']['activations_bytes'])} GB ({1 - a_on.phases['loss']['activations_bytes'] / a_off.phases['loss']['activations_bytes']:.0%} less); "
      f"peak {gb(a_off.peak_bytes)} -> {gb(a_on.peak_bytes)} GB ({1 - a_on.peak_bytes / a_off.peak_bytes:.0%} less)")
for n in [4, 8, 16, 32, 64]:
    m = learner_memory("Qwen3-4B", learners=n, grad_ckpt=True, **kw)
    print(f"{n:>2} GPUs: {gb(m.peak_bytes)} GB peak, of which states {gb(m.params_bytes + m.grads_bytes + m.optimizer_bytes)} GB")

# %% [markdown]
# ## 4. Several models on one GPU (seed 004)
#
# The hierarchical-RL guide puts a trained Llama-3.2-3B policy, a trained guidance model (a copy of
# it), a frozen reference copy, critics and a value function on 44.53 GB GPUs, and sizes each 3B copy
# at "~7-13 GB". That is the size of its bf16 *weights*; a copy that is trained with AdamW needs 16
# bytes per parameter before any activation. (The critics' and value function's sizes are not given,
# so they are left out.)

# %%
P3 = param_counts(ARCHS["Llama-3.2-3B"])["total"]
rows = [["base LLM (trained)", "~7-13 GB", f"{gb(2 * P3)} GB weights; **{gb(16 * P3)} GB** with grads and AdamW"],
        ["guidance model (trained)", "~7-13 GB", f"**{gb(16 * P3)} GB**"],
        ["reference model (frozen)", "~7-13 GB", f"{gb(2 * P3)} GB in bf16 on the GPU, 0 on the CPU"],
        ["total of the three", "~26-47 GB (with critics)", f"**{gb(34 * P3)} GB**"]]
md_table(["model", "seed", "computed"], rows)

# %% [markdown]
# Its "memory savings" list, computed for one trained 3B copy on one GPU (2 × 2,048 tokens). bf16
# mixed precision does not halve the states — fp32 training needs 4 + 4 + 8 = 16 bytes per parameter,
# mixed precision 2 + 2 + 4 + 8 = 16 too; it halves activations. Checkpointing and chunked log-probs
# remove activations and logits, but under DeepSpeed ZeRO-0 the optimizer step (states plus the fp32
# gradient copy) is then the peak; an 8-bit optimizer shrinks the moments from 8 to about 2 bytes; and
# offloading the optimizer to CPU memory (ZeRO-3 on one GPU) takes the step off the GPU altogether:

# %%
G = 44.53e9 / 2**30
rows = []
for label, kw in [("bf16 AdamW, no checkpointing, HF loss", dict(grad_ckpt=False, logits="full")),
                  ("+ gradient checkpointing", dict(grad_ckpt=True, logits="full")),
                  ("+ chunked log-probs", dict(grad_ckpt=True, logits="chunked")),
                  ("+ 8-bit AdamW", dict(grad_ckpt=True, logits="chunked", optimizer="adamw-8bit")),
                  ("checkpointing, chunked, ZeRO-3 with the optimizer offloaded", dict(grad_ckpt=True, logits="chunked", zero=3, offload="optimizer"))]:
    m = learner_memory("Llama-3.2-3B", learners=1, micro_batch=2, seq_len=2048, **{"zero": 0, **kw})
    rows.append([label, gb(m.peak_bytes), m.peak_phase, gb(m.total_bytes), "✓" if m.total_bytes <= 44.53e9 else "✗"])
md_table(["one trained Llama-3.2-3B", "peak allocated GB", "peak phase", "on the GPU GB", "fits 44.53 GB"], rows)

# %% [markdown]
# ## 5. "DDP reduces per-GPU memory" (seed 001)
#
# The two-V100 GRPO guide says distributed data parallel "reduces per-GPU memory usage" and that model
# memory is "shared across GPUs". DDP replicates the model: every GPU holds all weights, gradients and
# optimizer states, and only the batch is split. On its 32 GB V100s the states of its two models:

# %%
rows = []
for name in ["Qwen2.5-1.5B", "Qwen2.5-3B"]:
    P = param_counts(ARCHS[name])["total"]
    z2 = learner_memory(name, learners=2, zero=2, micro_batch=1, seq_len=1024)
    rows.append([name, f"{gb(16 * P)} GB", "✓" if 16 * P < 32e9 else "✗ (the states alone exceed the GPU)",
                 f"{gb(z2.total_bytes)} GB {'✓' if z2.total_bytes <= 32e9 else '✗'}"])
md_table(["model", "DDP: states per GPU (16 bytes/param)", "fits 32 GB?", "ZeRO-2 on the 2 GPUs, 1×1,024 tokens"], rows)

# %% [markdown]
# ## How to check a plan yourself
#
# ```
# grpo_nb plan --model OLMo-2-32B --learner-gpus 16 --zero 3 --micro-batch 1 --seq-len 10240 \
#              --engine-tp 2 --gpu-memory-utilization 0.55 --gpu-mem-gib 88.5
# ```
#
# prints the table above for one configuration, with the changes that make it fit; `--json` gives the
# same for scripts. The planner is checked against real DeepSpeed steps on H100/H200 GPUs at the end
# of [Memory](../01_memory.ipynb).

# %%
print(mem.format_plan(plan("OLMo-2-32B", learners=16, zero=3, micro_batch=1, seq_len=10240, engine_tp=2,
                           gpu_memory_utilization=0.55, gpu_mem_gib=G95, logits="chunked")))
