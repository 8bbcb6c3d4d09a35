"""verl 0.9.1 as the second peer of bench/e2e_vs_trl.py: `python -m verl.trainer.main_ppo` (GRPO, FSDP actor, vLLM
rollout) on the same GPUs, the same random-init model, the same random prompts and the same toy reward as our run.

Modes (`--peers verl:<backend>` or `--runs verl:<backend>:<shape>` of bench/e2e_vs_trl.py):
  hybrid          1 GPU: verl's hybrid engine, actor and vLLM on one GPU, the engine asleep while the actor steps
                  (`trainer.v1.trainer_mode=sync`); beside our colocated layout and TRL's colocate mode
  hybrid-2gpu     2 GPUs: the same hybrid engine over both GPUs (FSDP over 2 ranks, one TP=1 vLLM replica per GPU);
                  beside our split layout, the same two GPUs doing the same work
  separate-async  2 GPUs: verl's split mode, `trainer.v1.trainer_mode=separate_async` with
                  `actor_rollout_ref.hybrid_engine=False`: the actor on GPU 0, a standalone vLLM replica on GPU 1,
                  weights sent over NCCL after every step, one batch generated ahead (`num_warmup_batches=1`,
                  `parameter_sync_step=1`), rollout log-probs used as the old policy's (`rollout_correction.bypass_mode`);
                  beside our split one-step-off layout
  one-step-off    2 GPUs: `python -m verl.experimental.one_step_off_policy.main_ppo` (verl's experimental one-step-off
                  trainer: actor on GPU 0, rollout on GPU 1, NCCL sync); beside our split one-step-off layout

Every mode runs GRPO (`algorithm.adv_estimator=grpo`, no KL in the loss or the reward), `data.train_batch_size` =
prompts a step, `actor_rollout_ref.rollout.n` = G, one optimizer step a training step (`ppo_mini_batch_size` = prompts),
token-budget micro-batches (`use_dynamic_bsz`), gradient checkpointing, learning rate 1e-6, bf16, vLLM with CUDA graphs
and verl's default `load_format=dummy` (the weights come from the actor's first sync). Attention is FlashAttention-2
with padding removed where `flash_attn` is importable (verl's default and best mode), else SDPA with padding.
Its data is a parquet file in verl's row format (data_source, prompt as chat messages, reward_model.ground_truth);
its reward a python file whose `compute_score` calls the bench's `toy_reward` (its source is copied in).

Each step's times come from verl's own metrics: `trainer.logger=[console,file]` prints
`step:N - key:value - ...` lines and, with `VERL_FILE_LOGGER_PATH`, writes one JSON line a step; both are parsed
(the JSON lines first). Record keys (as TRL's): step_s_all (`timing_s/step`), split_s (generation =
`timing_s/gen`, sync = `timing_s/update_weights` or `timing_s/sync_rollout_weights`, learner_and_rest = the rest of
the step), timing_s (the mean of every `timing_s/*` phase), peak_gib and peak_gib_per_gpu (`nvidia-smi` memory in use,
polled), version, command, wall_s, and on failure error (the tail of verl's log); a run cut by its time limit keeps
its steps and says so (stopped) when at least MIN_TIMED of them are timed.

What verl needs installed, beside torch 2.11, transformers, vLLM and Ray (pip names; install verl itself with
`pip install --no-deps verl==0.9.1`: its metadata asks for transformers<5.11 and, in its `vllm` extra, vllm==0.24.0
and transformers==5.9.0, which a plain install would put in place of the node's own):
    verl==0.9.1 hydra-core omegaconf codetiming tensordict==0.10.0 "TransferQueue>=0.1.10" orjson prometheus_client
    torchdata peft accelerate msgspec cachetools fastapi uvicorn pyzmq psutil datasets pandas pyarrow
  (tensordict: verl allows <=0.10.0 and TransferQueue 0.1.11 needs >=0.10.0);
  and for the NCCL weight sync of separate-async and one-step-off: cupy-cuda13x (verl's `cupy-cu130` extra);
  for its best attention path: flash-attn 2.8.3 built for the node's torch and CUDA (verl's `flash-attn-cu130torch211`).
`orjson` (its file logger) and `TransferQueue` (the v1 trainer that `main_ppo` runs by default) are imported by verl
0.9.1 but not among its required dependencies. TRL must not be importable by verl: verl 0.9.1 (built against TRL 0.27)
patches TRL's `AutoModelForCausalLMWithValueHead` whenever TRL is installed, a class TRL 1.x no longer has, so where
TRL is installed (for the TRL peer) the run hides it from verl's processes with a `sitecustomize.py` at the head of
their PYTHONPATH (`HIDE_TRL`); the record says so (`preflight.trl_hidden`). The same file lets verl's split trainer
start: its set-up passes `flush=True` to a standard-library logger, a TypeError (`ACCEPT_FLUSH` drops the keyword).

vLLM: verl 0.9.1's code refuses vLLM below 0.18.0 (verl/third_party/vllm) and checks no upper bound; it carries
branches for vLLM >= 0.25. Its `vllm` extra pins vllm 0.24.0, so vLLM 0.26 is past what it was released against but
not refused by its code. Read against vLLM 0.26.0's source, every vLLM name its rollout imports on this bench's path
(bf16, no LoRA, no FP8) exists, and the engine calls it makes (AsyncLLM's sleep, wake_up, pause_generation,
reset_prefix_cache, collective_rpc; build_app and init_app_state, whose signatures it inspects) are there; the
names 0.26 lacks are imported under `try` or only on FP8, ModelOpt, QAT and delta-sync paths. Whether the rollout
runs is for the first GPU run to say. Each run checks up front that
verl and its imports are there and that vLLM is at least 0.18.0, and records the missing pieces as its error
instead of starting.
"""
from __future__ import annotations
import importlib.metadata, importlib.util, inspect, json, os, re, shlex, statistics, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MemoryPoller, stop_group, wait_gpus_free   # noqa: E402  (shared by the bench scripts)

VERL_VERSION = "0.9.1"
VLLM_FLOOR = "0.18.0"   # verl/third_party/vllm/__init__.py raises below this version (and checks no upper bound)
BACKENDS = {"hybrid": dict(gpus=1, trainer_gpus=1, rollout_gpus=0, module="verl.trainer.main_ppo", mode="sync"),
            "hybrid-2gpu": dict(gpus=2, trainer_gpus=2, rollout_gpus=0, module="verl.trainer.main_ppo", mode="sync"),
            "separate-async": dict(gpus=2, trainer_gpus=1, rollout_gpus=1, module="verl.trainer.main_ppo", mode="separate_async"),
            "one-step-off": dict(gpus=2, trainer_gpus=1, rollout_gpus=1, module="verl.experimental.one_step_off_policy.main_ppo", mode=None)}
"verl's modes: GPUs in all, the actor's, the standalone rollout's (0: the actor's GPUs also generate), the entry module, the v1 trainer mode."
PAIRS = [("colocated", "sync", "hybrid"), ("split", "sync", "hybrid-2gpu"), ("split", "one-step-off", "hybrid-2gpu"),
         ("split", "one-step-off", "separate-async"), ("split", "one-step-off", "one-step-off")]
"Our (layout, mode) beside each verl mode on the same GPUs."
MODULES = {"verl": "verl==0.9.1", "hydra": "hydra-core", "omegaconf": "omegaconf", "codetiming": "codetiming",
           "tensordict": "tensordict==0.10.0", "transfer_queue": "TransferQueue>=0.1.10", "orjson": "orjson", "prometheus_client": "prometheus_client",
           "torchdata": "torchdata", "peft": "peft", "accelerate": "accelerate", "msgspec": "msgspec", "cachetools": "cachetools",
           "fastapi": "fastapi", "uvicorn": "uvicorn", "zmq": "pyzmq", "psutil": "psutil", "datasets": "datasets",
           "pandas": "pandas", "pyarrow": "pyarrow", "ray": "ray", "vllm": "vllm"}
"The modules a verl 0.9.1 GRPO run imports, and the pip requirement that brings each."
SYNC_MODULES = {"cupy": "cupy-cuda13x"}
"Imported by verl's NCCL weight sync (separate-async, one-step-off)."


def verl_rows(prompts:list[str]) -> list[dict]:
    "verl's RL dataset rows for `prompts`: the prompt as one user message, a data source, and the (unused) ground truth."
    return [{"data_source": "grpo_nb_bench", "prompt": [{"role": "user", "content": p}], "ability": "bench",
             "reward_model": {"style": "rule", "ground_truth": "0"}, "extra_info": {"index": i}} for i, p in enumerate(prompts)]


def reward_source(reward) -> str:
    "A python file for verl's `reward.custom_reward_function`: `reward`'s own source and a `compute_score` that calls it on the decoded completion."
    return (f'"""The benchmark\'s toy reward, for verl: `compute_score` scores the decoded completion with `{reward.__name__}`."""\n\n\n'
            + inspect.getsource(reward) + "\n\n"
            + "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
            + f"    return float({reward.__name__}(solution_str))\n")


def verl_overrides(backend:str, shape:dict, model_dir:Path, data:Path, reward_file:Path, tmp:Path, flash_attn:bool=True) -> list[str]:
    "The hydra overrides of a verl GRPO run of `shape` in `backend`'s mode (see the module's docstring)."
    B, P = BACKENDS[backend], shape["prompts"]
    n = shape["warmup"] + shape["steps"]
    over = [f"data.train_files={data}", f"data.val_files={data}", f"data.train_batch_size={P}",
            f"data.max_prompt_length={shape['prompt_len'] + 8}", f"data.max_response_length={shape['gen']}", "data.shuffle=False",
            "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            f"actor_rollout_ref.model.use_remove_padding={flash_attn}",
            "actor_rollout_ref.actor.strategy=fsdp", f"actor_rollout_ref.actor.ppo_mini_batch_size={P}", "actor_rollout_ref.actor.ppo_epochs=1",
            "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
            "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.n={shape['G']}", "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            f"actor_rollout_ref.rollout.gpu_memory_utilization={0.85 if B['rollout_gpus'] else 0.3}",
            f"reward.custom_reward_function.path={reward_file}", "reward.custom_reward_function.name=compute_score",
            "trainer.nnodes=1", f"trainer.n_gpus_per_node={B['trainer_gpus']}", f"trainer.total_training_steps={n}", "trainer.total_epochs=1",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
            "trainer.logger=[console,file]", "trainer.project_name=grpo_nb_bench", f"trainer.experiment_name=verl_{backend}",
            f"trainer.default_local_dir={tmp / 'verl_ckpt'}"]
    if not flash_attn: over.append("+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
    if B["mode"]: over.append(f"trainer.v1.trainer_mode={B['mode']}")
    if B["rollout_gpus"]:
        over += ["actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                 "algorithm.rollout_correction.bypass_mode=True"]
    if B["mode"] == "separate_async":
        over += ["actor_rollout_ref.rollout.nnodes=1", f"actor_rollout_ref.rollout.n_gpus_per_node={B['rollout_gpus']}",
                 "trainer.v1.separate_async.parameter_sync_step=1", "trainer.v1.separate_async.num_warmup_batches=1"]
    if backend == "one-step-off":   # its config file finds verl's defaults by a path relative to the working directory; name the package instead
        over += ["rollout.nnodes=1", f"rollout.n_gpus_per_node={B['rollout_gpus']}", "hydra.searchpath=[pkg://verl.trainer.config]"]
    return over


HIDE_TRL = '''"""Started by every Python process of the benchmark's verl run (this directory leads PYTHONPATH): TRL is hidden from it.
verl 0.9.1 patches TRL's `AutoModelForCausalLMWithValueHead` whenever TRL is importable (verl.models.transformers.monkey_patch),
and TRL 1.x has no such class (nor `trl.experimental.ppo`), so with TRL installed beside it every actor stops at that import."""
import sys


class _HideTRL:
    def find_spec(self, name, path=None, target=None):
        if name == "trl" or name.startswith("trl."): raise ModuleNotFoundError(f"No module named {name!r} (hidden from verl)", name=name)
        return None


sys.meta_path.insert(0, _HideTRL())
'''
"The `sitecustomize.py` of a verl run where TRL is installed: it hides TRL from verl's processes (its Ray workers inherit PYTHONPATH)."

ACCEPT_FLUSH = '''
# verl 0.9.1's split trainer (trainer_separate_async.py, `_setup` with hybrid_engine=False) calls `logger.info(..., flush=True)`,
# a keyword the standard library's Logger refuses (TypeError), so the run stops before its first step. The keyword is dropped.
import logging

_log = logging.Logger._log
def _log_without_flush(self, *args, flush=None, **kwargs): return _log(self, *args, **kwargs)
logging.Logger._log = _log_without_flush
'''
"Added to the `sitecustomize.py` of verl's separate-async runs: its Logger call with `flush=True` no longer stops the run."


def verl_plan(backend:str, shape:dict, model_dir:Path, tmp:Path, prompts:list[str], reward, visible:str="0,1", flash_attn:bool=True,
              hide_trl:bool=False, pythonpath:str="") -> dict:
    "Everything a verl run needs, built without running anything: its command, environment, log and metrics paths, and its files' contents."
    B = BACKENDS[backend]
    data, reward_file = tmp / "verl_prompts.parquet", tmp / "verl_reward.py"
    metrics, log = tmp / "verl_metrics.jsonl", tmp / "verl.log"
    gpus = ",".join(visible.split(",")[:B["gpus"]])
    env = {"CUDA_VISIBLE_DEVICES": gpus, "VERL_FILE_LOGGER_PATH": str(metrics),
           "RAY_ADDRESS": "local"}   # verl starts its own Ray instance, never joining another cluster of this host (its ray.init() would)
    files = {data: verl_rows(prompts), reward_file: reward_source(reward)}
    site = (HIDE_TRL if hide_trl else "") + (ACCEPT_FLUSH if B["mode"] == "separate_async" else "")
    if site:
        files[tmp / "verl_site" / "sitecustomize.py"] = site
        env["PYTHONPATH"] = os.pathsep.join([str(tmp / "verl_site")] + ([pythonpath] if pythonpath else []))
    return {"backend": backend, "cmd": [sys.executable, "-m", B["module"], *verl_overrides(backend, shape, model_dir, data, reward_file, tmp, flash_attn)],
            "env": env, "log": log, "metrics": metrics, "files": files, "steps": shape["warmup"] + shape["steps"]}


def shown(plan:dict) -> str:
    "A verl run's command as one shell line, its environment in front."
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in plan["env"].items()) + " " + shlex.join(plan["cmd"])


def write_files(plan:dict):
    "Write the run's parquet data (with pyarrow, as verl reads it) and its reward file."
    import pyarrow as pa, pyarrow.parquet as pq
    for path, content in plan["files"].items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str): Path(path).write_text(content)
        else: pq.write_table(pa.Table.from_pylist(content), path)


_NUM = re.compile(r"^(?:np\.\w+\((.*)\)|tensor\((.*?)(?:,.*)?\))$")


def _number(text:str) -> float|None:
    "A value as verl's console logger prints it (`1.5`, `np.float64(1.5)`, `tensor(1.5)`, `nan`), or None."
    text = text.strip()
    m = _NUM.match(text)
    if m: text = m.group(1) if m.group(1) is not None else m.group(2)
    try: return float(text)
    except ValueError: return None


def parse_console(text:str) -> list[dict]:
    "Each training step's metrics from verl's console log: lines `step:N - key:value - ...` (after any Ray prefix such as `(TaskRunnerV1 pid=1)`), one dict a step, last seen wins."
    steps = {}
    for line in text.splitlines():
        i = line.find("step:")
        if i < 0 or not re.match(r"step:\d+( - |$)", line[i:]): continue
        parts = line[i:].strip().split(" - ")
        rec = {}
        for p in parts[1:]:
            k, sep, v = p.partition(":")
            if sep and (x := _number(v)) is not None: rec[k.strip()] = x
        if "timing_s/step" in rec: steps[int(parts[0][5:])] = rec
    return [steps[k] for k in sorted(steps)]


def parse_jsonl(text:str) -> list[dict]:
    "Each training step's metrics from verl's file logger (`{\"step\": N, \"data\": {...}}` a line); lines without a step time (validation) are skipped."
    steps = {}
    for line in text.splitlines():
        try: r = json.loads(line)
        except json.JSONDecodeError: continue   # a line cut by the time limit
        d = r.get("data") or {}
        if isinstance(d, dict) and "timing_s/step" in d: steps[int(r["step"])] = {k: v for k, v in d.items() if isinstance(v, (int, float))}
    return [steps[k] for k in sorted(steps)]


def verl_split(timed:list[dict]) -> dict:
    "Mean seconds per phase of verl's timed steps, as TRL's are split: generation (`gen`: generating, or waiting for the rollout), weight sync, and the rest."
    mean = lambda k: statistics.fmean(s.get(k, 0.0) for s in timed)
    split = {"generation": mean("timing_s/gen"), "sync": mean("timing_s/update_weights") + mean("timing_s/sync_rollout_weights")}
    split["learner_and_rest"] = mean("timing_s/step") - split["generation"] - split["sync"]
    return split


def verl_fields(steps:list[dict], warmup:int, n:int, min_timed:int, peak_mib:dict, plan:dict, rc, wall:float, log_tail:str) -> dict:
    "A verl run's record keys from its parsed steps: every step's time, the split and phases over the timed ones, peak memory, the command, and an error or a note when it did not complete."
    timed = steps[warmup:]
    keys = sorted({k for s in timed for k in s if k.startswith("timing_s/")})
    gpus = [int(g) for g in plan["env"]["CUDA_VISIBLE_DEVICES"].split(",") if g.strip().isdigit()]
    per_gpu = [peak_mib[i] / 1024 for i in gpus if i in peak_mib]
    out = {"step_s_all": [s["timing_s/step"] for s in steps], "split_s": verl_split(timed) if timed else None,
           "timing_s": {k.removeprefix("timing_s/"): statistics.fmean(s.get(k, 0.0) for s in timed) for k in keys},
           "peak_gib": max(per_gpu, default=None), "peak_gib_per_gpu": per_gpu, "wall_s": wall, "rc": rc, "command": shown(plan)}
    if rc == 0 and len(steps) >= n: return out
    if rc == "timeout" and len(timed) >= min_timed:
        return out | {"stopped": f"stopped by the benchmark's time limit after {len(steps)} of {n} steps ({wall:.0f} s, start-up included)"}
    return out | {"error": f"verl exited {rc} after {len(steps)} of {n} steps ({[round(s['timing_s/step'], 2) for s in steps]}) in {wall:.0f} s:\n{log_tail}"}


def vllm_problem(version:str|None) -> str|None:
    "Why verl 0.9.1 would refuse this vLLM (not installed, or below the floor its own code checks), or None."
    from packaging.version import Version
    if version is None: return "vLLM is not installed; verl's vLLM rollout needs it (verl 0.9.1 accepts vLLM >= 0.18.0)"
    if Version(version) < Version(VLLM_FLOOR):
        return f"vLLM {version} is older than {VLLM_FLOOR}, the oldest verl 0.9.1 accepts (verl/third_party/vllm refuses it): install vLLM >= {VLLM_FLOOR}"
    return None


def preflight(backend:str) -> tuple[str|None, dict]:
    "Before starting: verl's version and the packages it would import, and vLLM against verl's floor. Returns (error or None, notes for the record)."
    def version(dist):
        try: return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError: return None
    need = MODULES | (SYNC_MODULES if BACKENDS[backend]["rollout_gpus"] else {})
    missing = [pip for mod, pip in need.items() if importlib.util.find_spec(mod) is None]
    notes = {"verl_version": version("verl"), "vllm_version": version("vllm"), "transformers_version": version("transformers"),
             "flash_attn": importlib.util.find_spec("flash_attn") is not None, "trl_hidden": importlib.util.find_spec("trl") is not None,
             "requirements_unmet": unmet_requirements()}
    problems = []
    if missing: problems.append("verl's run would import packages that are not installed: pip install " + " ".join(shlex.quote(m) for m in missing)
                                + (" (verl itself with --no-deps, so that it keeps the installed transformers and vLLM)" if "verl==0.9.1" in missing else ""))
    if notes["verl_version"] not in (None, VERL_VERSION): problems.append(f"verl {notes['verl_version']} is installed; this bench drives verl {VERL_VERSION}")
    if (p := vllm_problem(notes["vllm_version"])): problems.append(p)
    return ("; ".join(problems) or None), notes


def unmet_requirements() -> list[str]:
    "verl's declared requirements (its core ones and its `vllm` extra) that the installed packages do not meet, e.g. `transformers<5.11,... (installed 5.17.0)`."
    from packaging.requirements import Requirement
    try: reqs = importlib.metadata.requires("verl") or []
    except importlib.metadata.PackageNotFoundError: return []
    out = []
    for text in reqs:
        r = Requirement(text)
        if r.marker is not None and not any(r.marker.evaluate({"extra": e}) for e in ("", "vllm")): continue
        try: have = importlib.metadata.version(r.name)
        except importlib.metadata.PackageNotFoundError: continue   # missing ones are the preflight's error, where the run imports them
        if r.specifier and not r.specifier.contains(have, prereleases=True): out.append(f"{r.name}{r.specifier} (installed {have})")
    return sorted(set(out))


def run_verl(backend:str, shape:dict, model_dir:Path, tmp:Path, prompts:list[str], reward, timeout:float, min_timed:int, env:dict) -> dict:
    "One verl run in its own process group under `timeout`; never raises for the run's own failure (the record's `error` says why, with the tail of verl's log)."
    err, notes = preflight(backend)
    rec = {"version": notes["verl_version"], "preflight": notes}
    if err: return rec | {"error": f"not started: {err}", "step_s_all": []}
    visible = env.get("CUDA_VISIBLE_DEVICES") or "0,1"
    if len(visible.split(",")) < BACKENDS[backend]["gpus"]:
        return rec | {"error": f"not started: verl {backend} needs {BACKENDS[backend]['gpus']} GPUs and CUDA_VISIBLE_DEVICES={visible} names fewer", "step_s_all": []}
    plan = verl_plan(backend, shape, model_dir, tmp, prompts, reward, visible, notes["flash_attn"], notes["trl_hidden"], env.get("PYTHONPATH", ""))
    write_files(plan)
    deadline, gpus = time.monotonic() + timeout, [int(g) for g in plan["env"]["CUDA_VISIBLE_DEVICES"].split(",") if g.strip().isdigit()]
    wait_gpus_free(gpus=gpus or None, timeout=min(90, timeout / 4))   # this run's GPUs only: another lane may hold the others
    t0 = time.perf_counter()
    with open(plan["log"], "w") as f, MemoryPoller() as mem:
        proc = subprocess.Popen(plan["cmd"], cwd=tmp, env={**env, **plan["env"]}, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try: rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired: rc = "timeout"
        finally: stop_group(proc, 10)   # its record must be written before the parent's limit (40 s after this one)
    wall = time.perf_counter() - t0
    steps = parse_jsonl(plan["metrics"].read_text()) if plan["metrics"].exists() else []
    if not steps and plan["log"].exists(): steps = parse_console(plan["log"].read_text(errors="replace"))
    tail = "\n".join(l for l in plan["log"].read_text(errors="replace").splitlines() if "Warning" not in l)[-3000:]
    wait_gpus_free(gpus=gpus or None, timeout=10)
    return rec | verl_fields(steps, shape["warmup"], plan["steps"], min_timed, mem.peak, plan, rc, wall, tail)


def dry_run_text(plan:dict) -> str:
    "What `--dry-run` prints for a verl run: its command with its environment, then each file it would write (the parquet rows as JSON, the first two and the count)."
    out = [f"verl {plan['backend']}: {shown(plan)}",
           "(where flash_attn is not importable: actor_rollout_ref.model.use_remove_padding=False "
           "+actor_rollout_ref.model.override_config.attn_implementation=sdpa; the sitecustomize.py and its PYTHONPATH entry only where TRL is importable or the mode is separate-async)"]
    for path, content in plan["files"].items():
        if isinstance(content, str): out.append(f"--- {path}\n{content.rstrip()}")
        else: out.append(f"--- {path} ({len(content)} rows, parquet; the first two as JSON)\n" + "\n".join(json.dumps(r) for r in content[:2]))
    return "\n".join(out)
