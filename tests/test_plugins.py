"""A user's reward in a file outside the package, named in the config (`reward.plugins`), through `grpo_nb` as users run it:

- `grpo_nb config` refuses a plug-in path that does not exist, a reward name nothing registered and a plug-in that
  replaces a built-in, each naming the fix;
- `grpo_nb train` refuses, before Ray starts, a reward name nothing registered and a plug-in that replaces a built-in;
- `grpo_nb train` on CPU with the plug-in's reward: the driver and the Ray worker processes import the plug-in (each
  writes its pid on import), and the run logs the plug-in reward's metric.
"""
import json, os, shutil, subprocess, sys, tempfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = '''
import os
from pathlib import Path
from grpo_nb.rewards import register

Path(os.environ["PLUGIN_MARKS"], str(os.getpid())).touch()   # who imported me

@register("{name}")
def digits_match(completions, answers, ctx):
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answers)]
'''


def _grpo(tmp:Path, *args:str, timeout:float=600) -> subprocess.CompletedProcess:
    ray_tmp = tempfile.mkdtemp(prefix="rp", dir="/tmp")   # Ray's socket paths must stay under 107 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PLUGIN_MARKS": str(tmp / "marks"), "PYTHONUNBUFFERED": "1"}
    try: return subprocess.run([sys.executable, "-m", "grpo_nb.cli", *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    finally: shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "marks").mkdir()
    (tmp_path / "my_rewards.py").write_text(PLUGIN.format(name="digits_match"))
    (tmp_path / "clash.py").write_text(PLUGIN.format(name="math"))
    return tmp_path


def test_config_refuses_a_missing_plugin_a_missing_name_and_a_clash(plugin):
    r = _grpo(plugin, "config", "demo", "--reward.plugins=my_reward.py")
    assert r.returncode == 2 and "reward.plugins: no file 'my_reward.py'" in r.stderr and "my_rewards.py" in r.stderr, r.stderr
    r = _grpo(plugin, "config", "demo", "--reward.plugins=my_rewards.py", "--reward.functions={digit_match: 1.0}")
    assert r.returncode == 2 and "did you mean 'digits_match'" in r.stderr and "Fix:" in r.stderr, r.stderr
    r = _grpo(plugin, "config", "demo", "--reward.plugins=clash.py")
    assert r.returncode == 2 and "'math', a name already taken by grpo_nb.rewards" in r.stderr, r.stderr
    r = _grpo(plugin, "config", "demo", "--reward.plugins=my_rewards.py", "--reward.functions={digits_match: 1.0}", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["config"]["reward"]["plugins"] == ["my_rewards.py"], r.stderr


@pytest.mark.parametrize("args,says", [
    (["--reward.plugins=my_rewards.py", "--reward.functions={digit_match: 1.0}"], "did you mean 'digits_match'"),
    (["--reward.plugins=clash.py", "--reward.functions={math: 1.0}"], "a name already taken by grpo_nb.rewards"),
])
def test_train_refuses_missing_names_and_clashes_before_ray(plugin, args, says):
    r = _grpo(plugin, "train", "demo", f"--logging.output_dir={plugin / 'run'}", *args, timeout=120)
    assert r.returncode == 2 and says in r.stderr and "Fix:" in r.stderr, r.stderr[-2000:]


def test_train_with_a_plugin_reward_imports_it_on_the_driver_and_the_workers(plugin):
    pytest.importorskip("ray"); pytest.importorskip("deepspeed")
    out = plugin / "run"
    r = _grpo(plugin, "train", "demo", f"--logging.output_dir={out}", "--total_steps=2", "--eval_every=0", "--model.name_or_path=tiny-arith",
              "--rollout.prompts_per_step=4", "--rollout.num_samples_per_prompt=4", "--learner.micro_batch_size=16",
              "--rollout.backend=transformers",   # the engine is a Ray actor either way; this one starts in seconds
              "--checkpoint.every_steps=0", "--logging.progress_bar=false",
              "--reward.plugins=my_rewards.py", "--reward.functions={digits_match: 1.0}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    assert [x["step"] for x in recs if "reward/digits_match" in x] == [1, 2], recs
    pids = {p.name for p in (plugin / "marks").iterdir()}
    assert len(pids) >= 2, f"the plug-in was imported by {len(pids)} process(es); the driver and its Ray workers should all import it"
