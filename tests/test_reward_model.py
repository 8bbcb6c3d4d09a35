"""Reward model: a real 2-rank DeepSpeed ZeRO-3 run over gloo, checkpoint + resume, SIGUSR1 + exact resume, export, reward adapter, launch script."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_BUILD_OPS": "0", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}

def _cmd(out:Path, steps:int, port:int, *extra:str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
            "-m", "grpo_nb.reward_model", "tiny", f"--output_dir={out}", f"--train.steps={steps}", "--train.eval_every=0",
            "--train.eval_pairs=48", *extra]

def _torchrun(out:Path, steps:int, port:int, *extra:str) -> dict:
    "Run the CLI under torchrun with 2 CPU ranks; return rank 0's summary."
    p = subprocess.run(_cmd(out, steps, port, *extra), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())

def test_two_ranks_train_checkpoint_resume_and_export(tmp_path):
    from grpo_nb.actors import free_port
    out = tmp_path / "run"
    first = _torchrun(out, 8, free_port())
    assert first["world"] == 2 and first["zero_stage"] == 3 and first["start_step"] == 0
    assert first["params_total"] // 2 <= first["params_on_rank"] < first["params_total"]   # ZeRO-3: each rank holds half
    assert first["effective_batch"] == 2 * 8 * 1
    evals = [m for m in first["metrics"] if "eval_accuracy" in m]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 8
    assert evals[-1]["eval_accuracy"] > 0.6 > evals[0]["eval_accuracy"], evals     # learning signal on held-out pairs
    assert (out / "checkpoints" / "latest").read_text().split()[-1] == "8"

    from grpo_nb.reward_model import reward_model_reward, load_pairs, split_pairs, HH_TINY
    from grpo_nb.rewards import REWARDS, compute_rewards
    reward_model_reward(out / "model", name="rm_test", text_of=lambda c, a: a + c)
    assert "rm_test" in REWARDS
    _, held = split_pairs(load_pairs(ROOT / HH_TINY))
    refusals = [r for r in held if r["kind"] == "refusal"][:8]
    heads = [r["chosen"].rsplit(" ", 1)[0] for r in refusals]
    good = compute_rewards([" " + r["chosen"].rsplit(" ", 1)[1] for r in refusals], heads, {"rm_test": 1.0}).total
    bad = compute_rewards([r["rejected"][len(h):] for r, h in zip(refusals, heads)], heads, {"rm_test": 1.0}).total
    assert sum(g > b for g, b in zip(good, bad)) >= 6, (good, bad)
    REWARDS.pop("rm_test")

    # The walltime signal mid-run: every rank checkpoints after its current step, exit 0; the resumed run continues exactly
    sig = tmp_path / "sig"
    p = subprocess.Popen(_cmd(sig, 1000, free_port(), "--train.save_every=0"), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while not ((sig / "metrics.jsonl").exists() and len((sig / "metrics.jsonl").read_text().splitlines()) >= 2):
            assert p.poll() is None and time.time() < deadline, "the run ended or stalled before its first step"
            time.sleep(0.2)
        assert subprocess.run(["pkill", "-USR1", "-P", str(p.pid)]).returncode == 0   # the workers, as the batch script's trap does
        log = p.communicate(timeout=120)[0]
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, log[-3000:]
    stopped = json.loads((sig / "summary.json").read_text())
    k = stopped["last_step"]
    assert stopped["stopped_by"] == "SIGUSR1" and 1 <= k < 1000 and stopped["model_dir"] is None
    assert (sig / "checkpoints" / "latest").read_text().split()[-1] == str(k)
    resumed = _torchrun(sig, k + 2, free_port())                                        # resume=auto picks up step k
    assert resumed["start_step"] == k and resumed["model_dir"] and (sig / "checkpoints" / "latest").read_text().split()[-1] == str(k + 2)
    assert resumed["start_step"] == k and [m["step"] for m in resumed["metrics"]] == [k + 1, k + 2]
    lines = [json.loads(l) for l in (sig / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(0, k + 3))   # every step once, in order
    ref = {m["step"]: m for m in first["metrics"]}
    assert k + 1 in ref, f"stopped at step {k}: too late to compare the resumed steps with the reference"
    for r in lines[1:]:   # the same losses as the reference run (steps 1-8 never interrupted)
        if r["step"] in ref: assert r["loss"] == ref[r["step"]]["loss"], (r, ref[r["step"]])

def test_cli_errors_and_plan(capsys):
    from grpo_nb.reward_model import reward_model_cli
    assert reward_model_cli(["tiny", "--train.micro_batch_pairs=0"]) == 2
    assert "--train.micro_batch_pairs=1" in capsys.readouterr().err
    assert reward_model_cli(["no-such-config.yaml"]) == 2
    assert reward_model_cli(["tiny", "--plan", "--gpus", "4", "--train.gradient_accumulation_steps=3"]) == 0
    assert "effective batch = 4 GPUs × 8 pairs × 3 accumulation = 96 pairs per step" in capsys.readouterr().out

def test_launch_script(tmp_path):
    from grpo_nb.reward_model import render_scripts
    (p,) = render_scripts(tmp_path)
    assert p.name == "reward_model.sbatch" and os.access(p, os.X_OK)
    r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = p.read_text()
    assert "torchrun" in text and "-m grpo_nb.reward_model" in text and "--train.resume=auto" in text
    # the walltime signal is trapped and passed on; a clean stop requeues the job, which resumes
    assert "#SBATCH --signal=B:USR1@" in text and "trap 'on_stop USR1' USR1" in text and "run_and_requeue srun" in text and "scontrol requeue" in text
    committed = ROOT / "sbatch" / "reward_model.sbatch"
    if committed.exists(): assert committed.read_text() == text, "sbatch/ is stale: run tools/render_scripts.py"

def test_classifier_memory_is_the_planner_minus_the_lm_head():
    from grpo_nb.memory import learner_memory, param_counts, GiB
    from grpo_nb.reward_model import classifier_memory, seed_table, effective_batch
    for model in ("Qwen2.5-0.5B", "Qwen2.5-7B"):
        c = classifier_memory(model, gpus=2, micro_batch_pairs=2, seq_len=1024)
        lm = learner_memory(model, learners=2, micro_batch=4, seq_len=1024)
        assert c["peak_bytes"] <= lm.peak_bytes
        assert c["terms"]["params_bytes"] <= lm.params_bytes
    rows = seed_table()
    assert [r["effective_batch"] for r in rows] == [effective_batch(r["gpus"], r["micro_batch_pairs"], r["accumulation"]) for r in rows]
    by = {(r["gpus"], r["micro_batch_pairs"]): r["peak_gib"] for r in rows}
    assert by[(16, 2)] < by[(8, 2)] < by[(4, 2)] and by[(8, 4)] > by[(8, 2)]   # more GPUs less, bigger micro-batch more
