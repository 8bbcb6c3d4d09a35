"""A plug-in reward through `grpo_nb sbatch`'s script under a real SLURM on this machine (tests/slurm_harness.py):
two emulated nodes, the Ray cluster the script starts, the real trainer (`grpo_nb train`) scoring with a reward
registered in a `.py` file outside the package, named by `reward.plugins` relative to the submission directory.
The job's start-up check finds the plug-in, the driver and the Ray workers import it (each writes its pid), and
the run logs the plug-in reward's metric."""
import json, os, shutil, sys
from pathlib import Path
import pytest
import yaml
from slurm_harness import LocalSlurm, ensure_installed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a private SLURM needs root (apt-get, munge, network namespace)"),
              pytest.mark.slow]  # the real trainer (Ray + vLLM + DeepSpeed) under SLURM: minutes on 2 cores, beyond CI's budget

PLUGIN = '''import os
from pathlib import Path
from grpo_nb.rewards import register

Path(os.environ["PLUGIN_MARKS"], f"{os.uname().nodename}-{os.getpid()}").touch()

@register("digits_match")
def digits_match(completions, answers, ctx):
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answers)]
'''


def test_a_plugin_reward_under_the_generated_sbatch_script():
    from grpo_nb.cli import main
    from grpo_nb.config import PRESETS
    ensure_installed()
    with LocalSlurm(nodes=2, gpus_per_node=4, cpus_per_node=2) as s:
        r = s.root / "plug"; (r / "logs").mkdir(parents=True); (r / "marks").mkdir()
        (r / "my_rewards.py").write_text(PLUGIN)
        cfg = json.loads(json.dumps(PRESETS["demo"]))
        cfg.update(total_steps=2, eval_every=0)
        cfg["cluster"].update(gpus_per_node=4, learners_per_node=[1])
        cfg["rollout"].update(prompts_per_step=4, num_samples_per_prompt=4)
        cfg["learner"].update(micro_batch_size=16)
        cfg["reward"] = {"plugins": ["my_rewards.py"], "functions": {"digits_match": 1.0}}
        cfg["logging"].update(output_dir=f"{r}/run", progress_bar=False)
        cfg["checkpoint"].update(dir=f"{r}/run/ckpt", every_steps=0)
        (r / "run.yaml").write_text(yaml.safe_dump(cfg))
        cwd = os.getcwd(); os.chdir(r)
        try: assert main(["sbatch", "run.yaml", "--nodes", "2", "-o", "plug.sbatch", "--log-dir", "logs", "--time", "00:10:00", "--venv", str(ROOT / ".venv")]) == 0
        finally: os.chdir(cwd)
        env = s.env(TRAIN_CMD=f"{sys.executable} -m grpo_nb.cli train", MAX_JOB_CHAINS=1, SBATCH_OUTPUT=f"{r}/logs/%x-%j.out",
                    RAY_TMPDIR_BASE=str(r), RAY_OBJECT_STORE_MEMORY=200_000_000, RAY_HEAD_POLL_S=1, RAY_WAIT_S=300, RAY_STOP_S=20,
                    SBATCH_SIGNAL="B:USR1@30", PLUGIN_MARKS=str(r / "marks"))
        job = s.sbatch("--time=10", str(r / "plug.sbatch"), str(r / "run.yaml"), env=env, cwd=str(r))   # the submission directory holds the plug-in
        info = s.wait_done([job], timeout=600, every=1)[0]
        log = next((r / "logs").glob(f"*-{job}.out")).read_text()
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, log[-8000:])
        recs = [json.loads(l) for l in (r / "run" / "metrics.jsonl").read_text().splitlines() if l.strip()]
        assert [x["step"] for x in recs if "reward/digits_match" in x] == [1, 2], recs
        assert len(list((r / "marks").iterdir())) >= 2, sorted(p.name for p in (r / "marks").iterdir())   # the driver and Ray workers
