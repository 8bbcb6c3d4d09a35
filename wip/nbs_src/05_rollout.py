# %%
#| default_exp rollout

# %% [markdown]
# # Rollout engines
# > vLLM (or transformers) engines as Ray actors: G samples per prompt with their token ids, log-probs and finish reasons, batched over several engines

# %% [markdown]
# A GRPO step starts by sampling `G` completions for each prompt. This notebook builds the engines that do
# it and the one interface the trainer sees:
#
# - `generate(prompts, spec)` → one `Sample` per completion: prompt token ids, completion token ids, the
#   log-prob of every sampled token under the distribution it was sampled from, and why it ended.
# - Two backends behind it: **vLLM** (`LLM` with tensor parallelism, the default) and **transformers**
#   `generate` (for machines without vLLM, such as the GPU measurement machines; it also keeps raw
#   tensors, so its weights can be check-summed after a sync).
# - Engines run as **Ray actors**, placed in the engine bundles of the layout (`grpo_nb.placement`), and
#   `generate_batched` splits a batch of prompts over all of them and gathers the samples back in order.
# - Every engine can **receive new weights** from the learner; that protocol lives in
#   `grpo_nb.weight_sync`, and the methods here only connect the engine to it.
#
# Symbols: `B` sequences (= prompts × `G`), `G` samples per prompt, `T` tokens, `V` vocabulary.
#
# **Where this departs from common practice, and why.**
#
# - *Log-probs are those of the sampling distribution* (temperature and top-p applied), not vLLM's
#   default raw log-probs: the loss compares them with the learner's log-probs at the same temperature
#   (see the loss notebook, truncated importance sampling). Greedy decoding reports plain log-probs.
# - *Seeds are per prompt*: prompt `j` of a batch draws its `G` samples from seeds
#   `seed + j·G … seed + j·G + G - 1` (vLLM), so how prompts are split over engines does not change which
#   random numbers a prompt gets. The transformers backend seeds the whole call once (it has one global
#   generator), so its samples depend on the batch composition.
# - The transformers backend does its own temperature/top-p step (a logits processor) and records each
#   sampled token's log-prob on the fly, keeping one `[B, V]` buffer instead of `T` of them.

# %%
#| export
from __future__ import annotations
import itertools, os, threading, time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, asdict
from typing import Any, Literal, Sequence
import torch

# %%
#| hide
from fastcore.test import test_eq, test_fail, test_close
import tempfile, math
from pathlib import Path
import grpo_nb.rollout as lib

# %% [markdown]
# ## What to sample, and what comes back
#
# `SamplingSpec` is the per-call request: `n` (= `G`), the length limit, temperature (0 means greedy),
# top-p, the seed and stop conditions. `Sample` is one completion. A batch comes back as a flat list,
# prompt-major (`[p0 s0, p0 s1, …, p1 s0, …]`), which is the layout the group advantages expect.

# %%
#| export
@dataclass
class SamplingSpec:
    "What to sample for every prompt of one `generate` call."
    n:int=1 # G: completions per prompt
    max_new_tokens:int=64 # length limit of each completion
    temperature:float=1.0 # sampling temperature; 0 means greedy
    top_p:float=1.0 # nucleus mass in (0, 1]
    seed:int|None=0 # base seed (prompt j uses seed + j·n …); None: the engine's own random state
    stop:list[str]=field(default_factory=list) # stop strings (the completion ends with the token that completes one)
    stop_token_ids:list[int]=field(default_factory=list) # extra stop tokens besides the tokenizer's EOS
    ignore_eos:bool=False # keep going after EOS (fixed-length sampling, benchmarks)

    def __post_init__(self):
        if self.n < 1: raise ValueError(f"SamplingSpec.n must be at least 1 (got {self.n}).")
        if self.max_new_tokens < 1: raise ValueError(f"SamplingSpec.max_new_tokens must be at least 1 (got {self.max_new_tokens}).")
        if self.temperature < 0: raise ValueError(f"SamplingSpec.temperature must be >= 0, 0 for greedy (got {self.temperature}).")
        if not 0 < self.top_p <= 1: raise ValueError(f"SamplingSpec.top_p must be in (0, 1] (got {self.top_p}).")

@dataclass
class Sample:
    "One completion of one prompt."
    prompt_index:int # index of its prompt in the whole batch (across engines)
    sample_index:int # which of the G samples of that prompt (0 … G-1)
    prompt_ids:list[int] # prompt token ids
    completion_ids:list[int] # generated token ids, the stop token included
    logprobs:list[float] # log-prob of each generated token under the sampling distribution (len = len(completion_ids))
    finish_reason:str # "stop" (EOS, stop token or stop string) or "length" (hit max_new_tokens)
    text:str="" # decoded completion (empty when the engine has no tokenizer)

# %%
SamplingSpec(n=8, max_new_tokens=16, temperature=0.7)

# %%
test_fail(lambda: SamplingSpec(top_p=0), contains="top_p")

# %% [markdown]
# The trainer's settings live in `RolloutConfig`; `sampling_spec` maps them over (`G` is
# `num_samples_per_prompt`).

# %%
#| export
def sampling_spec(rollout, # a `grpo_nb.config.RolloutConfig`
                  **overrides, # any `SamplingSpec` field, e.g. temperature=0 for evaluation
                 ) -> SamplingSpec:
    "The `SamplingSpec` of a training step from the rollout section of the config."
    kw = dict(n=rollout.num_samples_per_prompt, max_new_tokens=rollout.max_new_tokens, temperature=rollout.temperature,
              top_p=rollout.top_p, seed=rollout.seed)
    kw.update(overrides)
    return SamplingSpec(**kw)

# %%
from grpo_nb.config import RolloutConfig
test_eq(sampling_spec(RolloutConfig(), temperature=0.0).n, 8)

# %% [markdown]
# ## Calling engines wherever they live
#
# The same code drives an engine object in this process (notebooks, tests) and a Ray actor handle
# (training). `submit` starts a call without waiting — a Ray `ObjectRef` for an actor, a `Future` on a
# thread for a local object (so that blocking calls such as a weight broadcast can run side by side) —
# and `gather` waits for a list of them, raising the first error *as soon as it happens* instead of
# waiting behind a call that will now never return.

# %%
#| export
_pool:ThreadPoolExecutor|None = None
_pool_lock = threading.Lock()

def submit(obj, # an engine/learner object, or a Ray actor handle
           method:str, # name of the method to call
           *args, **kwargs):
    "Start `obj.method(*args, **kwargs)`: a Ray ObjectRef for an actor handle, a `Future` for a local object."
    global _pool
    fn = getattr(obj, method)
    if hasattr(fn, "remote"): return fn.remote(*args, **kwargs)
    with _pool_lock:
        if _pool is None: _pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="grpo-call")
    return _pool.submit(fn, *args, **kwargs)

def gather(calls:Sequence, # results of `submit`
           timeout_s:float|None=None, # give up (TimeoutError) after this many seconds
          ) -> list:
    "Wait for `calls` and return their results in order; the first failure is raised at once."
    calls = list(calls)
    done:dict[int, Any] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while len(done) < len(calls):
        progressed = False
        for i, c in enumerate(calls):
            if i in done: continue
            if isinstance(c, Future):
                if c.done(): done[i] = c.result(); progressed = True   # .result() re-raises the call's error
            else:
                import ray
                ready, _ = ray.wait([c], timeout=0)
                if ready: done[i] = ray.get(c); progressed = True       # ray.get re-raises the actor's error
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{len(calls) - len(done)} of {len(calls)} calls still running after {timeout_s} s.")
        if not progressed and len(done) < len(calls): time.sleep(0.01)
    return [done[i] for i in range(len(calls))]

def call(obj, method:str, *args, **kwargs):
    "Call `obj.method(*args, **kwargs)` and wait for the result (local object or Ray actor)."
    return gather([submit(obj, method, *args, **kwargs)])[0]

# %%
class _Echo:
    def hi(self, x): return x * 2
    def boom(self): raise RuntimeError("boom")
test_eq(gather([submit(_Echo(), "hi", i) for i in range(3)]), [0, 2, 4])
test_fail(lambda: call(_Echo(), "boom"), contains="boom")

# %% [markdown]
# ## The transformers backend
#
# `HFEngine` loads a local HF directory (or builds a model from a config object, for benchmarks) and
# samples with `model.generate`. Two details make its log-probs equal to vLLM's in meaning:
#
# 1. Temperature and top-p are applied by our own logits processor (`_SampleAndRecord`), and the
#    built-in warpers are switched off, so we know exactly which distribution each token came from.
# 2. The same processor records log-probs on the fly. When it is called for step `t`, the token sampled
#    at step `t-1` is already the last column of `input_ids`, so it reads that token's log-prob from the
#    previous step's `[B, V]` log-softmax and keeps only the current one. The last token's log-prob is
#    read after `generate` returns. Memory: one `[B, V]` buffer instead of `T` of them.

# %%
#| export
def nucleus_mask(logits:torch.Tensor, # [B, V] (temperature already applied)
                 top_p:float, # keep the smallest set of tokens whose probability reaches top_p
                ) -> torch.Tensor: # [B, V] True where a token is dropped
    "Top-p (nucleus) filter: which tokens fall outside the nucleus (the most likely token always stays)."
    if top_p >= 1.0: return torch.zeros_like(logits, dtype=torch.bool)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)       # [B, V]
    before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)  # mass strictly above each token
    drop_sorted = before >= top_p
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)

class _SampleAndRecord:
    "Logits processor: temperature + top-p, then record the previous step's sampled-token log-probs."
    def __init__(self, temperature:float, top_p:float):
        self.temperature, self.top_p = temperature, top_p
        self.prev:torch.Tensor|None = None    # [B, V] log-probs of the previous step
        self.picked:list[torch.Tensor] = []   # T x [B] log-probs of sampled tokens
    def __call__(self, input_ids, scores):
        if self.prev is not None: self.picked.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        z = scores.float()
        if self.temperature > 0: z = z / self.temperature
        z = z.masked_fill(nucleus_mask(z, self.top_p), float("-inf"))
        self.prev = z.log_softmax(-1)
        return z
    def finish(self, last_tokens:torch.Tensor) -> torch.Tensor: # [B, T]
        self.picked.append(self.prev.gather(-1, last_tokens[:, None]).squeeze(-1))
        return torch.stack(self.picked, dim=1)

# %%
z = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
test_eq(nucleus_mask(z, 0.5).tolist(), [[False, True, True, True]])     # p(top) = 0.64 >= 0.5
test_eq(nucleus_mask(z, 0.85).tolist(), [[False, False, True, True]])  # 0.64 + 0.24 = 0.88 >= 0.85
test_eq(nucleus_mask(z, 0.9).tolist(), [[False, False, False, True]])

# %% [markdown]
# Completions end at the first stop token (EOS or `stop_token_ids`, kept in the completion, as vLLM
# does) or at the first position where the decoded text contains a stop string. `_cut` finds that end;
# for stop strings it bisects on the number of tokens, decoding O(log T) prefixes instead of T.

# %%
#| export
def _cut(ids:list[int], # generated tokens of one completion (padding after the end included)
         stop_ids:set[int], # token ids that end a completion
         stop:Sequence[str]=(), # stop strings
         decode=None, # tokens -> text (needed for stop strings)
        ) -> tuple[int, bool]: # (tokens kept, stopped?)
    "Where a completion ends: after its first stop token, or after the token that completes a stop string."
    end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), None)
    limit = end if end is not None else len(ids)
    if stop and decode is not None and any(s in decode(ids[:limit]) for s in stop):
        lo, hi = 1, limit  # smallest k with a stop string inside decode(ids[:k])
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(ids[:mid]) for s in stop): hi = mid
            else: lo = mid + 1
        return lo, True
    return limit, end is not None

# %%
test_eq(_cut([5, 6, 1, 0, 0], {1}), (3, True))
test_eq(_cut([5, 6, 7], {1}), (3, False))
test_eq(_cut([5, 6, 7, 8], set(), ["67"], decode=lambda t: "".join(map(str, t))), (3, True))

# %%
#| export
def _device(device:str) -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)

def _dtype(dtype:str, device:torch.device) -> torch.dtype:
    if dtype == "auto": return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)

class HFEngine:
    "A rollout engine on transformers `generate`; same interface as `VllmEngine`."
    backend = "transformers"
    def __init__(self, model, # local HF directory, or a transformers config object (random init, no tokenizer)
                 device:str="auto", # "auto": cuda when visible, else cpu
                 dtype:str="auto", # "auto": bfloat16 on GPU, float32 on CPU
                 seed:int=0, # seeds the random init of a model built from a config
                 max_batch_size:int|None=None, # sequences per `generate` call (None: the whole batch at once)
                 attn_implementation:str="sdpa", # attention kernel
                ):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.device = _device(device); self.dtype = _dtype(dtype, self.device)
        self.max_batch_size = max_batch_size
        if isinstance(model, (str, os.PathLike)):
            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=self.dtype, attn_implementation=attn_implementation)
            try: self.tokenizer = AutoTokenizer.from_pretrained(str(model))
            except (OSError, ValueError): self.tokenizer = None
        else:
            torch.manual_seed(seed)
            with torch.device(self.device):
                self.model = AutoModelForCausalLM.from_config(model, dtype=self.dtype, attn_implementation=attn_implementation)
            self.tokenizer = None
        self.model.to(self.device).eval().requires_grad_(False)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        # sampling is ours (`SamplingSpec`): drop a checkpoint's defaults (top_k, repetition_penalty, ...) that generate() would merge in
        from transformers import GenerationConfig
        self.model.generation_config = GenerationConfig()   # EOS ids are passed per call (none with ignore_eos)
        self.sync_group = None

# %% [markdown]
# Prompts are token-id lists or strings (strings need a tokenizer). Each prompt is repeated `n` times,
# left-padded into one `[B, T]` batch, and sampled in one `generate` call (or in chunks of
# `max_batch_size` rows).

# %%
#| export
def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for src in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        e = getattr(src, "eos_token_id", None)
        if e is not None: ids.update([e] if isinstance(e, int) else list(e))
    return ids

def _prompt_ids(prompts:Sequence, tokenizer) -> list[list[int]]:
    if all(not isinstance(p, str) for p in prompts): return [list(map(int, p)) for p in prompts]
    if tokenizer is None: raise ValueError("text prompts need a tokenizer; this engine was built without one. Fix: pass token-id lists.")
    return [tokenizer(p).input_ids if isinstance(p, str) else list(map(int, p)) for p in prompts]

def _hf_generate(self:HFEngine, rows:list[list[int]], spec:SamplingSpec, stop_ids:set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    "One `generate` call over `rows` (prompt token ids): returns completions [B, T] and their log-probs [B, T]."
    from transformers import GenerationConfig, LogitsProcessorList
    pad = next(iter(sorted(stop_ids)), 0) if self.tokenizer is None or self.tokenizer.pad_token_id is None else self.tokenizer.pad_token_id
    L = max(map(len, rows))
    ids = torch.full((len(rows), L), pad, dtype=torch.long)   # [B, L] left-padded
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows): ids[i, L - len(r):] = torch.tensor(r); mask[i, L - len(r):] = 1
    rec = _SampleAndRecord(spec.temperature, spec.top_p)
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0} if spec.temperature > 0 else {"do_sample": False}
    gc = GenerationConfig(**sampling, repetition_penalty=1.0, max_new_tokens=spec.max_new_tokens, min_new_tokens=0,
                          eos_token_id=None if spec.ignore_eos else sorted(stop_ids) or None, pad_token_id=pad,
                          return_dict_in_generate=False)
    with torch.no_grad():
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), generation_config=gc,
                                  logits_processor=LogitsProcessorList([rec]))
    comp = out[:, L:]                                           # [B, T]
    return comp.cpu(), rec.finish(out[:, -1]).cpu()

# %%
#| export
def _generate(self:HFEngine,
             prompts:Sequence, # token-id lists or strings
             spec:SamplingSpec, # what to sample
             prompt_offset:int=0, # index of prompts[0] in the whole batch (set by `generate_batched`)
            ) -> list[Sample]: # len(prompts) × spec.n samples, prompt-major
    "Sample `spec.n` completions for every prompt."
    pids = _prompt_ids(prompts, self.tokenizer)
    stop_ids = set() if spec.ignore_eos else set(self.eos_ids)
    stop_ids |= set(spec.stop_token_ids)
    rows = [p for p in pids for _ in range(spec.n)]                      # B = prompts × G
    if spec.seed is not None: torch.manual_seed(spec.seed + prompt_offset * spec.n)
    step = self.max_batch_size or len(rows)
    decode = (lambda t: self.tokenizer.decode(t, skip_special_tokens=True)) if self.tokenizer is not None else None
    out = []
    for s in range(0, len(rows), step):
        comp, lps = _hf_generate(self, rows[s:s + step], spec, stop_ids)
        for i in range(comp.shape[0]):
            r = s + i
            ids = comp[i].tolist()
            k, stopped = _cut(ids, stop_ids, spec.stop, decode)
            out.append(Sample(prompt_offset + r // spec.n, r % spec.n, rows[r], ids[:k], lps[i, :k].tolist(),
                              "stop" if stopped else "length", decode(ids[:k]) if decode else ""))
    return out

HFEngine.generate = _generate

# %% [markdown]
# A throwaway two-layer model (built here from a config, so the notebook needs no files) shows the shape
# of the output; the log-probs are checked against a plain forward pass of the same model, and a greedy
# completion must pick the argmax at every step.

# %%
from transformers import Qwen2Config
cfg_tiny = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=128, eos_token_id=1, tie_word_embeddings=True)
eng = HFEngine(cfg_tiny, device="cpu", seed=0)
samples = eng.generate([[5, 6, 7], [8, 9]], SamplingSpec(n=3, max_new_tokens=6, temperature=1.0, seed=1))
[(s.prompt_index, s.sample_index, s.completion_ids, s.finish_reason) for s in samples]

# %%
def forward_logprobs(model, prompt, completion, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]

test_eq(len(samples), 6)
for s in samples: test_close(torch.tensor(s.logprobs), forward_logprobs(eng.model, s.prompt_ids, s.completion_ids), eps=1e-5)
g = eng.generate([[5, 6, 7]], SamplingSpec(max_new_tokens=6, temperature=0.0))[0]
with torch.no_grad(): logits = eng.model(torch.tensor([g.prompt_ids + g.completion_ids])).logits[0]
test_eq([int(logits[len(g.prompt_ids) - 1 + i].argmax()) for i in range(len(g.completion_ids))], g.completion_ids)

# %% [markdown]
# At temperature 0.5 with top-p 0.9, the recorded log-probs are those of the tempered, truncated
# distribution — the one the token was drawn from:

# %%
s = eng.generate([[5, 6, 7]], SamplingSpec(max_new_tokens=6, temperature=0.5, top_p=0.9, seed=3))[0]
with torch.no_grad(): z = eng.model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0, 2:-1].float() / 0.5
ref = z.masked_fill(nucleus_mask(z, 0.9), float("-inf")).log_softmax(-1).gather(-1, torch.tensor(s.completion_ids)[:, None])[:, 0]
test_close(torch.tensor(s.logprobs), ref, eps=1e-5)

# %% [markdown]
# ## The vLLM backend
#
# `VllmEngine` wraps `vllm.LLM`. What matters for RL:
#
# - `logprobs_mode="processed_logprobs"` and `logprobs=0`: the log-prob of each sampled token under the
#   distribution it was sampled from (raw log-probs at temperature 0).
# - `worker_extension_cls` injects `grpo_nb.weight_sync.VllmWorkerExtension` into every worker, so
#   `collective_rpc` can make each TP worker join the weight-sync group and load what it receives
#   through vLLM's own `reload_weights`.
# - Tensor parallelism: TP = 1 runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by
#   `engine_env` for the actor); TP > 1 uses vLLM's multiprocessing executor inside the actor, whose
#   bundle owns the TP GPUs. On CPU, TP > 1 needs `VLLM_CPU_OMP_THREADS_BIND` (one core list per worker).
# - `enforce_eager` (required on CPU), `gpu_memory_utilization`, `max_model_len` pass straight through.

# %%
#| export
class VllmEngine:
    "A rollout engine on `vllm.LLM`, with the weight-sync worker extension."
    backend = "vllm"
    def __init__(self, model:str, # local HF directory
                 tensor_parallel_size:int=1, # TP workers (GPUs, or CPU processes on CPU)
                 gpu_memory_utilization:float=0.9, # share of each GPU for weights + KV cache
                 enforce_eager:bool=False, # no CUDA graphs (required on CPU)
                 dtype:str="auto", # "auto": bfloat16 on GPU; use "float32" on CPU for exact checks
                 seed:int=0, # engine seed (used when a request has no seed)
                 max_model_len:int|None=None, # context limit (None: the model's)
                 enable_prefix_caching:bool=True, # reuse KV of shared prefixes (reset after every weight sync)
                 **llm_kwargs, # anything else `vllm.LLM` takes
                ):
        from vllm import LLM
        kw = dict(model=str(model), tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                  enforce_eager=enforce_eager, dtype=dtype, seed=seed, max_model_len=max_model_len,
                  enable_prefix_caching=enable_prefix_caching, logprobs_mode="processed_logprobs",
                  worker_extension_cls="grpo_nb.weight_sync.VllmWorkerExtension")
        if tensor_parallel_size > 1: kw["distributed_executor_backend"] = "mp"
        kw.update(llm_kwargs)
        self.llm = LLM(**kw)
        self.tokenizer = self.llm.get_tokenizer()
        self.tensor_parallel_size = tensor_parallel_size

# %%
#| export
def _vllm_generate(self:VllmEngine,
                   prompts:Sequence, # token-id lists or strings
                   spec:SamplingSpec, # what to sample
                   prompt_offset:int=0, # index of prompts[0] in the whole batch (set by `generate_batched`)
                  ) -> list[Sample]: # len(prompts) × spec.n samples, prompt-major
    "Sample `spec.n` completions for every prompt with vLLM."
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    inputs = [p if isinstance(p, str) else TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompts]
    params = [SamplingParams(n=spec.n, temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_new_tokens,
                             seed=None if spec.seed is None else spec.seed + (prompt_offset + j) * spec.n,
                             stop=list(spec.stop) or None, stop_token_ids=list(spec.stop_token_ids) or None,
                             ignore_eos=spec.ignore_eos, logprobs=0)
              for j in range(len(prompts))]
    outs = self.llm.generate(inputs, params, use_tqdm=False)
    samples = []
    for j, o in enumerate(outs):
        for c in sorted(o.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = [c.logprobs[i][t].logprob for i, t in enumerate(ids)]
            if c.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished prompt {prompt_offset + j} with {c.finish_reason!r}; see the engine log.")
            samples.append(Sample(prompt_offset + j, c.index, list(o.prompt_token_ids), ids, lps, c.finish_reason, c.text))
    return samples

VllmEngine.generate = _vllm_generate

# %% [markdown]
# ## Receiving weights
#
# Both backends take part in the weight-sync protocol of `grpo_nb.weight_sync` through the same four
# methods. An engine joins the side-channel group once (`join_weight_sync`; every TP worker becomes rank
# `rank_offset + its TP rank`), then loads every sync with `receive_weights(plan)`, which also resets
# the prefix cache: cached KV blocks were computed by the old weights.

# %%
#| export
def _hf_join(self:HFEngine, host:str, # learner rank 0's address (the group's store)
             port:int, # the store's port
             world_size:int, # 1 + engines × TP
             rank_offset:int, # this engine's first rank (1 + engine index × TP)
             backend:str="gloo", # "gloo" (CPU) or "nccl" (GPU)
             timeout_s:float=600, # collective timeout
            ) -> list[int]: # the ranks taken (one, TP = 1)
    "Join the weight-sync group as rank `rank_offset`."
    from grpo_nb.weight_sync import join_group
    self.sync_group = join_group(host, port, rank_offset, world_size, backend, device=self.device, timeout_s=timeout_s)
    return [rank_offset]

def _hf_receive(self:HFEngine, plan:dict, # `SyncPlan.to_dict()` of this sync
                timing:bool=False, # synchronise around each phase to time it exactly
               ) -> dict: # receiver timings
    "Receive one sync's buckets and copy them into the model's parameters."
    from grpo_nb.weight_sync import SyncPlan, receive_buckets, load_into_module
    if self.sync_group is None: raise RuntimeError("receive_weights before join_weight_sync. Fix: connect_weight_sync(learners, engines) first.")
    stats = {}
    load_into_module(self.model, receive_buckets(self.sync_group, SyncPlan.from_dict(plan), stats, timing))
    return stats

def _hf_checksums(self:HFEngine) -> dict[str, int]:
    "Exact checksum of every parameter (this backend keeps raw tensors)."
    from grpo_nb.weight_sync import module_checksums
    return module_checksums(self.model.named_parameters())

def _hf_leave(self:HFEngine) -> None:
    "Leave the weight-sync group."
    if self.sync_group is not None: self.sync_group.close(); self.sync_group = None

HFEngine.join_weight_sync, HFEngine.receive_weights, HFEngine.weight_checksums = _hf_join, _hf_receive, _hf_checksums
HFEngine.leave_weight_sync = _hf_leave
HFEngine.reset_prefix_cache = lambda self: None

# %%
#| export
def _vllm_join(self:VllmEngine, host:str, port:int, world_size:int, rank_offset:int, backend:str="gloo",
               timeout_s:float=600) -> list[int]:
    "Every TP worker joins the weight-sync group as rank `rank_offset + tp_rank`."
    return self.llm.collective_rpc("grpo_join_sync", args=(host, port, world_size, rank_offset, backend, timeout_s))

def _vllm_receive(self:VllmEngine, plan:dict, timing:bool=False) -> dict:
    "Every TP worker receives the full tensors and loads them through vLLM's loader (which shards them); then the prefix cache is reset."
    stats = self.llm.collective_rpc("grpo_receive_weights", args=(plan, timing))
    self.llm.reset_prefix_cache()
    return stats[0]

def _vllm_leave(self:VllmEngine) -> None:
    "Every TP worker leaves the weight-sync group."
    self.llm.collective_rpc("grpo_close_sync")

VllmEngine.join_weight_sync, VllmEngine.receive_weights, VllmEngine.leave_weight_sync = _vllm_join, _vllm_receive, _vllm_leave
VllmEngine.weight_checksums = lambda self: None   # CPU and GPU builds repack linear weights: compare log-probs instead
VllmEngine.reset_prefix_cache = lambda self: self.llm.reset_prefix_cache()

# %% [markdown]
# `info` says where an engine runs (its node, `CUDA_VISIBLE_DEVICES`, its process) — the trainer logs
# it once and the placement tests assert on it. `close` releases the engine (vLLM's TP worker
# processes included) before its actor is killed.

# %%
#| export
def _info(self) -> dict:
    "Backend, TP size, device and where this engine's process runs."
    r = {"backend": self.backend, "tp": getattr(self, "tensor_parallel_size", 1), "pid": os.getpid(),
         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import ray
        if ray.is_initialized(): r.update(node_id=ray.get_runtime_context().get_node_id(), ip=ray.util.get_node_ip_address())
    except ImportError: pass
    return r

def _close(self) -> None:
    "Leave the weight-sync group and free the engine."
    if not hasattr(self, "llm") and not hasattr(self, "model"): return   # closed already
    try: self.leave_weight_sync()
    except Exception: pass
    if isinstance(self, VllmEngine):
        eng = getattr(self.llm, "llm_engine", None)
        core = getattr(eng, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"): core.shutdown()
    self.__dict__.pop("llm", None); self.__dict__.pop("model", None)
    import gc; gc.collect()

for _cls in (HFEngine, VllmEngine): _cls.info, _cls.close = _info, _close

# %%
test_eq(eng.info()["backend"], "transformers")

# %% [markdown]
# ## Engines as Ray actors
#
# `engine_env` is the environment an engine actor needs, passed through Ray's `runtime_env` (library
# code never sets `os.environ` itself). `create_engines` starts one actor per engine, either in the
# bundles of the layout's engine placement group (`actor_options` from
# `grpo_nb.placement.placed_actor_options`) or as free actors, and waits until each has loaded its model,
# so that a bad path or an out-of-memory surfaces here, with the engine's index.

# %%
#| export
_PASS_ENV = ("VLLM_HOST_IP", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "PYTHONUNBUFFERED",
             "RAY_AUTH_MODE", "TORCH_EXTENSIONS_DIR", "VLLM_CPU_OMP_THREADS_BIND", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
GPU_SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1", "NCCL_CUMEM_ENABLE": "0"}
"Environment of every GPU process that takes part in a weight sync (NVLink multicast off; NCCL without cuMem, see weight_sync)."

def engine_env(backend:Literal["vllm","transformers"]="vllm", # engine kind
               tensor_parallel_size:int=1, # TP workers per engine
               device:Literal["cuda","cpu"]="cuda", # where the engine runs
               cpu_cores:Sequence[int]|None=None, # CPU: cores to bind TP worker j to (default 0 … TP-1)
              ) -> dict[str, str]:
    "Environment variables of an engine actor: what vLLM needs on this device, plus pass-through of the launcher's settings."
    env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
    if backend == "vllm":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the engine core in the actor process: one process less, 2-6 s faster start
        if device == "cpu":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            if tensor_parallel_size > 1:
                cores = list(cpu_cores) if cpu_cores is not None else list(range(tensor_parallel_size))
                env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(c) for c in cores[:tensor_parallel_size])
    if device == "cuda": env.update(GPU_SAFETY_ENV)
    return env

# %%
e2 = engine_env("vllm", 2, "cpu")
test_eq((e2["VLLM_CPU_OMP_THREADS_BIND"], e2["VLLM_ENABLE_V1_MULTIPROCESSING"]), ("0|1", "0"))
test_eq(engine_env("transformers", 1, "cuda")["NCCL_CUMEM_ENABLE"], "0")

# %%
#| export
def create_engines(model, # HF directory (or, transformers backend only, a config object)
                   num_engines:int=1, # engine actors
                   tensor_parallel_size:int=1, # TP workers per engine (vLLM)
                   backend:Literal["vllm","transformers"]="vllm", # engine kind
                   device:Literal["auto","cuda","cpu"]="auto", # "auto": cuda when Ray's cluster has GPUs
                   actor_options:Sequence[dict]|None=None, # per engine: Ray actor options (placement bundle, num_gpus, num_cpus); None: free actors
                   env:dict[str, str]|None=None, # extra environment variables for every engine actor
                   wait:bool=True, # wait until every engine has loaded its model (False: return at once; call `info` later)
                   ready_timeout_s:float=900, # give up if an engine has not loaded its model by then
                   **engine_kwargs, # passed to `VllmEngine` / `HFEngine` (dtype, enforce_eager, gpu_memory_utilization, seed, ...)
                  ) -> list: # Ray actor handles, engine i at index i
    "Start `num_engines` engine actors and wait until every one has loaded its model."
    import ray
    if device == "auto": device = "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    if backend == "vllm": cls, kw = VllmEngine, dict(tensor_parallel_size=tensor_parallel_size, **engine_kwargs)
    elif backend == "transformers":
        if tensor_parallel_size != 1: raise ValueError(f"the transformers backend has no tensor parallelism (got TP={tensor_parallel_size}). Fix: --rollout.tensor_parallel_size=1 or backend vllm.")
        cls, kw = HFEngine, dict(device=device, **engine_kwargs)
    else: raise ValueError(f"unknown backend {backend!r}. Fix: 'vllm' or 'transformers'.")
    Actor = ray.remote(cls)
    base_env = {**engine_env(backend, tensor_parallel_size, device), **(env or {})}
    handles = []
    for i in range(num_engines):
        opts = dict(actor_options[i]) if actor_options is not None else \
               {"num_gpus": tensor_parallel_size if device == "cuda" else 0, "num_cpus": 1}
        renv = dict(opts.pop("runtime_env", {}) or {})
        renv["env_vars"] = {**base_env, **renv.get("env_vars", {})}
        handles.append(Actor.options(runtime_env=renv, **opts).remote(model, **kw))
    if not wait: return handles
    try: gather([h.info.remote() for h in handles], timeout_s=ready_timeout_s)
    except BaseException:
        shutdown_engines(handles); raise
    return handles

def shutdown_engines(engines:Sequence, # actor handles from `create_engines`
                     timeout_s:float=30, # wait this long for a clean close before killing
                    ) -> None:
    "Close every engine (vLLM workers included) and kill its actor."
    import ray
    refs = [e.close.remote() for e in engines]
    try: ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    finally:
        for e in engines: ray.kill(e)

# %% [markdown]
# ## One batch over several engines
#
# `generate_batched` cuts the prompts into contiguous, nearly equal chunks (one per engine), generates
# them concurrently and returns the samples in prompt order, `prompt_index` counting over the whole batch.

# %%
#| export
def split_evenly(n:int, # items
                 parts:int, # chunks
                ) -> list[tuple[int, int]]: # (start, stop) of each chunk; sizes differ by at most one
    "Contiguous chunks of `range(n)`, the first `n % parts` one item longer."
    q, r = divmod(n, parts)
    bounds = [0]
    for i in range(parts): bounds.append(bounds[-1] + q + (i < r))
    return list(zip(bounds[:-1], bounds[1:]))

def generate_batched(engines:Sequence, # engine objects or actor handles
                     prompts:Sequence, # token-id lists or strings
                     spec:SamplingSpec, # what to sample
                     timeout_s:float|None=None, # give up after this many seconds
                    ) -> list[Sample]: # len(prompts) × spec.n samples, prompt-major
    "Generate over all engines at once and gather the samples back in prompt order."
    calls = [submit(e, "generate", list(prompts[a:b]), spec, a) for e, (a, b) in zip(engines, split_evenly(len(prompts), len(engines))) if b > a]
    return [s for part in gather(calls, timeout_s) for s in part]

# %%
test_eq(split_evenly(5, 2), [(0, 3), (3, 5)])
eng_b = HFEngine(cfg_tiny, device="cpu", seed=0)
both = generate_batched([eng, eng_b], [[5, 6], [7], [8, 9, 10]], SamplingSpec(n=2, max_new_tokens=4, seed=0))
test_eq([(s.prompt_index, s.sample_index) for s in both], [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)])
test_eq(both[4].prompt_ids, [8, 9, 10])

# %% [markdown]
# ## A real vLLM engine in a Ray actor
#
# The cell below (flag `slow`: it starts Ray and imports vLLM, about a minute on two cores) runs the
# production path on CPU: a float32 vLLM engine with the worker extension in a Ray actor, two prompts
# with `G = 4`, and the engine's log-probs checked against a transformers forward of the same weights.
# The tests (`tests/test_rollout.py`, `tests/test_weight_sync.py`) run the same path in CI, TP = 1 and 2.

# %%
#| slow
import ray
from grpo_nb.tiny import build_tiny_model
from transformers import AutoModelForCausalLM
tmp = tempfile.mkdtemp()
model_dir = build_tiny_model("tiny-arith", Path(tmp) / "m", seed=0)
ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
try:
    engines = create_engines(model_dir, 1, 1, backend="vllm", device="cpu", dtype="float32", enforce_eager=True,
                             gpu_memory_utilization=0.5, max_model_len=128)
    out = generate_batched(engines, ["1+2=", "3+4="], SamplingSpec(n=4, max_new_tokens=6, temperature=1.0, seed=0))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    err = max(float((torch.tensor(s.logprobs) - forward_logprobs(hf, s.prompt_ids, s.completion_ids)).abs().max()) for s in out)
    print([(s.prompt_index, s.text, s.finish_reason) for s in out], f"max |Δ log-prob| = {err:.1e}")
    assert err < 1e-4
    shutdown_engines(engines)
finally:
    ray.shutdown()
