# %%
#| default_exp tiny

# %% [markdown]
# # Tiny models
# > Real engines on two CPU cores: a tokenizer, Qwen2-shaped policies of a few hundred kB and an arithmetic task, all built here in seconds

# %% [markdown]
# Every claim grpo-nb makes about its engines is checked in CI on a machine with two CPU cores and no
# GPU: a real Ray cluster places actors, a real vLLM engine (the CPU build) samples tokens and their
# log-probs, real DeepSpeed ZeRO-3 partitions a model and takes an optimizer step. Mocks would test our
# idea of those engines; the engines themselves change under us with every release.
#
# That needs models that are *real* and *tiny* at once:
#
# - **real**: the architecture is `Qwen2ForCausalLM`, a class both transformers and vLLM implement, with
#   grouped-query attention, rotary embeddings, tied or untied embeddings: the code paths a 7B Qwen run takes.
# - **tiny**: a few hundred thousand parameters, so a vLLM engine starts in seconds and a ZeRO-3 step
#   takes a fraction of one; a policy small enough to *learn* a task on two cores within the demo's minutes.
# - **built here**: CI has no hub access (`HF_HUB_OFFLINE=1`), so the tokenizer and the weights are made by
#   this notebook, deterministically for a seed, and cached so tests build them once.
#
# The task is synthetic and verifiable, the smallest stand-in for GSM8K-style RL: `12+7=` must be
# completed by `19` and end-of-sequence; the reward is exact match. Numbers below are computed by the cells
# that print them.
#
# Symbols: `B` sequences, `T` tokens, `V` vocabulary.

# %%
#| export
from __future__ import annotations
import argparse, contextlib, gc, hashlib, json, math, multiprocessing, os, queue, random, shutil, socket, string
import sys, tempfile, time, traceback, zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional

# %%
#| hide
from fastcore.test import test_eq, test_close, test_fail, test_ne
from IPython.display import Markdown
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging
import torch
import grpo_nb.tiny as lib

# %%
#| hide
hf_logging.disable_progress_bar()  # the examples' 1 MB models need no progress bars

# %% [markdown]
# ## A character-level tokenizer
#
# One token per character keeps the model's job honest (it must learn carries digit by digit) and the
# vocabulary tiny (`V` ≈ 100), so the embedding and the fp32 logits cost nothing. Four special tokens come
# first, at fixed ids, then digits, the arithmetic operators, whitespace, letters and punctuation. Any other
# character becomes `<unk>`. `<bos>` is added in front of every encoded text, the way Llama-family tokenizers
# do, so position 0 is always the same token.

# %%
#| export
SPECIAL_TOKENS:dict[str, str] = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}
"Role -> special token; their ids are 0, 1, 2, 3 in this order."
ALPHABET:str = string.digits + "+-*/=()<>%^" + " \n" + string.ascii_lowercase + string.ascii_uppercase + ".,:;!?'\"#&@_[]{}|~$`\\"
"Every character with its own token, after the special tokens."
CHAT_TEMPLATE:str = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant: {% endif %}")
"A plain-text chat template: `<bos>user: 12+7=\\nassistant: `."

# %% [markdown]
# `build_tokenizer` assembles it with the `tokenizers` library: a word-level model whose words are single
# characters (the pre-tokenizer isolates each character), a `Fuse` decoder that joins tokens back without
# spaces, and a post-processor that prepends `<bos>`. Saved as a transformers `PreTrainedTokenizerFast`
# directory, both `AutoTokenizer.from_pretrained` and vLLM load it.

# %%
#| export
def build_tokenizer(out_dir:str|Path|None=None, # where to save it (tokenizer.json, tokenizer_config.json, ...); None: don't save
                   ):
    "The character-level tokenizer as a transformers fast tokenizer, saved to `out_dir` when given."
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS.values(), *ALPHABET])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()                                                     # join pieces without spaces
    bos = SPECIAL_TOKENS["bos"]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])])
    tok.add_special_tokens(list(SPECIAL_TOKENS.values()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=CHAT_TEMPLATE, model_max_length=4096,
                                   **{f"{k}_token": v for k, v in SPECIAL_TOKENS.items()})
    if out_dir is not None: _save_tokenizer(fast, Path(out_dir))
    return fast

def _save_tokenizer(fast, out_dir:Path):
    "Save with a class name and a special-tokens map that transformers 4 and 5 (and vLLM) all read."
    fast.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()); cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (out_dir / "special_tokens_map.json").write_text(json.dumps({f"{k}_token": v for k, v in SPECIAL_TOKENS.items()}, indent=2))

# %%
tok = build_tokenizer()
ids = tok("12+7=").input_ids
print(len(tok), "tokens;", ids, "->", tok.convert_ids_to_tokens(ids))
test_eq(ids[0], tok.bos_token_id)
test_eq(tok.decode(ids, skip_special_tokens=True), "12+7=")
test_eq([tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id], [0, 1, 2, 3])

# %% [markdown]
# Text round-trips exactly, spaces and newlines included; characters outside the alphabet become `<unk>`:

# %%
s = "Q: what is 12 + 7?\nA: 19."
test_eq(tok.decode(tok(s).input_ids, skip_special_tokens=True), s)
test_eq(tok("é").input_ids, [tok.bos_token_id, tok.unk_token_id])
chat = tok.apply_chat_template([{"role": "user", "content": "12+7="}], add_generation_prompt=True, tokenize=False)
print(repr(chat))
test_eq(chat, "<bos>user: 12+7=\nassistant: ")

# %% [markdown]
# ## The models
#
# A `TinySpec` names the few numbers that matter; everything else is Qwen2's defaults. `head_dim` stays at
# 32 because vLLM's CPU attention kernels need at least that; `V` comes from the tokenizer.
#
# - `tiny-arith` is the demo policy: 4 query heads sharing 2 KV heads (GQA), 2 layers, big enough to learn
#   addition of numbers up to 19 from a few hundred examples, small enough that a learner step on 2 cores
#   takes a fraction of a second.
# - `tiny-1kv-tied` (one KV head, tied embeddings: multi-query attention) and `tiny-untied` (a separate
#   `lm_head`) are smaller still and exist for tests: weight sync, checkpoint export and vLLM loading each
#   treat these cases differently, and each must be exercised.

# %%
#| export
@dataclass(frozen=True)
class TinySpec:
    "The shape of a tiny Qwen2 policy; the rest are Qwen2's defaults."
    hidden_size:int # model width d
    num_hidden_layers:int # decoder layers
    num_attention_heads:int # query heads; hidden_size = heads × head_dim
    num_key_value_heads:int # KV heads (GQA groups; 1 is multi-query attention)
    intermediate_size:int # MLP width
    tie_word_embeddings:bool # lm_head shares the embedding matrix
    head_dim:int=32 # per-head width (vLLM's CPU kernels need >= 32)
    max_position_embeddings:int=256 # longest sequence (prompt + completion)

TINY_MODELS:dict[str, TinySpec] = {
    "tiny-arith":    TinySpec(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=384, tie_word_embeddings=True),
    "tiny-1kv-tied": TinySpec(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                              intermediate_size=128, tie_word_embeddings=True),
    "tiny-untied":   TinySpec(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                              intermediate_size=128, tie_word_embeddings=False),
}
"Built-in tiny policies by name (`model.name_or_path` may name one)."

# %%
#| export
def tiny_config(name:str, # a key of `TINY_MODELS`
                vocab_size:int|None=None, # V (default: the tokenizer's size)
               ):
    "The transformers `Qwen2Config` of a built-in tiny model."
    from transformers import Qwen2Config
    if name not in TINY_MODELS:
        raise KeyError(f"no tiny model {name!r}; choose one of {sorted(TINY_MODELS)} or add a TinySpec to TINY_MODELS")
    s = TINY_MODELS[name]
    if s.hidden_size != s.num_attention_heads * s.head_dim or s.num_attention_heads % s.num_key_value_heads:
        raise ValueError(f"{name}: need hidden_size = heads × head_dim and heads divisible by KV heads (got {s})")
    return Qwen2Config(vocab_size=vocab_size or len(ALPHABET) + len(SPECIAL_TOKENS), **asdict(s),
                       rope_theta=10000.0, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                       dtype="float32", architectures=["Qwen2ForCausalLM"])

# %%
cfg = tiny_config("tiny-arith")
print(cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size)
test_eq(cfg.vocab_size, len(tok))
test_fail(lambda: tiny_config("tiny-arithm"), contains="choose one of")

# %% [markdown]
# `build_tiny_model` writes a complete Hugging Face model directory: `config.json`, `model.safetensors`
# and the tokenizer. Weights are initialised by transformers' own `_init_weights` (normal, std 0.02) under
# a fixed seed, so the same name and seed give the same bytes, and the first loss is near `ln V`, the
# loss of a uniform guess, instead of the huge losses a careless init gives.

# %%
#| export
def build_tiny_model(name:str="tiny-arith", # a key of `TINY_MODELS`
                     out_dir:str|Path|None=None, # directory to write (created); None: a new temporary directory
                     seed:int=0, # weight-init seed: same name and seed give identical weights
                    ) -> Path:
    "Write config.json, model.safetensors and the tokenizer of a tiny Qwen2 model into `out_dir`; return its path."
    import torch
    from transformers import Qwen2ForCausalLM
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"{name}-"))
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    cfg = tiny_config(name, vocab_size=len(tok))
    with _torch_seed(seed):
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
    with _no_progress_bars(): model.save_pretrained(out, safe_serialization=True)
    return out

@contextlib.contextmanager
def _no_progress_bars():
    "transformers' progress bars off for the block (they clutter logs and notebooks for 1 MB models)."
    from transformers.utils import logging as hf_logging
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try: yield
    finally:
        if was: hf_logging.enable_progress_bar()

@contextlib.contextmanager
def _torch_threads(n:int):
    "Use `n` torch threads for the block, then the caller's number again."
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try: yield
    finally: torch.set_num_threads(old)

@contextlib.contextmanager
def _torch_seed(seed:int):
    "Seed torch's CPU generator for the block and restore the caller's generator state afterwards."
    import torch
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try: yield
    finally: torch.random.set_rng_state(state)

# %%
with tempfile.TemporaryDirectory() as td:
    d = build_tiny_model("tiny-arith", Path(td) / "a", seed=0)
    print(sorted(p.name for p in d.iterdir()))
    m, t = AutoModelForCausalLM.from_pretrained(d), AutoTokenizer.from_pretrained(d)
    x = t(["12+7=19"], return_tensors="pt").input_ids
    with torch.no_grad(): first_loss = m(x, labels=x).loss.item()
    print(f"{type(m).__name__}: {sum(p.numel() for p in m.parameters()):,} parameters, first loss {first_loss:.3f} vs ln V = {math.log(len(t)):.3f}")
    test_close(first_loss, math.log(len(t)), eps=0.3)
    same = build_tiny_model("tiny-arith", Path(td) / "b", seed=0) / "model.safetensors"
    other = build_tiny_model("tiny-arith", Path(td) / "c", seed=1) / "model.safetensors"
    test_eq((d / "model.safetensors").read_bytes(), same.read_bytes())
    test_ne((d / "model.safetensors").read_bytes(), other.read_bytes())

# %% [markdown]
# The three built-in shapes, measured from the built models:

# %%
def _row(name):
    m = Qwen2ForCausalLM(tiny_config(name))
    n = sum(p.numel() for p in m.parameters())
    return f"| {name} | {n:,} | {4*n/2**20:.2f} | {m.config.num_key_value_heads} | {m.config.tie_word_embeddings} |"
Markdown("| model | parameters | fp32 MiB | KV heads | tied |\n|---|---|---|---|---|\n" + "\n".join(map(_row, TINY_MODELS)))

# %% [markdown]
# Tests and notebooks ask for a model by name through `tiny_model_dir`, which builds it once into a cache
# directory (`$GRPO_NB_CACHE`, else `~/.cache/grpo_nb`) keyed by name, seed and a fingerprint of the spec
# and tokenizer, so a changed spec never reuses stale weights. Builds go to a temporary sibling that is
# renamed into place, so two processes asking at once both get a complete directory.

# %%
#| export
TINY_FORMAT:int = 1
"Bump when the tokenizer or builder changes in a way the fingerprint cannot see; cached models are rebuilt."

def default_cache_dir() -> Path:
    "Where built tiny models are cached: `$GRPO_NB_CACHE`, else `~/.cache/grpo_nb`."
    return Path(os.environ.get("GRPO_NB_CACHE") or Path.home() / ".cache" / "grpo_nb")

def tiny_model_dir(name:str="tiny-arith", # a key of `TINY_MODELS`
                   seed:int=0, # weight-init seed
                   warm_steps:int=0, # >0: the policy after this many supervised warm-start steps on `builtin:arithmetic` (see `warm_start`)
                   cache_dir:str|Path|None=None, # cache root (default: `default_cache_dir()`)
                  ) -> Path:
    "Directory of a built tiny model, built once and cached; deterministic for (name, seed, warm_steps)."
    key = json.dumps([TINY_FORMAT, asdict(TINY_MODELS[name]), ALPHABET, SPECIAL_TOKENS, CHAT_TEMPLATE, seed, warm_steps])
    final = Path(cache_dir or default_cache_dir()) / "tiny" / f"{name}-s{seed}-w{warm_steps}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    if (final / "model.safetensors").exists(): return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        if warm_steps: warm_start(tiny_model_dir(name, seed, 0, cache_dir), tmp, load_builtin("arithmetic"), steps=warm_steps,
                                  seed=seed, eval_rows=load_builtin("arithmetic-eval"), eval_every=max(warm_steps // 3, 1))
        else: build_tiny_model(name, tmp, seed)
        try: os.rename(tmp, final)
        except OSError:
            if not (final / "model.safetensors").exists(): raise  # someone else won the race: use theirs
    finally: shutil.rmtree(tmp, ignore_errors=True)
    return final

# %%
with tempfile.TemporaryDirectory() as td:
    t0 = time.perf_counter(); d1 = tiny_model_dir("tiny-1kv-tied", cache_dir=td); t1 = time.perf_counter()
    d2 = tiny_model_dir("tiny-1kv-tied", cache_dir=td); t2 = time.perf_counter()
    print(d1.name, f"built in {t1-t0:.2f} s, found again in {1e3*(t2-t1):.1f} ms")
    test_eq(d1, d2)

# %% [markdown]
# ## The task: addition a tiny model can learn
#
# `make_arithmetic` writes problems as `{"prompt": "12+7=", "answer": "19"}`: the policy completes the
# prompt and the reward checks the completion against `answer`. The default range, operands 0 to 19, was
# picked by trying: trained by plain supervised learning on 2 cores, `tiny-arith` masters it on held-out
# pairs within a few hundred batches, while with operands up to 99 it barely moves in the same budget
# (left-to-right addition needs the carry before the digits it depends on are written; small models learn
# that slowly). A task learnt that fast leaves an RL demo room to show learning within minutes.
#
# Train and evaluation problems are **disjoint pairs**: a pair `(a, op, b)` belongs to the evaluation
# split when the CRC32 of its text is divisible by 10. The rule depends only on the pair, so a pair stays
# in its split whatever the seed, the range or the requested size; the evaluation split is about a tenth of
# all pairs.

# %%
#| export
Op = Literal["+", "-", "*"]

def arithmetic_split(a:int, # left operand
                     op:str, # operator
                     b:int, # right operand
                    ) -> Literal["train", "eval"]:
    "The split a problem belongs to: `eval` for about one pair in ten (by CRC32 of `a op b`), else `train`."
    return "eval" if zlib.crc32(f"{a}{op}{b}".encode()) % 10 == 0 else "train"

def make_arithmetic(n:int|None=None, # problems to return (None: every pair of the split once)
                    seed:int=0, # order and sampling seed (the split itself does not depend on it)
                    max_operand:int=19, # operands are drawn from 0..max_operand
                    ops:tuple[Op, ...]=("+",), # operators to use
                    split:Literal["train", "eval"]="train", # which disjoint set of pairs
                   ) -> list[dict]:
    "Arithmetic problems `{'prompt': '12+7=', 'answer': '19'}`, deterministic for the arguments."
    fns = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    if bad := [o for o in ops if o not in fns]: raise ValueError(f"unknown operator(s) {bad}; use some of {list(fns)}")
    pool = [(a, o, b) for o in ops for a in range(max_operand + 1) for b in range(max_operand + 1) if arithmetic_split(a, o, b) == split]
    if not pool: raise ValueError(f"the {split} split of operands 0..{max_operand} is empty; raise max_operand")
    rng = random.Random(f"arithmetic-{seed}-{split}")
    rng.shuffle(pool)
    if n is not None:  # cycle through fresh shuffles: every pair is used once before any repeats
        out = list(pool)
        while len(out) < n: out += rng.sample(pool, len(pool))
        pool = out[:n]
    return [{"prompt": f"{a}{o}{b}=", "answer": str(fns[o](a, b))} for a, o, b in pool]

# %%
train, ev = make_arithmetic(), make_arithmetic(split="eval")
print(f"{len(train)} train and {len(ev)} eval problems; e.g. {train[:3]}")
key = lambda r: r["prompt"]
test_eq(set(map(key, train)) & set(map(key, ev)), set())                  # disjoint
test_eq(len(train) + len(ev), 20 * 20)                                     # together: every pair once
test_eq(make_arithmetic(5, seed=3), make_arithmetic(5, seed=3))            # deterministic
test_eq(make_arithmetic(ops=("*",), max_operand=3, split="eval"), [{"prompt": "2*2=", "answer": "4"}])
test_eq(len(make_arithmetic(1000)), 1000)

# %% [markdown]
# `DataConfig` names the splits `builtin:arithmetic` and `builtin:arithmetic-eval`; `load_builtin` is how
# the trainer reads them (the `builtin:` prefix is optional).

# %%
#| export
BUILTIN_DATASETS:dict[str, dict] = {
    "arithmetic":      dict(split="train", max_operand=19, ops=("+",)),
    "arithmetic-eval": dict(split="eval",  max_operand=19, ops=("+",)),
}
"Built-in dataset name -> arguments of `make_arithmetic`."

def load_builtin(name:str, # `builtin:arithmetic`, `arithmetic-eval`, ... (a key of `BUILTIN_DATASETS`, prefix optional)
                 n:int|None=None, # problems (None: the whole split once)
                 seed:int=0, # order seed
                ) -> list[dict]:
    "Rows of a built-in dataset, each `{'prompt': ..., 'answer': ...}`."
    key = name.removeprefix("builtin:")
    if key not in BUILTIN_DATASETS:
        raise KeyError(f"no built-in dataset {name!r}; use one of {['builtin:' + k for k in BUILTIN_DATASETS]} or a jsonl/parquet path")
    return make_arithmetic(n, seed=seed, **BUILTIN_DATASETS[key])

# %%
test_eq(load_builtin("builtin:arithmetic"), train)
test_eq(load_builtin("arithmetic-eval"), ev)
test_fail(lambda: load_builtin("builtin:gsm8k"), contains="builtin:arithmetic")

# %% [markdown]
# ## A supervised warm start
#
# A randomly initialised policy never writes a correct answer followed by `<eos>` (the chance is about
# `V^-3`), so every GRPO group has equal rewards and zero advantage: nothing to learn from. Real GRPO runs
# start from a pretrained model for the same reason. `warm_start` is that pretraining in miniature: a few
# dozen batches of supervised learning on prompt → answer + `<eos>` (loss on the answer tokens only), enough
# to learn the format and some sums, far from all. `tiny_model_dir(name, warm_steps=k)` caches the result,
# with its training history in `warm_start.json`.
#
# `greedy_accuracy` measures exact-match accuracy with greedy decoding. It is plain torch, batched by
# prompt length (no padding, so no position-id subtleties).

# %%
#| export
def greedy_accuracy(model, # a causal LM (transformers)
                    tok, # its tokenizer
                    rows:list[dict], # problems {'prompt', 'answer'}
                    max_new_tokens:int=4, # generation limit
                   ) -> float:
    "Fraction of `rows` whose greedy completion is exactly `answer` followed by `<eos>`."
    import torch
    by_len: dict[int, list] = {}
    for r in rows: by_len.setdefault(len(tok(r["prompt"]).input_ids), []).append(r)
    correct, was_training = 0, model.training
    model.eval()
    with torch.no_grad():
        for L, group in by_len.items():
            ids = torch.tensor([tok(r["prompt"]).input_ids for r in group])                 # B, L
            for _ in range(max_new_tokens):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)  # B, L+t
            for r, out in zip(group, ids[:, L:].tolist()):
                want = tok(r["answer"], add_special_tokens=False).input_ids + [tok.eos_token_id]
                correct += out[:len(want)] == want
    model.train(was_training)
    return correct / max(len(rows), 1)

# %%
#| export
def warm_start(model_dir:str|Path, # starting policy (a HF directory)
               out_dir:str|Path, # where to write the trained policy (weights + tokenizer)
               rows:list[dict], # training problems {'prompt', 'answer'}
               steps:int=60, # optimizer steps
               lr:float=1e-3, # AdamW learning rate
               batch_size:int=64, # problems per step
               seed:int=0, # sampling and torch seed
               eval_rows:list[dict]|None=None, # held-out problems for `greedy_accuracy`; None: no evaluation
               eval_every:int=0, # steps between evaluations (0: only at the end, when eval_rows is given)
               threads:int=1, # torch threads while training (1: on a shared 2-core machine extra threads spin and waste CPU)
              ) -> list[dict]:
    "Supervised steps on prompt -> answer + <eos> (loss on the answer only); saves to `out_dir` (history in warm_start.json)."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    with _no_progress_bars(): model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng, history = random.Random(seed), []
    with _torch_seed(seed), _torch_threads(threads):
        for step in range(1, steps + 1):
            batch = [rng.choice(rows) for _ in range(batch_size)]
            p = [tok(r["prompt"]).input_ids for r in batch]
            c = [tok(r["answer"], add_special_tokens=False).input_ids + [tok.eos_token_id] for r in batch]
            T = max(len(a) + len(b) for a, b in zip(p, c))
            ids = torch.tensor([a + b + [tok.pad_token_id] * (T - len(a) - len(b)) for a, b in zip(p, c)])  # B, T
            labels = torch.tensor([[-100] * len(a) + b + [-100] * (T - len(a) - len(b)) for a, b in zip(p, c)])
            loss = model(ids, labels=labels).loss
            opt.zero_grad(); loss.backward(); opt.step()
            rec = {"step": step, "loss": loss.item()}
            if eval_rows and ((eval_every and step % eval_every == 0) or step == steps):
                rec["eval_accuracy"] = greedy_accuracy(model, tok, eval_rows)
            history.append(rec)
    with _no_progress_bars(): model.save_pretrained(out_dir, safe_serialization=True)
    _save_tokenizer(tok, Path(out_dir))
    (Path(out_dir) / "warm_start.json").write_text(json.dumps({"steps": steps, "lr": lr, "batch_size": batch_size, "seed": seed,
                                                               "history": history}, indent=1))
    return history

# %%
warm_dir = tiny_model_dir("tiny-arith", warm_steps=60)
hist = json.loads((warm_dir / "warm_start.json").read_text())["history"]
print("step  loss   held-out exact match")
for h in hist:
    if "eval_accuracy" in h: print(f"{h['step']:>4}  {h['loss']:.3f}  {h['eval_accuracy']:.3f}")
assert hist[-1]["loss"] < hist[0]["loss"] / 2, hist[-1]
assert hist[-1]["eval_accuracy"] < 0.6  # a start with room to learn, not a solved task

# %% [markdown]
# ## Running the real engines
#
# vLLM and DeepSpeed each take over process-wide state: vLLM initialises `torch.distributed`, pins threads
# and caches its environment; DeepSpeed's ranks need their own `torch.distributed` world. So each runs in a
# fresh *spawned* process that exits when done, and the caller gets plain Python results back.
# `spawn_call` starts one process per call, collects the results, and kills whatever is still alive on an
# error or timeout: a test that fails never leaves an engine behind.

# %%
#| export
def _spawn_child(i, fn, kwargs, q, log_path):
    if log_path:  # the engine's chatter goes to a file the parent shows only if something fails
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
    try: q.put((i, True, fn(**kwargs)))
    except BaseException: q.put((i, False, traceback.format_exc()))

def _tail(path:str, n:int=3000) -> str:
    try: return Path(path).read_text(errors="replace")[-n:]
    except OSError: return ""

def spawn_call(calls:list[tuple[Callable, dict]], # (module-level function, keyword arguments), one process each
               timeout:float=300.0, # seconds for all of them together
               quiet:bool=True, # send the processes' stdout/stderr to a log shown only on failure
              ) -> list:
    "Run each `fn(**kwargs)` in its own spawned process, concurrently; return their results in order."
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    logs = [tempfile.mkstemp(prefix=f"grpo_nb-spawn{i}-", suffix=".log")[1] if quiet else "" for i in range(len(calls))]
    procs = [ctx.Process(target=_spawn_child, args=(i, fn, kw, q, logs[i])) for i, (fn, kw) in enumerate(calls)]
    for p in procs: p.start()
    results, deadline = {}, time.monotonic() + timeout
    def fail(i, what):
        name = calls[i][0].__name__
        raise RuntimeError(f"spawn_call: call {i} ({name}) {what}" + (f"\n--- its output, last lines ---\n{_tail(logs[i])}" if logs[i] else ""))
    try:
        while len(results) < len(procs):
            try: i, ok, value = q.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline: fail(min(set(range(len(procs))) - set(results)), f"gave no result within {timeout:.0f} s; raise timeout=")
                if dead := [k for k, p in enumerate(procs) if p.exitcode not in (None, 0) and k not in results]:
                    fail(dead[0], f"died with exit code {procs[dead[0]].exitcode}")
                continue
            if not ok: fail(i, f"failed:\n{value}")
            results[i] = value
    finally:
        for p in procs:
            p.join(timeout=15)
            if p.is_alive(): p.kill(); p.join()
        q.close()
        for log in filter(None, logs): Path(log).unlink(missing_ok=True)
    return [results[i] for i in range(len(procs))]

# %% [markdown]
# A failure in the child comes back as an error that carries the child's traceback and output:

# %%
err = None
try: lib.spawn_call([(lib.load_builtin, dict(name="builtin:nope"))], timeout=60)
except RuntimeError as e: err = str(e)
print(err.splitlines()[0], "...", next(l for l in err.splitlines() if l.startswith("KeyError"))); assert "no built-in dataset 'builtin:nope'" in err

# %% [markdown]
# ### A vLLM engine
#
# `vllm_generate` starts a real vLLM engine on the CPU: float32 (the CPU build's reliable dtype), eager
# mode (no graphs to capture), the V1 engine *in this process* (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set only
# while the engine exists), and an explicit KV-cache size. That last one matters on a shared machine: on
# CPU, `gpu_memory_utilization` is a fraction of *system* memory that must be free at start, so a busy
# machine refuses the default; `kv_cache_memory_bytes` skips that check and the profiling run. It returns
# the sampled token ids and, through `logprobs=0`, the log-prob of each sampled token, the quantity GRPO's
# importance ratio needs. Call it through `spawn_call`.

# %%
#| export
@contextlib.contextmanager
def _env(**kv):
    "Set environment variables for the block, restore them afterwards."
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update({k: str(v) for k, v in kv.items()})
    try: yield
    finally:
        for k, v in old.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v

def vllm_generate(model_dir:str|Path, # HF model directory (e.g. from `tiny_model_dir`)
                  prompts:list[str], # prompt texts (the tokenizer adds <bos>)
                  n:int=1, # samples per prompt (G)
                  max_tokens:int=8, # generation limit
                  temperature:float=1.0, # sampling temperature (0: greedy)
                  seed:int=0, # sampling seed
                  kv_cache_mib:int=64, # KV-cache size (tiny-arith needs 1 KiB a token)
                  log_level:str="ERROR", # vLLM's logging level in this process
                 ) -> list[dict]:
    "Sample with a real in-process vLLM engine; per prompt: prompt ids and `n` samples (token ids, log-probs, text)."
    with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_HOST_IP="127.0.0.1", VLLM_LOGGING_LEVEL=log_level):
        from vllm import LLM, SamplingParams
        llm = LLM(str(model_dir), dtype="float32", enforce_eager=True, seed=seed, max_num_seqs=max(8, n * len(prompts)),
                  kv_cache_memory_bytes=kv_cache_mib << 20, gpu_memory_utilization=0.05)
        try:
            outs = llm.generate(prompts, SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, seed=seed, logprobs=0),
                                use_tqdm=False)
            return [{"prompt": o.prompt, "prompt_ids": list(o.prompt_token_ids),
                     "samples": [{"token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason,
                                  "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]} for c in o.outputs]}
                    for o in outs]
        finally:
            del llm
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            cleanup_dist_env_and_memory()

# %% [markdown]
# ### A DeepSpeed ZeRO-3 step
#
# `zero3_step` is one rank of a ZeRO-3 job over gloo: it loads the policy, lets DeepSpeed partition it,
# runs forward and backward on its share of the batch (rows `rank::world_size`), steps the optimizer, then
# gathers the full parameters and hashes them. Equal hashes on every rank, different from the starting
# hash, mean the step ran and every rank holds the same new model. Two CPU-specific choices:
#
# - `"torch_adam": true`: DeepSpeed's fused and CPU Adam kernels JIT-compile for a minute or more;
#   torch's AdamW needs nothing.
# - DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce (`deepspeed_shm_comm`, 30-50 s)
#   when the communication backend starts. Gloo does the reductions fine without it, so the rank marks
#   that op incompatible first (DeepSpeed's own switch for "cannot build here").
#
# The loss is `grpo_loss_stub`: **a stub with the shape of a GRPO loss, not the GRPO objective**: each
# sequence's advantage times its completion tokens' log-probs (the on-policy ratio `exp(logp - logp.detach())`
# equals 1 with gradient ∇logp), token-mean over completion tokens. No clipping, no KL, no
# off-policy correction: those live in the learner's loss notebook.

# %%
#| export
def grpo_loss_stub(logits, # B, T, V next-token logits
                   input_ids, # B, T token ids
                   completion_mask, # B, T 1 on completion tokens
                   advantages, # B per-sequence advantages
                  ):
    "A GRPO-*shaped* stand-in loss for smoke tests and the fallback demo (not the GRPO objective): -mean(A · ratio) over completion tokens."
    import torch
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, 1:, None])[..., 0]  # B, T-1
    mask = completion_mask[:, 1:].float()                                                           # B, T-1
    ratio = torch.exp(logp - logp.detach())                                                         # B, T-1 (== 1)
    return -(advantages[:, None] * ratio * mask).sum() / mask.sum().clamp(min=1)

# %%
x = torch.tensor([[1, 5, 6, 7]]); lg = torch.randn(1, 4, 10, requires_grad=True)
test_close(grpo_loss_stub(lg, x, torch.tensor([[0, 0, 1, 1]]), torch.tensor([0.0])).item(), 0.0)
grpo_loss_stub(lg, x, torch.tensor([[0, 0, 1, 1]]), torch.tensor([1.0])).backward()
test_eq(lg.grad[0, 0].abs().sum().item(), 0.0)  # prompt positions get no gradient
assert lg.grad[0, 1:3].abs().sum() > 0

# %% [markdown]
# `pack_rows` turns prompts and completions into the padded tensors (as lists, so they cross process
# boundaries cheaply) that the step consumes.

# %%
#| export
def pack_rows(prompt_ids:list[list[int]], # B prompts, token ids
              completion_ids:list[list[int]], # B completions, token ids
              advantages:list[float], # B advantages
              pad_id:int=0, # padding token id
             ) -> dict:
    "Right-padded `input_ids`, `attention_mask`, `completion_mask` (B, T) and `advantages` (B), as lists."
    T = max(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))
    pad = lambda row: row + [pad_id] * (T - len(row))
    return {"input_ids": [pad(p + c) for p, c in zip(prompt_ids, completion_ids)],
            "attention_mask": [[1] * (len(p) + len(c)) + [0] * (T - len(p) - len(c)) for p, c in zip(prompt_ids, completion_ids)],
            "completion_mask": [[0] * len(p) + [1] * len(c) + [0] * (T - len(p) - len(c)) for p, c in zip(prompt_ids, completion_ids)],
            "advantages": list(map(float, advantages))}

# %%
test_eq(pack_rows([[1, 5], [1]], [[6, 2], [7]], [1, -1]),
        {"input_ids": [[1, 5, 6, 2], [1, 7, 0, 0]], "attention_mask": [[1, 1, 1, 1], [1, 1, 0, 0]],
         "completion_mask": [[0, 0, 1, 1], [0, 1, 0, 0]], "advantages": [1.0, -1.0]})

# %%
#| export
def free_port() -> int:
    "A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous)."
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def _param_digest(module) -> str:
    "SHA-256 of every parameter's fp32 bytes, in name order (call with the parameters gathered)."
    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        h.update(name.encode()); h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

def zero3_step(rank:int, # this process's rank
               world_size:int, # ranks in the job
               port:int, # rendezvous port on 127.0.0.1 (same for every rank)
               model_dir:str|Path, # HF model directory
               batch:dict, # from `pack_rows`; this rank takes rows rank::world_size
               lr:float=1e-3, # AdamW learning rate
               threads:int=1, # torch threads in this rank
              ) -> dict:
    "One rank of a real DeepSpeed ZeRO-3 step over gloo with `grpo_loss_stub`; returns loss and parameter hashes."
    import logging, warnings, torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")  # this process only
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")  # this process is the rank: its own environment
    import deepspeed
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # skip the 30-50 s JIT build of the shm all-reduce
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    with _no_progress_bars(): model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    before = _param_digest(model)
    rows = {k: torch.tensor(v[rank::world_size]) for k, v in batch.items()}
    config = {"train_micro_batch_size_per_gpu": len(rows["advantages"]), "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3}, "gradient_clipping": 1.0, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    logits = engine(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits  # B, T, V
    loss = grpo_loss_stub(logits, rows["input_ids"], rows["completion_mask"], rows["advantages"])
    engine.backward(loss); engine.step()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        after = _param_digest(engine.module)
    partitioned = sum(p.ds_tensor.numel() for p in engine.module.parameters())  # this rank's share
    total = sum(p.ds_numel for p in engine.module.parameters())
    torch.distributed.barrier(); torch.distributed.destroy_process_group()
    return {"rank": rank, "loss": loss.item(), "digest_before": before, "digest_after": after,
            "params_total": total, "params_on_rank": partitioned}

# %% [markdown]
# Both engines, each in its own process, at once: vLLM samples four completions for held-out problems from
# the warm-started policy while a one-rank ZeRO-3 step runs on the same weights. (A spawned process imports
# the function it runs by module name, so the example calls the exported `grpo_nb.tiny` versions, `lib.`.)

# %%
rows = load_builtin("arithmetic-eval", n=3)
batch = pack_rows([tok(r["prompt"]).input_ids for r in rows],
                  [tok(r["answer"], add_special_tokens=False).input_ids + [tok.eos_token_id] for r in rows], [1.0, -1.0, 0.5])
gen, step = lib.spawn_call([(lib.vllm_generate, dict(model_dir=warm_dir, prompts=[r["prompt"] for r in rows], n=4, max_tokens=6)),
                            (lib.zero3_step, dict(rank=0, world_size=1, port=free_port(), model_dir=warm_dir, batch=batch))])
for r, g in zip(rows, gen):
    print(f"{r['prompt']:<7} want {r['answer']:<3}", [(s["text"], round(sum(s["logprobs"]), 2)) for s in g["samples"]])
print(f"ZeRO-3 (1 rank): stub loss {step['loss']:+.4f}, parameters {step['digest_before']} -> {step['digest_after']}")
assert all(lp <= 0 for g in gen for s in g["samples"] for lp in s["logprobs"])
test_ne(step["digest_before"], step["digest_after"])

# %% [markdown]
# ## `grpo_nb demo` before the trainer exists
#
# Until the trainer notebook exists, `make demo` runs the most complete job available and says so: it
# builds the warm-started `tiny-arith`, samples `G` completions per problem with a real vLLM engine, scores
# them by exact match, normalises rewards within each group (GRPO's advantage), and takes one real
# DeepSpeed ZeRO-3 step with the stub loss. The helpers below are private to the demo for the same reason.

# %%
#| export
def _exact_match(sample:dict, answer:str) -> float:
    "1.0 when a `vllm_generate` sample is exactly the answer and then <eos>."
    return float(sample["finish_reason"] == "stop" and sample["text"] == answer)

def _group_advantages(rewards:list[float], G:int) -> list[float]:
    "(r - group mean) / (group std + 1e-6) within each consecutive group of G."
    out = []
    for i in range(0, len(rewards), G):
        g = rewards[i:i + G]; mu = sum(g) / len(g); sd = (sum((r - mu) ** 2 for r in g) / max(len(g) - 1, 1)) ** 0.5
        out += [(r - mu) / (sd + 1e-6) for r in g]
    return out

# %%
test_eq(_group_advantages([1, 0, 0, 1, 1, 1], 3)[3:], [0.0, 0.0, 0.0])  # equal rewards: no signal
test_close(sum(_group_advantages([1, 0, 0, 0], 4)), 0.0)

# %%
#| export
def demo_fallback_cli(argv:list[str]|None=None) -> int:
    "`grpo_nb demo` until the GRPO trainer exists: tiny policy -> vLLM samples -> rewards -> one ZeRO-3 step."
    p = argparse.ArgumentParser(prog="grpo_nb demo", description=demo_fallback_cli.__doc__)
    p.add_argument("--model", default="tiny-arith", choices=sorted(TINY_MODELS), help="built-in tiny policy")
    p.add_argument("--warm_steps", type=int, default=60, help="supervised warm-start steps before sampling (0: random init)")
    p.add_argument("--prompts", type=int, default=8, help="problems sampled from builtin:arithmetic")
    p.add_argument("-G", "--samples", type=int, default=8, help="completions per problem (G)")
    p.add_argument("--seed", type=int, default=0, help="data, init and sampling seed")
    args = p.parse_args(argv)
    if args.samples < 2: p.error("-G must be at least 2: advantages are normalised within a group")
    t0 = time.perf_counter(); say = lambda s: print(f"[{time.perf_counter() - t0:5.1f} s] {s}", flush=True)
    print("grpo_nb demo: the GRPO trainer is not built yet; this runs the most complete job available:\n"
          "  tiny Qwen2 policy -> real vLLM engine (CPU) -> exact-match rewards -> group advantages -> "
          "one real DeepSpeed ZeRO-3 step (a GRPO-shaped stub loss)\n", flush=True)
    model_dir = tiny_model_dir(args.model, seed=args.seed, warm_steps=args.warm_steps)
    say(f"policy {args.model} ({args.warm_steps} warm-start steps): {model_dir}")
    rows = load_builtin("arithmetic", n=args.prompts, seed=args.seed)
    gen, = spawn_call([(vllm_generate, dict(model_dir=model_dir, prompts=[r["prompt"] for r in rows], n=args.samples,
                                            max_tokens=6, temperature=1.0, seed=args.seed))])
    rewards = [_exact_match(s, r["answer"]) for r, g in zip(rows, gen) for s in g["samples"]]
    say(f"vLLM sampled {len(rewards)} completions ({args.prompts} problems × G={args.samples}); mean reward {sum(rewards)/len(rewards):.3f}")
    for r, g in list(zip(rows, gen))[:3]:
        print(f"         {r['prompt']:<7} want {r['answer']:<3} got {[s['text'] for s in g['samples']]}")
    adv = _group_advantages(rewards, args.samples)
    batch = pack_rows([g["prompt_ids"] for g in gen for _ in g["samples"]], [s["token_ids"] for g in gen for s in g["samples"]], adv)
    res, = spawn_call([(zero3_step, dict(rank=0, world_size=1, port=free_port(), model_dir=model_dir, batch=batch))])
    changed = res["digest_before"] != res["digest_after"]
    say(f"DeepSpeed ZeRO-3 step (1 rank, gloo): stub loss {res['loss']:+.4f}; {res['params_total']:,} parameters "
        + ("updated" if changed else "unchanged (every group had equal rewards, so every advantage was 0)"))
    print("\nThe GRPO trainer is not built yet; this ran the most complete job available. `grpo_nb demo` will run "
          "the real training loop once grpo_nb.trainer exists.")
    return 0

# %% [markdown]
# The demo, as `make demo` runs it (about half a minute, most of it importing vLLM and DeepSpeed in their
# processes):

# %%
#| slow
lib.demo_fallback_cli([])

# %% [markdown]
# In CI, the engines are exercised by `tests/test_engines_smoke.py`: a two-node Ray cluster with logical
# GPUs, a two-rank ZeRO-3 step whose ranks end with identical parameters, and a vLLM engine whose sampled
# log-probs match a transformers forward pass on the same weights.
