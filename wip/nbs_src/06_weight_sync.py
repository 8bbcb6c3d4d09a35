# %%
#| default_exp weight_sync

# %% [markdown]
# # Weight sync
# > Learner rank 0 → every engine worker: ZeRO-3 gathers in layer-aligned buckets, one metadata message, flat broadcasts, the engine's own loader, and a check that the engine now computes what the learner computes

# %% [markdown]
# After every learner update the rollout engines must sample from the new policy. Peers report five ways
# this goes wrong, and each shapes a piece of this notebook:
#
# | failure reported | cause | here |
# |---|---|---|
# | sync takes > 120 s, or times out | one Ray RPC (and one broadcast) per parameter | **one** metadata message per sync, then one flat broadcast per bucket |
# | OOM gathering a 32B model | the whole ZeRO-3 model gathered on rank 0 | buckets of at most `bucket_bytes`, sized with `ds_numel` (a partitioned parameter's `numel()` is 0) |
# | garbage or NaN after a "packed" transfer | q/k/v (or gate/up) of one layer loaded in different calls: vLLM fuses them into one `qkv_proj` | buckets hold whole decoder layers, **by construction** |
# | NaN weights reach the engine and poison its KV cache | nobody looked | every rank checks its partition first; a non-finite sync is refused before an engine is contacted |
# | stale weights (after a sync, after resume, with TP > 1) | cached KV of old weights; only one TP worker updated; no check | prefix cache reset after every load; every TP worker receives the full tensors and vLLM's loader shards them; `verify_sync` compares engine and learner log-probs (and checksums where the engine keeps raw tensors) and raises |
#
# The pieces:
#
# 1. **Plan** (`make_plan`): every parameter's name, dtype and full shape, cut into buckets of whole
#    *units* (a decoder layer, or a top-level module), each bucket one flat byte buffer.
# 2. **Group** (`SyncGroup`): a process group of its own — learner rank 0 plus every engine worker
#    (world = engines × TP + 1, engine `i`'s worker `j` is rank `1 + i·TP + j`) — outside the learners'
#    torch.distributed world and outside vLLM's own groups: gloo on CPU, NCCL on GPU.
# 3. **Send** (`send_weights`, on every learner rank): per bucket, ZeRO-3 gathers the parameters (all
#    ranks), rank 0 packs them into one buffer and broadcasts it; the next bucket is gathered while the
#    previous one is on the wire, so at most two buckets are alive.
# 4. **Receive** (`receive_buckets`, on every engine worker): receives bucket after bucket (the next one
#    already in flight) and hands `(name, tensor)` views to the engine's loader — vLLM's
#    `reload_weights` in a worker extension, or a plain `copy_` for the transformers engine.
# 5. **Verify** (`verify_sync`): greedy completions of fixed prompts from each engine, scored by the
#    learner; any log-prob further than the tolerance (fp32: 1e-4) from the engine's, or any checksum
#    mismatch, raises `WeightSyncError`.
#
# **Where this departs from the peers, and why.** One `reload_weights` call per sync with a streaming
# iterator (not one per bucket): vLLM's layer-wise reload then processes each layer as soon as its last
# tensor arrives, and a layer that is not in the sync would be restored rather than left half-loaded.
# Metadata travels with the Ray call that starts the receive, not over the group, so nothing is pickled
# into tensors. The finiteness check reads each rank's own partition (no gather), before anything is sent.

# %%
#| export
from __future__ import annotations
import os, re, time, socket
from contextlib import nullcontext
from dataclasses import dataclass, field, asdict
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Literal, Sequence
import torch
from torch import nn, Tensor
from grpo_nb.rollout import SamplingSpec, submit, gather, call

# %%
#| hide
from fastcore.test import test_eq, test_fail, test_close
import threading, json, math
from pathlib import Path
from hypothesis import given, settings, strategies as st
import grpo_nb.weight_sync as lib

# %% [markdown]
# ## Units and buckets
#
# vLLM loads Qwen2/Llama-style checkpoints into *fused* parameters: `q_proj`, `k_proj`, `v_proj` go into
# one `qkv_proj`, `gate_proj` and `up_proj` into one `gate_up_proj`. Its in-place reload waits until a
# layer has received all of its elements, then processes the layer; a layer that got only part of a fused
# group in one `reload_weights` call is processed half-empty. On CPU this produced garbage completions
# (0 of 5 greedy matches) and sometimes NaN (FIELD_NOTES). Fused groups never leave their decoder layer,
# so the rule here is simple: **the loading unit of a parameter is its first indexed block**
# (`model.layers.3`, `transformer.h.7`), or, outside the blocks, the parent of its module (`model` for
# `model.embed_tokens.weight` and `model.norm.weight`, the root for `lm_head.weight`), so that sibling
# modules — which is what fused groups are made of — always share a unit. Buckets are made of whole units.

# %%
#| export
_UNIT = re.compile(r"^(.*?\.\d+)\.")

def sync_unit(name:str, # parameter name, e.g. "model.layers.3.self_attn.q_proj.weight"
             ) -> str: # its loading unit, e.g. "model.layers.3" ("" is the root module)
    "The unit a parameter is loaded with: its first indexed block, else the parent of its module."
    m = _UNIT.match(name)
    if m: return m.group(1)
    parts = name.split(".")
    return ".".join(parts[:-2])

# %%
test_eq([sync_unit(n) for n in ["model.layers.3.self_attn.q_proj.weight", "model.layers.3.mlp.experts.7.w1",
                                "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "attn.q_proj.weight"]],
        ["model.layers.3", "model.layers.3", "model", "model", "", "attn"])

# %% [markdown]
# `plan_buckets` packs units greedily in model order: a unit joins the current bucket if the bucket stays
# within `bucket_bytes`, else it opens a new one; a unit larger than `bucket_bytes` (the embeddings, a big
# MoE layer) gets a bucket of its own — it is never split, so the memory bound is
# `max(bucket_bytes, largest unit)`. `bucket_bytes=None` puts the whole model in one bucket (only when
# asked). Sizes are full (gathered) sizes, which ZeRO-3 reports as `ds_numel`.

# %%
#| export
def plan_buckets(sizes:Sequence[tuple[str, int]], # (parameter name, bytes of its full tensor), in model order
                 bucket_bytes:int|None, # target bytes per bucket; None: everything in one bucket
                ) -> list[list[int]]: # buckets of indices into `sizes`; each unit whole inside one bucket
    "Group parameters into buckets of whole units, each at most `bucket_bytes` unless one unit alone is larger."
    if bucket_bytes is not None and bucket_bytes <= 0: raise ValueError(f"bucket_bytes must be positive or None (got {bucket_bytes}).")
    units:dict[str, list[int]] = {}
    for i, (name, _) in enumerate(sizes): units.setdefault(sync_unit(name), []).append(i)
    buckets, cur, cur_bytes = [], [], 0
    for idx in units.values():
        nb = sum(sizes[i][1] for i in idx)
        if cur and bucket_bytes is not None and cur_bytes + nb > bucket_bytes:
            buckets.append(cur); cur, cur_bytes = [], 0
        cur = cur + idx; cur_bytes += nb
    if cur: buckets.append(cur)
    return buckets

# %%
layer = lambda i: [(f"model.layers.{i}.self_attn.{p}_proj.weight", 100) for p in "qkv"] + [(f"model.layers.{i}.mlp.gate_proj.weight", 300)]
sizes = [("model.embed_tokens.weight", 1000)] + layer(0) + layer(1) + layer(2) + [("model.norm.weight", 10)]
plan_buckets(sizes, 1300)

# %% [markdown]
# The guarantee is checked for arbitrary models and bucket sizes: every unit lies in exactly one bucket,
# every parameter is sent exactly once and in model order, and no bucket exceeds the bound unless it
# holds a single oversized unit.

# %%
#| hide
def _check_buckets(sizes, cap, buckets):
    flat = [i for b in buckets for i in b]
    assert sorted(flat) == list(range(len(sizes)))
    where = {}
    for k, b in enumerate(buckets):
        for i in b: where.setdefault(sync_unit(sizes[i][0]), set()).add(k)
        nb = sum(sizes[i][1] for i in b)
        assert cap is None or nb <= cap or len({sync_unit(sizes[i][0]) for i in b}) == 1, (cap, nb)
    assert all(len(v) == 1 for v in where.values()), where

names = st.builds(lambda l, p: f"model.layers.{l}.{p}.weight" if l >= 0 else f"{p}.weight",
                  st.integers(-1, 5), st.sampled_from(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                                                       "mlp.up_proj", "model.embed_tokens", "lm_head", "model.norm"]))

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(names, st.integers(1, 500)), min_size=1, max_size=40, unique_by=lambda t: t[0]),
       st.one_of(st.none(), st.integers(1, 2000)))
def test_buckets_keep_units_whole(sizes, cap): _check_buckets(sizes, cap, plan_buckets(sizes, cap))

test_buckets_keep_units_whole()
_check_buckets(sizes, 1300, plan_buckets(sizes, 1300))

# %% [markdown]
# ## The plan: the one metadata message of a sync
#
# `make_plan` turns a model's named parameters into a `SyncPlan`: per bucket, every tensor's name,
# dtype, **full** shape and byte offset in the bucket's flat buffer (offsets aligned to 64 bytes, so every
# tensor view is aligned for its dtype), plus the bucket sizes. Under ZeRO-3 each rank holds a
# `[0]`-shaped placeholder; the full shape and size come from `ds_shape` and `ds_numel`. The plan is a
# pure function of names, dtypes and full shapes, so every learner rank computes the same one.

# %%
#| export
ALIGN = 64 # byte alignment of every tensor inside a bucket buffer
DEFAULT_BUCKET_BYTES = 1 << 30 # 1 GiB: large enough for full NCCL bandwidth, small next to a GPU

@dataclass(frozen=True)
class TensorSpec:
    "One tensor of a sync and its place in its bucket's flat byte buffer."
    name:str # parameter name in the checkpoint (HF) format the engine loads
    dtype:str # torch dtype name, e.g. "bfloat16"
    shape:tuple # full (unpartitioned) shape
    offset:int # byte offset inside the bucket buffer
    nbytes:int # bytes of the tensor

@dataclass
class SyncPlan:
    "Everything the receivers must know about one sync, sent once (as plain data) before the first byte."
    buckets:list # list of buckets, each a list of `TensorSpec`
    bucket_nbytes:list # bytes of each bucket buffer
    version:int=0 # policy version carried by this sync (e.g. the trainer's step)

    @property
    def total_bytes(self) -> int: return sum(s.nbytes for b in self.buckets for s in b)
    @property
    def num_tensors(self) -> int: return sum(len(b) for b in self.buckets)
    def to_dict(self) -> dict:
        return {"version": self.version, "bucket_nbytes": list(self.bucket_nbytes),
                "buckets": [[[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in b] for b in self.buckets]}
    @classmethod
    def from_dict(cls, d:dict) -> "SyncPlan":
        return cls([[TensorSpec(n, dt, tuple(sh), o, nb) for n, dt, sh, o, nb in b] for b in d["buckets"]],
                   list(d["bucket_nbytes"]), d.get("version", 0))

# %%
#| export
def full_shape(p:Tensor) -> tuple: return tuple(p.ds_shape) if hasattr(p, "ds_shape") else tuple(p.shape)
def full_numel(p:Tensor) -> int: return int(p.ds_numel) if hasattr(p, "ds_numel") else p.numel()
def _dtype_name(dt:torch.dtype) -> str: return str(dt).removeprefix("torch.")
def _align(n:int) -> int: return (n + ALIGN - 1) // ALIGN * ALIGN

def make_plan(named_params:Iterable[tuple[str, Tensor]], # `model.named_parameters()` (ZeRO-3 placeholders are fine)
              bucket_bytes:int|None=DEFAULT_BUCKET_BYTES, # target bucket size; None: one bucket (the whole model)
              version:int=0, # policy version to stamp on the plan
             ) -> SyncPlan:
    "The sync plan of a model: buckets of whole units, every tensor with name, dtype, full shape and offset."
    items = [(n, p.dtype, full_shape(p), full_numel(p) * p.dtype.itemsize) for n, p in named_params]
    buckets, sizes = [], []
    for idx in plan_buckets([(n, nb) for n, _, _, nb in items], bucket_bytes):
        specs, off = [], 0
        for i in idx:
            n, dt, shape, nb = items[i]
            specs.append(TensorSpec(n, _dtype_name(dt), shape, off, nb)); off = _align(off + nb)
        buckets.append(specs); sizes.append(max(off, ALIGN))
    return SyncPlan(buckets, sizes, version)

# %% [markdown]
# A two-layer model shows the plan; with a tiny bucket size every decoder layer gets a bucket, and
# the plan survives the round trip through plain data (what a Ray call or `collective_rpc` carries).

# %%
from transformers import Qwen2Config, AutoModelForCausalLM
cfg_tiny = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=128, eos_token_id=1, tie_word_embeddings=True)
torch.manual_seed(0)
policy = AutoModelForCausalLM.from_config(cfg_tiny).float()
plan = make_plan(policy.named_parameters(), bucket_bytes=20_000)
print(f"{plan.num_tensors} tensors, {plan.total_bytes} bytes in {len(plan.buckets)} buckets:",
      [sorted({sync_unit(s.name) for s in b}) for b in plan.buckets])
test_eq(SyncPlan.from_dict(json.loads(json.dumps(plan.to_dict()))), plan)

# %% [markdown]
# ## Flat buckets
#
# A bucket travels as one `uint8` buffer: each tensor's bytes at its offset. One broadcast per bucket
# instead of one per tensor (338 tensors for a 1.5B model) and any mix of dtypes. On the receiving
# side the tensors are *views* into the buffer — no copy before the loader's own.

# %%
#| export
def pack_bucket(tensors:Sequence[Tensor], # full tensors, in the order of `specs`
                specs:Sequence[TensorSpec], # their places
                nbytes:int, # bucket buffer size
                device:torch.device|str="cpu", # where the buffer lives (the group's device)
               ) -> Tensor: # [nbytes] uint8
    "Copy tensors into one flat byte buffer at the offsets of their specs."
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for t, s in zip(tensors, specs):
        b = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if b.numel() != s.nbytes:
            raise ValueError(f"{s.name}: {b.numel()} bytes to send but the plan says {s.nbytes}; the model changed after make_plan. Fix: make a new plan.")
        flat.narrow(0, s.offset, s.nbytes).copy_(b, non_blocking=True)
    return flat

def unpack_bucket(flat:Tensor, # [nbytes] uint8 from `pack_bucket`
                  specs:Sequence[TensorSpec], # the bucket's specs
                 ) -> list[tuple[str, Tensor]]: # (name, view with the full shape and dtype)
    "Views of every tensor of a bucket inside its flat buffer."
    return [(s.name, flat.narrow(0, s.offset, s.nbytes).view(getattr(torch, s.dtype)).view(s.shape)) for s in specs]

# %%
ts = [torch.randn(3, 5), torch.arange(7, dtype=torch.int64), torch.randn(4).bfloat16()]
specs = make_plan([(f"m.{i}.w", t) for i, t in enumerate(ts)], None).buckets[0]
back = unpack_bucket(pack_bucket(ts, specs, make_plan([(f"m.{i}.w", t) for i, t in enumerate(ts)], None).bucket_nbytes[0]), specs)
for t, (_, u) in zip(ts, back): assert torch.equal(t, u) and t.dtype == u.dtype

# %% [markdown]
# ## The group
#
# The sync group is created *without* `torch.distributed.init_process_group`: learner rank 0 already
# belongs to the learners' world, and vLLM's workers to vLLM's, and neither may be disturbed. Rank 0
# opens a `TCPStore` on a free port (the OS picks it: no race) and every member builds a gloo or NCCL
# backend object on a `PrefixStore` of it. Broadcasts go through the backend object directly.
#
# On GPU, NCCL must run with `NCCL_CUMEM_ENABLE=0` in the learner *and* the engine processes (peers
# saw hangs and crashes of the weight broadcast without it) and with NVLink multicast off; NCCL reads
# these once, at its first communicator, so they belong in the actors' `runtime_env`
# (`grpo_nb.rollout.GPU_SAFETY_ENV`), never in `os.environ` at sync time.

# %%
#| export
class SyncGroup:
    "One member's handle on the weight-sync group (rank 0 = learner rank 0, ranks 1… = engine workers)."
    def __init__(self, backend_obj, rank:int, world_size:int, backend:str, device:torch.device, store=None):
        self.pg, self.rank, self.world_size, self.backend, self.device, self.store = backend_obj, rank, world_size, backend, device, store
    def broadcast(self, t:Tensor, # buffer on `self.device`; filled on every rank but `root`
                  root:int=0, # sending rank
                 ):
        "Start a broadcast; returns the work handle (`.wait()` it)."
        opts = torch.distributed.BroadcastOptions(); opts.rootRank = root; opts.rootTensor = 0
        return self.pg.broadcast([t], opts)
    def close(self) -> None:
        "Drop the group (and, on rank 0, the store)."
        if hasattr(self.pg, "shutdown"):
            try: self.pg.shutdown()
            except Exception: pass
        self.pg = self.store = None
    def __repr__(self): return f"SyncGroup(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r}, device={self.device})"

def open_store(host:str="127.0.0.1", # address the engines can reach rank 0 at
               timeout_s:float=600, # store and collective timeout
              ):
    "Rank 0: a `TCPStore` server on a free port (read it back from `.port`)."
    return torch.distributed.TCPStore(host, 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)

def join_group(host:str, # rank 0's address
               port:int, # rank 0's store port
               rank:int, # this member's rank
               world_size:int, # 1 + engines × TP
               backend:Literal["gloo","nccl"]="gloo", # gloo on CPU, nccl on GPU
               device:torch.device|str|None=None, # buffers live here (cpu for gloo; this process's GPU for nccl)
               store=None, # rank 0: the store from `open_store`
               timeout_s:float=600, # collective timeout
              ) -> SyncGroup:
    "Join the weight-sync group; blocks until all `world_size` members have joined (gloo), or lazily at the first broadcast (NCCL)."
    from torch.distributed import PrefixStore, TCPStore
    to = timedelta(seconds=timeout_s)
    if store is None: store = TCPStore(host, port, None, False, to)
    ps = PrefixStore("grpo_nb/weight_sync", store)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo
        pg, dev = ProcessGroupGloo(ps, rank, world_size, to), torch.device("cpu")
    elif backend == "nccl":
        from torch.distributed import ProcessGroupNCCL
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.index is None: dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        opts = ProcessGroupNCCL.Options(); opts._timeout = to
        pg = ProcessGroupNCCL(ps, rank, world_size, opts)
    else: raise ValueError(f"backend must be 'gloo' or 'nccl' (got {backend!r}).")
    return SyncGroup(pg, rank, world_size, backend, dev, store if rank == 0 else None)

# %% [markdown]
# Two members in two threads of this process are enough to see a broadcast arrive:

# %%
st0 = open_store()
got = {}
def member(rank):
    g = join_group("127.0.0.1", st0.port, rank, 2, "gloo", store=st0 if rank == 0 else None)
    t = torch.arange(5.0) if rank == 0 else torch.zeros(5)
    g.broadcast(t).wait(); got[rank] = t
ths = [threading.Thread(target=member, args=(r,)) for r in (0, 1)]
for t in ths: t.start()
for t in ths: t.join()
test_eq(got[1].tolist(), [0., 1., 2., 3., 4.])

# %% [markdown]
# ## Sending
#
# **Refuse before sending.** `nonfinite_params` checks every parameter for NaN/Inf *before* the sync
# starts. Under ZeRO-3 each rank checks only its own partition (the `ds_tensor`, minus the padding of the
# last partition, which is never initialised) and the verdicts are max-reduced over the learner world, so
# the check costs one read of the local shard and one small all-reduce — no gather. `sync_weights` calls
# it first and raises `NonFiniteWeightsError` without contacting any engine: an engine that loaded NaN
# weights keeps NaN in its KV cache even after good weights are restored.

# %%
#| export
class WeightSyncError(RuntimeError):
    "A sync that did not deliver the learner's weights; the message says what differed and what to do."

class NonFiniteWeightsError(WeightSyncError):
    "The learner's weights contain NaN/Inf; the sync was refused before any engine loaded anything."

def _partitioned(p:Tensor) -> bool: return hasattr(p, "ds_tensor")

def _local_elements(p:Tensor) -> Tensor:
    "The elements of `p` this rank holds: the whole tensor, or its ZeRO-3 partition without padding."
    if not _partitioned(p): return p.detach().reshape(-1)
    part = int(p.ds_tensor.ds_numel)
    r = torch.distributed.get_rank(group=p.ds_process_group) if torch.distributed.is_initialized() else 0
    n = max(0, min(part, full_numel(p) - part * r))
    return p.ds_tensor.detach().reshape(-1)[:n]

def nonfinite_params(named_params:Iterable[tuple[str, Tensor]], # `model.named_parameters()`; every learner rank calls this
                    ) -> list[str]: # names of parameters holding NaN or Inf (the same list on every rank)
    "Names of parameters with non-finite values; under ZeRO-3 each rank reads its partition and the verdicts are all-reduced."
    named = list(named_params)
    if not named: return []
    views = [_local_elements(p) for _, p in named]
    dev = views[0].device
    bad = torch.stack([~torch.isfinite(v).all().to(dev) for v in views]).to(torch.int32)  # [P] 1 where non-finite
    if any(_partitioned(p) for _, p in named) and torch.distributed.is_initialized():
        group = named[0][1].ds_process_group
        if torch.distributed.get_backend(group) == "nccl" and bad.device.type != "cuda":
            bad = bad.to(torch.device("cuda", torch.cuda.current_device()))
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX, group=group)
    return [named[i][0] for i in bad.nonzero().flatten().tolist()]

# %%
test_eq(nonfinite_params(policy.named_parameters()), [])
with torch.no_grad():
    bad_policy = AutoModelForCausalLM.from_config(cfg_tiny).float()
    bad_policy.model.layers[1].mlp.up_proj.weight[3, 4] = float("nan")
test_eq(nonfinite_params(bad_policy.named_parameters()), ["model.layers.1.mlp.up_proj.weight"])

# %% [markdown]
# **Gather, pack, broadcast.** `send_weights` runs on *every* learner rank (ZeRO-3 gathers are
# collective; without ZeRO-3 only rank 0 has work). For each bucket, `GatheredParameters` assembles the
# full tensors on all ranks, rank 0 copies them into the bucket buffer (on the group's device) and the
# parameters are released again at once. The broadcast is started without waiting; the next bucket is
# gathered while it runs, and rank 0 waits for bucket `k` only before starting bucket `k+1`, so at most
# two buffers exist. With `timing=True` every phase is synchronised and timed separately (for the
# benchmark; slower).

# %%
#| export
def _sync_device(dev:torch.device) -> None:
    if dev.type == "cuda": torch.cuda.synchronize(dev)

def send_weights(named_params:Iterable[tuple[str, Tensor]], # `model.named_parameters()` of the learner (DeepSpeed: `engine.module`)
                 plan:SyncPlan, # the plan of this sync (the same on every rank)
                 group:SyncGroup|None, # the sync group on learner rank 0; None on the other ranks
                 timing:bool=False, # synchronise and time every phase (benchmarks)
                ) -> dict: # rank 0: bytes, gather_s, send_s, total_s; other ranks: gather_s only
    "Gather every bucket of `plan` (all learner ranks under ZeRO-3) and broadcast it from rank 0 to every engine worker."
    params = dict(named_params)
    partitioned = any(_partitioned(p) for p in params.values())
    stats = {"bytes": 0, "gather_s": 0.0, "send_s": 0.0, "buckets": len(plan.buckets)}
    if group is None and not partitioned: return stats   # plain replicas: rank 0 sends alone
    if partitioned: import deepspeed
    stats["t_start"], stats["host"] = time.time(), socket.gethostname()   # wall clock: comparable with the receivers' t_end on one host
    t_start, pending = time.perf_counter(), None
    for k, specs in enumerate(plan.buckets):
        ps = [params[s.name] for s in specs]
        t0 = time.perf_counter()
        with (deepspeed.zero.GatheredParameters(ps, modifier_rank=None) if partitioned else nullcontext()):
            flat = pack_bucket(ps, specs, plan.bucket_nbytes[k], group.device) if group is not None else None
        if group is None: stats["gather_s"] += time.perf_counter() - t0; continue
        if timing: _sync_device(group.device)
        t1 = time.perf_counter(); stats["gather_s"] += t1 - t0
        if pending is not None:   # keep at most two buckets alive: bucket k-1 must have left before k+1 is packed
            pending[0].wait(); _sync_device(group.device)      # (NCCL's wait only orders streams; this blocks the host too)
        pending = (group.broadcast(flat), flat)
        if timing: pending[0].wait(); _sync_device(group.device); pending = None
        stats["send_s"] += time.perf_counter() - t1
        stats["bytes"] += sum(s.nbytes for s in specs)
    if pending is not None:
        t1 = time.perf_counter(); pending[0].wait(); _sync_device(group.device); stats["send_s"] += time.perf_counter() - t1
    stats["total_s"] = time.perf_counter() - t_start
    return stats

# %% [markdown]
# ## Receiving
#
# `receive_buckets` is a generator: it waits for bucket `k`, starts receiving bucket `k+1` into a fresh
# buffer, and yields bucket `k`'s `(name, view)` pairs. The loader consumes them while the next bucket is
# on the wire. Every TP worker receives every full tensor; vLLM's weight loader takes its shard (and
# replicates a single KV head where TP exceeds the KV heads). `stats` collects the time spent waiting
# for bytes (`recv_s`) and the time the loader took (`load_s`).

# %%
#| export
def receive_buckets(group:SyncGroup, # this worker's sync group
                    plan:SyncPlan, # the plan of this sync
                    stats:dict|None=None, # filled with recv_s, load_s, bytes
                    timing:bool=False, # synchronise around each phase (benchmarks)
                   ) -> Iterator[tuple[str, Tensor]]: # (name, full tensor view), in plan order
    "Receive every bucket of `plan` from rank 0, yielding its tensors; the next bucket is in flight meanwhile."
    stats = {} if stats is None else stats
    stats.update(recv_s=0.0, load_s=0.0, bytes=0)
    def post(k):
        buf = torch.empty(plan.bucket_nbytes[k], dtype=torch.uint8, device=group.device)
        return buf, group.broadcast(buf)
    nxt = post(0) if plan.buckets else None
    for k, specs in enumerate(plan.buckets):
        t0 = time.perf_counter()
        buf, work = nxt
        work.wait()
        if timing: _sync_device(group.device)
        t1 = time.perf_counter(); stats["recv_s"] += t1 - t0
        nxt = post(k + 1) if k + 1 < len(plan.buckets) else None
        yield from unpack_bucket(buf, specs)
        if timing: _sync_device(group.device)
        stats["load_s"] += time.perf_counter() - t1
        stats["bytes"] += sum(s.nbytes for s in specs)
    _sync_device(group.device)
    stats["t_end"], stats["host"] = time.time(), socket.gethostname()   # when the last bucket was handed over (and copied, on GPU)

# %% [markdown]
# The transformers engine (and any engine that keeps its parameters as they are) loads with a plain
# copy. It is strict: a name the engine does not have, a shape that differs, or a parameter the sync did
# not cover is an error — a sync that silently leaves half the model old is the "stale weights" bug.

# %%
#| export
def load_into_module(module:nn.Module, # the engine's model
                     named:Iterable[tuple[str, Tensor]], # (name, full tensor), e.g. from `receive_buckets`
                     strict:bool=True, # every parameter of `module` must be received
                    ) -> int: # tensors loaded
    "Copy received tensors into `module`'s parameters (dtype cast on the way)."
    params = dict(module.named_parameters())
    seen = set()
    with torch.no_grad():
        for name, t in named:
            p = params.get(name)
            if p is None: raise WeightSyncError(f"the engine has no parameter {name!r}; learner and engine models differ. Fix: load the engine from the learner's model.")
            if tuple(p.shape) != tuple(t.shape): raise WeightSyncError(f"{name}: engine shape {tuple(p.shape)} != learner shape {tuple(t.shape)}.")
            p.copy_(t, non_blocking=True); seen.add(name)
    missing = sorted(set(params) - seen)
    if strict and missing: raise WeightSyncError(f"the sync did not cover {len(missing)} engine parameters, e.g. {missing[:3]}; they would stay stale.")
    return len(seen)

# %% [markdown]
# **vLLM.** `VllmWorkerExtension` is injected into every vLLM worker (`worker_extension_cls`), and
# `VllmEngine` reaches its methods through `LLM.collective_rpc`. Method names start with `grpo_` because
# vLLM refuses an extension whose names clash with the worker's own (it has an `update_weights`). The
# receive hands the streaming iterator to the worker's own `reload_weights(weights_iterator=...,
# is_checkpoint_format=True)`: the loader renames, fuses, shards and (on CPU) repacks exactly as at start
# up. (`model.load_weights` alone fails on CPU, where linear weights are repacked into another layout.)

# %% [markdown]
# **Tied embeddings: a trap of the in-place reload.** vLLM ties `lm_head` to `embed_tokens` by making
# both modules hold the *same* parameter. The checkpoint has no `lm_head.weight`, so the reload loads and
# re-processes only `embed_tokens`; `lm_head` gets its (shared, now updated) parameter back but is not
# processed again. On CPU, processing an LM head means packing its weight for the GEMM kernel
# (`dispatch_cpu_unquantized_gemm` builds a `cpu_linear` closure over a packed copy), so the engine kept
# computing logits with the *old* packed head: tied models synced "successfully" and produced
# log-probs 0.5–1.0 off (untied models were exact). `refresh_shared_modules` therefore re-runs the
# weight processing of every module that shares a parameter with another one after each reload. On GPU
# this processing is a no-op for unquantized heads; on CPU it re-packs the head (as an untied model's
# reload does anyway).

# %%
#| export
def refresh_shared_modules(model:nn.Module, # the engine's model (vLLM: `worker.model_runner.get_model()`)
                          ) -> list[str]: # names of the modules re-processed
    "Re-run `quant_method.process_weights_after_loading` on every module that shares a parameter with another module."
    owners:dict[int, list[tuple[str, nn.Module]]] = {}
    for name, mod in model.named_modules():
        for p in mod._parameters.values():
            if p is not None: owners.setdefault(id(p), []).append((name, mod))
    done = []
    for mods in owners.values():
        if len(mods) < 2: continue
        for name, mod in mods:
            qm = getattr(mod, "quant_method", None)
            if qm is not None and hasattr(qm, "process_weights_after_loading") and name not in done:
                qm.process_weights_after_loading(mod); done.append(name)
    return done

# %%
#| export
class VllmWorkerExtension:
    "Weight-sync methods added to every vLLM worker; called through `LLM.collective_rpc('grpo_…')`."
    def grpo_join_sync(self, host:str, port:int, world_size:int, rank_offset:int, backend:str="gloo", timeout_s:float=600) -> int:
        "Join the weight-sync group as rank `rank_offset + tp_rank`; returns the rank."
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        rank = rank_offset + get_tensor_model_parallel_rank()
        self.grpo_group = join_group(host, port, rank, world_size, backend, device=self.device, timeout_s=timeout_s)
        return rank

    def grpo_receive_weights(self, plan:dict, timing:bool=False) -> dict:
        "Receive one sync and load it through vLLM's own loader, layer by layer as the buckets arrive."
        from vllm.config import set_current_vllm_config
        stats, t0 = {}, time.perf_counter()
        self.reload_weights(weights_iterator=receive_buckets(self.grpo_group, SyncPlan.from_dict(plan), stats, timing),
                            is_checkpoint_format=True)
        with set_current_vllm_config(self.vllm_config):
            stats["refreshed"] = refresh_shared_modules(self.model_runner.get_model())   # tied lm_head (see above)
        stats["reload_s"], stats["t_end"] = time.perf_counter() - t0, time.time()   # includes vLLM's post-processing
        return stats

    def grpo_close_sync(self) -> None:
        "Leave the weight-sync group."
        g = getattr(self, "grpo_group", None)
        if g is not None: g.close(); self.grpo_group = None

# %% [markdown]
# ## Verification
#
# Two checks, both errors when they fail:
#
# - **Log-probs.** Each engine completes fixed prompts greedily (its KV cache and its kernels included);
#   the learner scores the same tokens with a plain forward. In fp32 they agree to about 1e-5; the
#   default tolerance is 1e-4 (bf16 engines need about 0.1). Stale weights, a skipped TP worker, a stale
#   prefix cache or a split fused group all show up as errors of order 1.
# - **Checksums**, where the engine keeps raw tensors (the transformers engine): an exact, order-sensitive
#   checksum of every tensor's bytes, computed the same way on both sides. vLLM (CPU and GPU builds)
#   repacks linear weights, so it is compared by log-probs only.

# %%
#| export
_CHUNK = 1 << 24

def tensor_checksum(t:Tensor) -> int:
    "An exact, order-sensitive checksum of a tensor's bytes (the same on CPU and GPU, for any reduction order)."
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    w = b.view(torch.int32) if b.numel() % 4 == 0 else (b.view(torch.int16) if b.numel() % 2 == 0 else b)
    total = 0
    for s in range(0, w.numel(), _CHUNK):
        c = w[s:s + _CHUNK].to(torch.int64)
        pos = torch.arange(s, s + c.numel(), device=c.device, dtype=torch.int64) % 65521 + 1   # position weights
        total += int((c * pos).sum())   # int64 sums wrap identically in any order
    return total % (1 << 64)

def module_checksums(named:Iterable[tuple[str, Tensor]], # (name, tensor) pairs
                    ) -> dict[str, int]:
    "Checksum of every tensor, by name."
    return {n: tensor_checksum(t) for n, t in named}

# %%
a = torch.randn(100)
b = a.clone(); b[[3, 7]] = b[[7, 3]]        # same bytes, other order
c = a.clone(); c[50] = torch.nextafter(c[50], torch.tensor(1e9))   # one ulp
test_eq(len({tensor_checksum(a), tensor_checksum(b), tensor_checksum(c)}), 3)
test_eq(tensor_checksum(a), tensor_checksum(a.clone()))

# %%
#| export
def gathered_checksums(named_params:Iterable[tuple[str, Tensor]], # learner parameters (ZeRO-3 placeholders are fine)
                       plan:SyncPlan, # gives the buckets: memory stays bounded as in a sync
                       rank:int=0, # this learner's rank; only rank 0 computes
                      ) -> dict[str, int]: # rank 0: checksum by name; other ranks: {}
    "Checksums of the learner's full tensors, gathered bucket by bucket (every learner rank calls this under ZeRO-3)."
    params = dict(named_params)
    partitioned = any(_partitioned(p) for p in params.values())
    out = {}
    if rank != 0 and not partitioned: return out
    if partitioned: import deepspeed
    for specs in plan.buckets:
        ps = [params[s.name] for s in specs]
        with (deepspeed.zero.GatheredParameters(ps, modifier_rank=None) if partitioned else nullcontext()):
            if rank == 0: out.update({s.name: tensor_checksum(p) for s, p in zip(specs, ps)})
    return out

# %% [markdown]
# `sequence_logprobs` is the learner's side of the log-prob check: one forward per sequence (no padding
# to get wrong), the log-prob of each token after the prompt. Under ZeRO-3 every rank must run it on the
# same sequences (the forward gathers layers collectively).

# %%
#| export
@torch.no_grad()
def sequence_logprobs(model:nn.Module, # a causal LM (HF interface: `model(input_ids=...).logits`)
                      sequences:Sequence[Sequence[int]], # prompt + completion token ids
                      prompt_lens:Sequence[int], # prompt length of each sequence
                      temperature:float=1.0, # divide logits by it (1 for the greedy check)
                     ) -> list[list[float]]: # log-prob of every completion token
    "Log-probs of each sequence's completion tokens under `model`, one forward per sequence."
    dev = next(model.parameters()).device
    out = []
    for seq, L in zip(sequences, prompt_lens):
        ids = torch.tensor([list(seq)], device=dev)                               # [1, T]
        z = model(input_ids=ids).logits[0, L - 1:-1].float() / temperature          # [T - L, V]
        out.append(z.log_softmax(-1).gather(-1, ids[0, L:, None])[:, 0].tolist())
    return out

# %%
#| export
DEFAULT_VERIFY_PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14], [15, 16]]
"Token-id prompts used by `verify_sync` when none are given (valid for any vocabulary of 17 tokens or more)."

def verify_sync(engines:Sequence, # engine objects or actor handles (`generate`, `weight_checksums`)
                score:Callable[[list, list], list], # (sequences, prompt_lens) -> learner log-probs per completion token
                prompts:Sequence|None=None, # fixed prompts (token ids or strings); None: `DEFAULT_VERIFY_PROMPTS`
                max_new_tokens:int=8, # greedy tokens per prompt
                atol:float=1e-4, # largest allowed |engine - learner| log-prob (fp32; use ~0.1 for bf16)
                checksums:dict[str, int]|None=None, # the learner's `gathered_checksums`; None: log-probs only
               ) -> dict: # what was compared, and the largest difference
    "Check that every engine computes what the learner computes; raise `WeightSyncError` where it does not."
    prompts = list(prompts or DEFAULT_VERIFY_PROMPTS)
    spec = SamplingSpec(n=1, max_new_tokens=max_new_tokens, temperature=0.0, seed=None)
    outs = gather([submit(e, "generate", prompts, spec) for e in engines])
    report = {"engines": len(engines), "tokens": 0, "max_abs_logprob_diff": 0.0, "checksums": "not compared"}
    for i, samples in enumerate(outs):
        ref = score([s.prompt_ids + s.completion_ids for s in samples], [len(s.prompt_ids) for s in samples])
        for s, r in zip(samples, ref):
            d = (torch.tensor(s.logprobs, dtype=torch.float64) - torch.tensor(r, dtype=torch.float64)).abs()
            if d.numel() == 0: continue
            report["tokens"] += d.numel()
            report["max_abs_logprob_diff"] = max(report["max_abs_logprob_diff"], float(d.max()))
            if not float(d.max()) <= atol:   # NaN fails too
                t = int(d.argmax())
                raise WeightSyncError(
                    f"engine {i}: log-prob of token {t} of prompt {s.prompt_index} is {s.logprobs[t]:.6f} on the engine and {r[t]:.6f} "
                    f"on the learner (|Δ| = {float(d.max()):.2e} > {atol:g}). The engine runs other weights than the learner "
                    "(stale, partially loaded or corrupted). Fix: sync again; if it persists, re-create the engine.")
    if checksums is not None:
        sums = gather([submit(e, "weight_checksums") for e in engines])
        compared = 0
        for i, got in enumerate(sums):
            if got is None: continue
            diff = sorted(n for n in checksums if got.get(n) != checksums[n])
            if diff: raise WeightSyncError(f"engine {i}: {len(diff)} tensors differ bit-wise from the learner's, e.g. {diff[:3]}. Fix: sync again.")
            compared += 1
        report["checksums"] = f"{compared} engine(s) bit-identical on {len(checksums)} tensors" if compared else "not available (engines repack weights)"
    return report

# %% [markdown]
# ## Driving a sync
#
# The learner's side of the protocol is a mixin, `WeightSyncSource`, for the learner actor (or any
# object holding the policy): it needs `sync_module()` (the `nn.Module` whose parameters are the policy;
# the default unwraps a DeepSpeed engine in `self.model`) and `learner_rank()`. The driver — the trainer,
# a notebook, a test — then only calls:
#
# - `connect_weight_sync(learners, engines, tp)`: rank 0 opens the store, every TP worker of engine `i`
#   joins as rank `1 + i·TP + j` (`grpo_nb.placement.sync_rank`), all at once.
# - `sync_weights(learners, engines)`: **(1)** every learner rank checks its weights and computes the
#   plan; a non-finite verdict raises here, before any engine is called; **(2)** the engines start
#   receiving (one call each, carrying the plan: the one metadata message) while every learner rank
#   sends; **(3)** per-phase times come back.
# - `verify_weight_sync(learners, engines)`: `verify_sync` with the learners as scorer (and checksums).
#
# Both learner and engine calls go through `submit`/`gather`, so they run concurrently whether the
# objects are Ray actors or live in this process (threads). Engines must be synced after a resume too
# (they start from the checkpoint on disk at best, the base model at worst): the trainer calls
# `sync_weights` right after restoring the learner.

# %%
#| export
class WeightSyncSource:
    "Mixin for learner actors: the learner side of `connect_weight_sync`, `sync_weights` and `verify_weight_sync`."
    def sync_module(self) -> nn.Module:
        "The policy module whose parameters are synced (default: `self.model`, unwrapped from DeepSpeed)."
        m = self.model
        return getattr(m, "module", m)
    def learner_rank(self) -> int:
        "This learner's rank in its world (0 without torch.distributed)."
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    def ws_open(self, host:str|None=None, backend:str="auto", timeout_s:float=600) -> tuple[str, int, str]:
        "Rank 0: open the group's store; returns (host, port, backend) for the engines."
        if host is None:
            try:
                import ray
                host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
            except ImportError: host = "127.0.0.1"
        if backend == "auto": backend = "nccl" if next(self.sync_module().parameters()).device.type == "cuda" else "gloo"
        self._ws_store, self._ws_addr = open_store(host, timeout_s), (host, backend, timeout_s)
        return host, self._ws_store.port, backend
    def ws_join(self, world_size:int) -> int:
        "Rank 0: join the group as rank 0 (blocks until every engine worker has joined, with gloo)."
        host, backend, timeout_s = self._ws_addr
        self._ws_group = join_group(host, self._ws_store.port, 0, world_size, backend, store=self._ws_store, timeout_s=timeout_s)
        return 0
    def ws_prepare(self, bucket_bytes:int|None=DEFAULT_BUCKET_BYTES, version:int=0) -> dict:
        "Every rank: NaN/Inf check of the local weights (all-reduced) and, on rank 0, the plan as plain data."
        m = self.sync_module()
        bad = nonfinite_params(m.named_parameters())
        plan = make_plan(m.named_parameters(), bucket_bytes, version) if self.learner_rank() == 0 else None
        return {"nonfinite": bad, "plan": None if plan is None else plan.to_dict()}
    def ws_send(self, plan:dict, timing:bool=False) -> dict:
        "Every rank: gather and (rank 0) broadcast the buckets of `plan`."
        return send_weights(self.sync_module().named_parameters(), SyncPlan.from_dict(plan),
                            getattr(self, "_ws_group", None) if self.learner_rank() == 0 else None, timing)
    def ws_checksums(self, plan:dict) -> dict:
        "Every rank: checksums of the full tensors (rank 0 returns them)."
        return gathered_checksums(self.sync_module().named_parameters(), SyncPlan.from_dict(plan), self.learner_rank())
    def ws_logprobs(self, sequences:list, prompt_lens:list) -> list:
        "Every rank: learner log-probs of the completion tokens."
        return sequence_logprobs(self.sync_module(), sequences, prompt_lens)
    def ws_close(self) -> None:
        "Rank 0: leave the group."
        g = getattr(self, "_ws_group", None)
        if g is not None: g.close()
        self._ws_group = self._ws_store = None

# %%
#| export
def connect_weight_sync(learners:Sequence, # learner objects or actor handles (`WeightSyncSource`), rank 0 first
                        engines:Sequence, # engine objects or actor handles
                        tp:int=1, # TP workers per engine
                        backend:Literal["auto","gloo","nccl"]="auto", # "auto": NCCL when the learner's weights are on a GPU
                        timeout_s:float=600, # join and collective timeout
                       ) -> dict: # host, port, backend, world_size, engine ranks
    "Form the weight-sync group: learner rank 0 plus every engine worker (world = engines × TP + 1)."
    from grpo_nb.placement import sync_rank
    host, port, backend = call(learners[0], "ws_open", None, backend, timeout_s)
    world = len(engines) * tp + 1
    calls = [submit(learners[0], "ws_join", world)] + \
            [submit(e, "join_weight_sync", host, port, world, sync_rank(i, 0, tp), backend, timeout_s) for i, e in enumerate(engines)]
    ranks = gather(calls, timeout_s)
    return {"host": host, "port": port, "backend": backend, "world_size": world, "engine_ranks": ranks[1:]}

def _one_host(*stats) -> bool: return len({st.get("host") for st in stats}) == 1 and stats[0].get("host") is not None

def sync_weights(learners:Sequence, # every learner rank (rank 0 first); ZeRO-3 gathers need them all
                 engines:Sequence, # every engine
                 bucket_bytes:int|None=DEFAULT_BUCKET_BYTES, # bucket size; None: the whole model at once
                 version:int=0, # policy version stamped on the plan
                 timing:bool=False, # exact per-phase times (synchronises; for benchmarks)
                 timeout_s:float|None=None, # give up after this many seconds
                ) -> dict: # bytes, tensors, buckets, gather_s, send_s, recv_s, load_s, total_s
    "Check the learner's weights, then push them into every engine; refuses NaN/Inf before any engine is contacted."
    t0 = time.perf_counter()
    preps = gather([submit(l, "ws_prepare", bucket_bytes, version) for l in learners], timeout_s)
    bad = sorted({n for p in preps for n in p["nonfinite"]})
    if bad:
        raise NonFiniteWeightsError(f"{len(bad)} learner parameters hold NaN/Inf (e.g. {bad[:3]}); the sync was refused and the engines "
                                    "keep their previous weights. Fix: find the divergence (learning rate, loss scale, bad batch) and "
                                    "resume from the last good checkpoint.")
    plan = preps[0]["plan"]
    t1 = time.perf_counter()
    res = gather([submit(e, "receive_weights", plan, timing) for e in engines] +
                 [submit(l, "ws_send", plan, timing) for l in learners], timeout_s)
    call_s = time.perf_counter() - t1
    recv, sent = res[:len(engines)], res[len(engines)]
    p = SyncPlan.from_dict(plan)
    ends = [r["t_end"] for r in recv if "t_end" in r]
    return {"bytes": p.total_bytes, "tensors": p.num_tensors, "buckets": len(p.buckets), "prepare_s": t1 - t0,
            "gather_s": sent["gather_s"], "send_s": sent["send_s"],
            "recv_s": max((r.get("recv_s", 0.0) for r in recv), default=0.0),
            "load_s": max((r.get("load_s", 0.0) for r in recv), default=0.0),
            # first gather on learner rank 0 -> last engine done (wall clocks of one host; else the driver's view)
            "total_s": max(ends) - sent["t_start"] if len(ends) == len(recv) and _one_host(sent, *recv) else call_s,
            "call_s": call_s}

def verify_weight_sync(learners:Sequence, # every learner rank (rank 0 first)
                       engines:Sequence, # every engine
                       prompts:Sequence|None=None, # fixed prompts; None: `DEFAULT_VERIFY_PROMPTS`
                       atol:float=1e-4, # log-prob tolerance (fp32; ~0.1 for bf16)
                       checksums:bool=True, # also compare checksums with engines that keep raw tensors
                       bucket_bytes:int|None=DEFAULT_BUCKET_BYTES, # gather granularity of the checksums
                       max_new_tokens:int=8, # greedy tokens per prompt
                      ) -> dict:
    "`verify_sync` with the learner group as the scorer; raises `WeightSyncError` on any difference."
    def score(seqs, lens): return gather([submit(l, "ws_logprobs", seqs, lens) for l in learners])[0]
    sums = None
    if checksums:
        plan = gather([submit(l, "ws_prepare", bucket_bytes) for l in learners])[0]["plan"]
        sums = gather([submit(l, "ws_checksums", plan) for l in learners])[0]
    return verify_sync(engines, score, prompts, max_new_tokens, atol, sums)

# %% [markdown]
# ## End to end in this process
#
# A plain-module learner (ZeRO 0: rank 0 holds the full weights) and a transformers engine, both in this
# process, the two ends of the broadcast running on threads through `submit`. The engine starts from
# *other* random weights; before the sync the check fails, after it both checks pass — log-probs to
# float rounding and checksums bit for bit. Then a NaN is planted in the learner and the sync is refused
# with the engine untouched.

# %%
from grpo_nb.rollout import HFEngine

class Learner(WeightSyncSource):
    def __init__(self, model): self.model = model

learner = Learner(policy)
torch.manual_seed(1)
engine = HFEngine(cfg_tiny, device="cpu", seed=1)   # other weights than the learner
info = connect_weight_sync([learner], [engine], tp=1)
info

# %%
test_fail(lambda: verify_weight_sync([learner], [engine]), contains="log-prob")
stats = sync_weights([learner], [engine], bucket_bytes=20_000)
report = verify_weight_sync([learner], [engine], bucket_bytes=20_000)
print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()}); print(report)
assert report["max_abs_logprob_diff"] < 1e-4 and "bit-identical" in report["checksums"]

# %%
with torch.no_grad(): policy.model.layers[0].self_attn.k_proj.weight[0, 0] = float("inf")
before = tensor_checksum(engine.model.model.layers[0].self_attn.k_proj.weight)
test_fail(lambda: sync_weights([learner], [engine]), contains="model.layers.0.self_attn.k_proj.weight")
test_eq(tensor_checksum(engine.model.model.layers[0].self_attn.k_proj.weight), before)   # the engine never saw it

# %%
learner.ws_close(); engine.close()

# %% [markdown]
# ## The real thing: ZeRO-3 learners and vLLM engines
#
# The production path — two DeepSpeed ZeRO-3 learner ranks (gloo) and a float32 vLLM engine in Ray
# actors, TP = 1 and TP = 2 (including a model with one KV head and tied embeddings), perturb, sync,
# verify, refuse NaN — runs in `tests/test_weight_sync.py`, where it has the time budget to start Ray,
# DeepSpeed and vLLM processes. The test prints each sync's report; the cell below (flag `slow`) runs the
# TP = 1 half of it here.

# %%
#| slow
import subprocess, sys
r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-k", "tp1", "--no-header", "-p", "no:cacheprovider",
                    str(Path("../tests/test_weight_sync.py"))], capture_output=True, text=True)
print(r.stdout[-3000:]); assert r.returncode == 0, r.stderr[-3000:]

# %% [markdown]
# ## On GPUs: `bench/weight_sync.py`
#
# A Qwen2.5-1.5B-shaped learner (random init, bf16, 3.09 GB) under ZeRO-3 on GPU 0 pushes into a
# transformers engine on GPU 1 through NCCL, with per-phase times, against a raw NCCL broadcast of the
# same bytes in the same run (the floor). Its results are committed to `bench/results/weight_sync.json`
# and shown here.

# %%
#| export
def bench_table(path:str|Path="bench/results/weight_sync.json", # results written by bench/weight_sync.py
               ) -> str: # a markdown table (or a note that there are no results yet)
    "The weight-sync benchmark results as a markdown table."
    p = Path(path)
    if not p.exists(): return f"_No results yet: run `bench/weight_sync.py` on a 2-GPU machine (it writes {p})._"
    rows = json.loads(p.read_text())
    rows = rows.get("records", rows) if isinstance(rows, dict) else rows
    head = "| model | device | bucket | GB | floor ms | gather ms | send ms | load ms | total ms | total / floor | GB/s |\n|---|---|---|---|---|---|---|---|---|---|---|"
    lines = [f"| {r['model']} | {r.get('device', '?')} | {r.get('bucket', '')} | {r['bytes'] / 1e9:.2f} | {r['floor_s'] * 1e3:.1f} | "
             f"{r['gather_s'] * 1e3:.1f} | {r['send_s'] * 1e3:.1f} | {r['load_s'] * 1e3:.1f} | {r['total_s'] * 1e3:.1f} | "
             f"{r['total_s'] / r['floor_s']:.2f} | {r['bytes'] / r['total_s'] / 1e9:.0f} |" for r in rows]
    return "\n".join([head] + lines)

# %%
from IPython.display import Markdown
Markdown(bench_table(Path("..") / "bench/results/weight_sync.json"))
