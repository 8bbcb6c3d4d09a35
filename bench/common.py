"""What the benchmark scripts share: the environment of every GPU process, a free port, step-time statistics, a poller of every GPU's memory in use, and a log of its clocks.

Run a script as `python bench/NAME.py`: its own directory is then on `sys.path`, and `from common import ...` finds this file.
"""
from __future__ import annotations
import math, os, re, signal, statistics, subprocess, sys, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))   # grpo_nb from this checkout
from grpo_nb.actors import GPU_SAFETY_ENV, free_port  # noqa: E402,F401  (one definition each, in the library; free_port is re-exported)

GPU_ENV:dict[str, str] = {**GPU_SAFETY_ENV, "PYTHONUNBUFFERED": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "TOKENIZERS_PARALLELISM": "false",
                          "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "DS_BUILD_OPS": "0"}
"The environment of every benchmark process: the library's GPU safety settings (NVLink multicast off, NCCL without cuMem), H100/H200 kernels only, no hub, Ray without tokens."

COLD_CACHES:dict[str, str] = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "GRPO_NB_CACHE": "grpo_nb"}
"""The caches a cold start gets fresh, each under its own subdirectory: the compile caches (vLLM's, with its model-info and
graph caches; Inductor's; Triton's) and this project's (the prompts' token ids, which a warm start reads instead of
importing a tokenizer)."""

_RAISED = re.compile(r"^(\[rank\d+\]: )?([\w.]+(Error|Exception)): (.+)$")

def first_error(log:str|Path|None) -> str|None:
    """The first exception a log's processes raised (`[rank1]: NotImplementedError: ...`), not the launcher's
    `ChildFailedError` that follows it: the line that says why a multi-process run stopped."""
    if not log or not Path(log).exists(): return None
    for line in Path(log).read_text(errors="replace").splitlines():
        m = _RAISED.match(line.strip())
        if m and "ChildFailedError" not in m.group(2): return line.strip()
    return None


def step_stats(xs:list[float]) -> dict:
    "Mean, median and p90 (nearest rank) of a list of step times; None each for an empty list."
    if not xs: return {"mean": None, "median": None, "p90": None}
    s = sorted(xs)
    return {"mean": statistics.fmean(s), "median": statistics.median(s), "p90": s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]}


def gpu_memory_mib() -> dict[int, int]:
    "Memory in use on every GPU (MiB, by `nvidia-smi` index); raises OSError / ValueError / TimeoutExpired where nvidia-smi cannot answer."
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
    return dict(tuple(int(x) for x in line.split(",")) for line in out.strip().splitlines())


class MemoryPoller:
    "Peak memory in use of every GPU (MiB, as `nvidia-smi` reports it), polled every `every` seconds in a thread."
    def __init__(self, every:float=0.5):
        self.every, self.peak, self._stop = every, {}, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
    def _run(self):
        while not self._stop.is_set():
            try:
                for i, used in gpu_memory_mib().items(): self.peak[i] = max(self.peak.get(i, 0), used)
            except (OSError, ValueError, subprocess.TimeoutExpired): pass
            self._stop.wait(self.every)
    def __enter__(self): self._t.start(); return self
    def __exit__(self, *a): self._stop.set(); self._t.join(5)


CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu")
"What `ClockLog` samples of each GPU besides the time and the index: SM and memory clocks (MHz), power (W), temperature (C), utilisation (%)."


def parse_clock_lines(text:str, # `nvidia-smi --query-gpu=timestamp,index,<CLOCK_FIELDS> --format=csv,noheader,nounits` output
                     ) -> list[dict]: # one dict a line: `t` (unix seconds), `gpu` (nvidia-smi index), each field (None where N/A)
    "Parse clock samples; a line that is not one (a warning, a line cut by the end of the process) is skipped."
    from datetime import datetime
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 2 + len(CLOCK_FIELDS): continue
        try: t, gpu = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp(), int(parts[1])
        except ValueError: continue
        num = lambda x: float(x) if x.replace(".", "", 1).isdigit() else None   # "[N/A]" and the like: None
        out.append({"t": t, "gpu": gpu, **{k: num(v) for k, v in zip(CLOCK_FIELDS, parts[2:])}})
    return out


class ClockLog:
    """Every visible GPU's clocks, power, temperature and utilisation through a `with` block, sampled every `every_ms` by
    one `nvidia-smi --loop-ms` process (so that a run's slow steps can be set beside its GPU's clocks). Without nvidia-smi
    the block runs as it would and `samples` stays empty."""
    def __init__(self, every_ms:int=500, # sampling period
                 gpus:str|None=None): # nvidia-smi indices, comma-separated (None: `CUDA_VISIBLE_DEVICES`, else every GPU)
        self.every_ms, self.samples, self.proc = every_ms, [], None
        self.gpus = gpus if gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES") or None
    def __enter__(self):
        import tempfile
        self._out = tempfile.TemporaryFile(mode="w+")
        cmd = ["nvidia-smi", f"--query-gpu=timestamp,index,{','.join(CLOCK_FIELDS)}", "--format=csv,noheader,nounits", f"--loop-ms={self.every_ms}"]
        if self.gpus and all(g.strip().isdigit() for g in self.gpus.split(",")): cmd.append(f"--id={self.gpus}")   # UUIDs and the like: every GPU
        try: self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError: self.proc = None   # no nvidia-smi here: nothing to sample
        return self
    def __exit__(self, *a):
        if self.proc is not None: stop_group(self.proc, 5)
        self._out.seek(0); self.samples = parse_clock_lines(self._out.read()); self._out.close()


def per_step(samples:list[dict], # `ClockLog.samples`
             ends:list[float], # each step's end (unix seconds)
             steps:list[float], # each step's length (s), in the same order
             key:str="clocks.sm", # the field to average
            ) -> list[float|None]: # per step, the mean of `key` over the samples inside it on every GPU sampled; None where none fell inside
    "The mean of one sampled field within each step's window [end - length, end]."
    out = []
    for end, length in zip(ends, steps):
        xs = [s[key] for s in samples if end - length <= s["t"] <= end and s.get(key) is not None]
        out.append(statistics.fmean(xs) if xs else None)
    return out


def end_group(pgid:int, # a process group (its leader's pid: started with `start_new_session=True`)
              grace:float=30, # seconds between SIGTERM and SIGKILL
              reap=lambda: None, # collects the leader where it is our own child (its `Popen.poll`), so it does not linger as a zombie
             ):
    "End every process of the group: SIGTERM, then SIGKILL after `grace` seconds, each time waiting until none is left."
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        reap()
        if not alive_group(pgid): return
        try: os.killpg(pgid, sig)
        except ProcessLookupError: return
        t = time.monotonic()
        while time.monotonic() - t < wait:
            reap()
            if not alive_group(pgid): return
            time.sleep(0.2)


def stop_group(proc:subprocess.Popen|None, grace:float=30):
    "End the process group of `proc` (started by a benchmark with `start_new_session=True`): SIGTERM, then SIGKILL after `grace` seconds."
    if proc is not None: end_group(proc.pid, grace, proc.poll)


def alive_group(pgid:int) -> bool:
    "Whether any process of the group `pgid` is still running."
    try: os.killpg(pgid, 0); return True
    except (ProcessLookupError, PermissionError): return False


def wait_gpus_free(limit_mib:int=2048, timeout:float=90, gpus:list[int]|None=None):
    "Wait until every GPU of `gpus` (`nvidia-smi` indices; None: all) has less than `limit_mib` in use (the peer's processes gone) before the next run starts."
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        try:
            used = gpu_memory_mib()
            if all(m < limit_mib for i, m in used.items() if gpus is None or i in gpus): return
        except (OSError, ValueError, subprocess.TimeoutExpired): return
        time.sleep(3)


PROMPT_SYMBOLS = "0123456789"
"What the benchmark prompts are written in: one token per character, whichever tokenizer class transformers loads."


NEWLINE = "\u010a"
"The byte-level BPE symbol of a newline (Qwen's vocabulary holds it as one token)."


def save_bench_tokenizer(vocab_size:int, out:Path) -> Path:
    """A tokenizer over every id of a random-init model, saved to `out`: `<pad>`, `<bos>`, `<eos>`, `<unk>` (ids 0-3), the digits
    (ids 4-13, one token each), `t<id>` for every other id but the last, and the byte-level newline `Ċ` as the last. transformers 5
    loads a Qwen2 directory's tokenizer as its own `Qwen2Tokenizer` (byte-level BPE over this vocabulary, no merges, digits split one
    by one, a newline one token as in Qwen's own vocabulary, which verl's rollout requires of a Qwen model) and other models' as the saved
    fast tokenizer (words, then digits one by one): both read a prompt of `n` digits as exactly `n` tokens, and both decode every id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3} | {d: 4 + i for i, d in enumerate(PROMPT_SYMBOLS)}
    vocab |= {f"t{i}": i for i in range(len(vocab), vocab_size - 1)} | {NEWLINE: vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)   # joins tokens with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(out)
    return out


def digit_prompts(n:int, length:int, seed:int=0) -> list[str]:
    "`n` random prompts of `length` digits: `length` tokens each under `save_bench_tokenizer`'s tokenizer."
    import random
    rng = random.Random(seed)
    return ["".join(rng.choice(PROMPT_SYMBOLS) for _ in range(length)) for _ in range(n)]
