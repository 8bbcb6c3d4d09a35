"""grpo_nb.ddp for real: `torchrun --nproc_per_node=2` on CPU over gloo with the tiny policy.

A reference run of STEPS steps; a second run in which the last rank dies at step 3 (after the step-2
checkpoint) and is resumed with `--resume auto`: the resumed run must continue at step 3, neither
repeating nor skipping a step. That resumed run then gets SIGUSR1 on its workers (what sbatch/ddp.sbatch does
before the walltime): it checkpoints at the next step and exits 0, and the run resumed once more ends bit-identical
to the reference on both ranks. (The crash and the signal were two tests with four torchrun launches; one chain of
three makes both tests' checks.) Plus a bad override (exit 2 with the fix) and the exported sbatch script
(`bash -n`). ZeRO-1 through a crash is a slow test.
"""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8   # long enough that the reference run also covers the steps after a signal that lands a few steps after step 3
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def _cmd(out:Path, *extra:str, nproc:int=2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "grpo_nb.ddp", "ddp-tiny",
            f"--logging.output_dir={out}", f"--total_steps={STEPS}", "--checkpoint.every_steps=2", "--logging.tensorboard=false", *extra]


def torchrun(out:Path, *extra:str, nproc:int=2, timeout:int=300) -> subprocess.CompletedProcess:
    "Run the ddp-tiny preset under torchrun (2 CPU ranks, gloo) writing into `out` (later options override earlier ones)."
    return subprocess.run(_cmd(out, *extra, nproc=nproc), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def records(out:Path) -> list[dict]:
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def _last_step(out:Path) -> int:
    "The highest step metrics.jsonl has logged so far, read while the run writes it (0: none yet; a line being written is skipped)."
    try: lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError: return 0
    steps = []
    for l in lines:
        try: steps.append(json.loads(l)["step"])
        except (ValueError, KeyError): pass
    return max(steps, default=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp-ref")
    r = torchrun(out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_two_ranks_train_in_step(reference):
    recs, summary = records(reference), json.loads((reference / "summary.json").read_text())
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(r["world_size"] == 2 and r["sequences"] == 2 * 4 * 4 for r in recs)  # per-rank scaling: 2 ranks × 4 prompts × G 4
    assert summary["weights_identical"] and len(summary["weights_sha256"]) == 2
    assert json.loads((reference / "batch_plan.json").read_text())["effective_batch"] == 8 * 2 * 2
    assert any(r["grad_norm"] > 0 for r in recs), "no step had a learning signal: the test would not see a wrong resume"
    evals = [r for r in recs if "eval/pass@1" in r]
    assert [r["step"] for r in evals] == list(range(2, STEPS + 1, 2)) and all(r["eval/problems"] == 8 for r in evals)   # every eval_every = 2 steps
    assert (reference / "checkpoints" / "latest").read_text().split()[-1] == str(STEPS)


def test_kill_resume_then_sigusr1_resume_continue_exactly(reference, tmp_path):
    """The last rank dies at step 3: the job fails, naming the simulated failure, with steps 1-2 logged and the step-2
    checkpoint `latest`. `--resume auto` continues at step 3 ("resumed from ... step 2"). That resumed run then gets what
    ddp.sbatch's trap sends before the walltime, SIGUSR1 to the workers: all ranks checkpoint at the next step k and exit 0
    (summary stopped, weights identical, steps 1..k once each, `latest` k). Resumed once more, the run logs every step
    once, and every step from 3 on (after the crash and after the signal) has the reference run's position, reward,
    tokens, loss and gradient norm, and both ranks end with its weights, bit for bit. The reference run is one that never
    stopped when it has at least two steps after k (k <= STEPS - 2: its evaluations leave every generator as it was and its
    checkpoints change nothing); a later signal gets an uninterrupted run of k + 2 steps of its own."""
    import signal, time
    out = tmp_path / "run"
    crashed = torchrun(out, "--ddp.fail_at_step=3")
    assert crashed.returncode != 0, "the simulated rank failure did not fail the job"
    assert "simulated failure at step 3" in crashed.stdout + crashed.stderr
    assert [r["step"] for r in records(out)] == [1, 2]
    assert (out / "checkpoints" / "latest").read_text().split()[-1] == "2"

    # resumed, and signalled as soon as its first step (3) is logged; total_steps only keeps it running until the signal
    p = subprocess.Popen(_cmd(out, "--resume", "auto", "--total_steps=1000"), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 240
        while _last_step(out) < 3:
            assert p.poll() is None and time.time() < deadline, "the resumed run ended or stalled before its first step"
            time.sleep(0.02)   # a step takes about 0.2 s here: signalled at once, the run stops a step or two later
        assert subprocess.run(["pkill", "-USR1", "-P", str(p.pid)]).returncode == 0  # the workers (torchrun's children), as the trap does
        log = p.communicate(timeout=120)[0]
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, log[-3000:]
    assert "resumed from" in log and "step 2" in log
    summary, steps = json.loads((out / "summary.json").read_text()), [r["step"] for r in records(out)]
    assert summary["stopped"] and summary["weights_identical"] and steps == list(range(1, summary["step"] + 1))
    assert (out / "checkpoints" / "latest").read_text().split()[-1] == str(summary["step"]) and summary["step"] < 1000
    k = summary["step"]   # where the signal landed depends on the machine's load

    n, ref_out = (STEPS, reference) if k <= STEPS - 2 else (k + 2, tmp_path / "uninterrupted")
    resumed = torchrun(out, "--resume", "auto", f"--total_steps={n}")   # the constant learning rate does not depend on total_steps
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    if ref_out != reference:
        ref_run = torchrun(ref_out, "--eval_every=0", f"--total_steps={n}")
        assert ref_run.returncode == 0, ref_run.stdout[-3000:] + ref_run.stderr[-3000:]
    recs, ref = records(out), records(ref_out)
    assert [r["step"] for r in recs] == list(range(1, n + 1))   # nothing repeated, nothing skipped
    for a, b in zip(recs[2:], ref[2:]):   # steps 3..n: the same prompts, samples and losses as the run that never stopped
        for key in ("position", "reward_mean", "tokens", "loss", "grad_norm"): assert a[key] == b[key], (key, a[key], b[key])
    summary, ref_summary = json.loads((out / "summary.json").read_text()), json.loads((ref_out / "summary.json").read_text())
    assert summary["weights_identical"]
    assert summary["weights_sha256"] == ref_summary["weights_sha256"]  # bit-identical to the run that never stopped


def test_bad_override_fails_with_the_fix(monkeypatch, capsys):
    r = subprocess.run([sys.executable, "-m", "grpo_nb.ddp", "ddp-tiny", "--learner.clip_hgh=0.3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "learner.clip_hgh" in r.stderr and "did you mean 'clip_high'" in r.stderr
    from grpo_nb.ddp import main  # the batch check needs the world size: as rank 0 of 2, in this process (no group is started)
    monkeypatch.setenv("WORLD_SIZE", "2"); monkeypatch.setenv("RANK", "0")
    assert main(["ddp-tiny", "--ddp.batch_scaling=global", "--rollout.prompts_per_step=5", "--learner.micro_batch_size=4",
                 "--learner.gradient_accumulation_steps=1"]) == 2
    err = capsys.readouterr().err
    assert "do not split over 2 ranks" in err and "Fix: --rollout.prompts_per_step=" in err


def test_sbatch_script_parses(tmp_path):
    from grpo_nb.ddp import render_scripts
    paths = render_scripts(tmp_path)
    assert [p.name for p in paths] == ["ddp.sbatch"]
    text = paths[0].read_text()
    assert subprocess.run(["bash", "-n", str(paths[0])]).returncode == 0
    assert "torchrun" in text and "--nproc_per_node" in text and "--resume auto" in text and "scontrol requeue" in text
    committed = ROOT / "sbatch" / "ddp.sbatch"
    if committed.exists(): assert committed.read_text() == text, "sbatch/ddp.sbatch is stale: run tools/render_scripts.py"


@pytest.mark.slow
def test_zero1_matches_ddp_and_resumes(reference, tmp_path):
    "ZeRO-1 (optimizer state sharded by ZeroRedundancyOptimizer) gives the DDP run's weights, through a crash and a resume."
    out = tmp_path / "zero1"
    assert torchrun(out, "--learner.zero_stage=1", "--ddp.fail_at_step=3").returncode != 0
    resumed = torchrun(out, "--learner.zero_stage=1", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert [r["step"] for r in records(out)] == list(range(1, STEPS + 1))
    summary, ref_summary = json.loads((out / "summary.json").read_text()), json.loads((reference / "summary.json").read_text())
    assert summary["weights_identical"] and summary["weights_sha256"] == ref_summary["weights_sha256"]
