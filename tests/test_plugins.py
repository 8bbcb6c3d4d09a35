"""A user's reward in a file outside the package, named in the config (`reward.plugins`), through `grpo_nb` as users run it:

- `grpo_nb config` refuses a plug-in path that does not exist, a reward name nothing registered and a plug-in that
  replaces a built-in, each naming the fix;
- `grpo_nb train` refuses, before Ray starts, a reward name nothing registered and a plug-in that replaces a built-in;
- `grpo_nb train` on CPU with the plug-in's reward: the driver and the Ray worker processes import the plug-in (each
  writes its pid on import), and the run logs the plug-in reward's metric. That training run is
  tests/test_trainer.py::test_sync_kill_then_one_step_off_sigusr1_then_checked_resume_continue_exactly, whose three runs
  score with `PLUGIN` below: a training run of its own here paid for a whole start-up (Ray, learner, engine) again.
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


LOADER = '''
import os
from pathlib import Path
from grpo_nb.run import register_loader

Path(os.environ.get("PLUGIN_MARKS", "."), f"loader-{os.getpid()}").touch()

@register_loader(".tsv")
def tsv_rows(path):   # prompt<TAB>answer a line
    return [dict(zip(("prompt", "answer"), l.split("\\t"))) for l in Path(path).read_text().splitlines() if l]

@register_loader("sums")
def sum_rows(path):   # sums:N -> N problems a+1=
    return [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(int(path.split(":", 1)[1]))]
'''


@pytest.fixture
def loader(plugin):
    (plugin / "my_loader.py").write_text(LOADER)
    (plugin / "d.tsv").write_text("1+1=\t2\n2+2=\t4\n")
    return plugin


def test_a_row_loader_plugin_reads_a_suffix_and_a_name_through_preflight(loader, monkeypatch):
    from grpo_nb.config import load_config
    from grpo_nb.preflight import check_data
    from grpo_nb.run import ROW_LOADERS, load_rows
    monkeypatch.chdir(loader); monkeypatch.setenv("PLUGIN_MARKS", str(loader / "marks"))
    try:
        cfg = load_config("demo", ["--data.plugins=[my_loader.py]", "--data.train_path=d.tsv", "--data.eval_path=sums:5"])
        status, detail = check_data(cfg)   # imports data.plugins, then reads both through load_rows
        assert status == "PASS" and "train 2 rows" in detail and "eval 5 rows" in detail, detail
        assert load_rows("sums:3")[2] == {"prompt": "2+1=", "answer": "3"}
        with pytest.raises(Exception, match="the row loader sum_rows of .*my_loader.py failed"): load_rows("sums:x")
    finally:
        for k in (".tsv", "sums"): ROW_LOADERS.pop(k, None)


def test_ddp_imports_data_and_reward_plugins(loader):
    "The torchrun trainer, one rank without a launcher: rows from a plug-in loader, the reward from a plug-in."
    out = loader / "ddp"
    env = {**os.environ, "PLUGIN_MARKS": str(loader / "marks"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([sys.executable, "-m", "grpo_nb.ddp", "ddp-tiny", f"--logging.output_dir={out}", "--total_steps=1", "--eval_every=0",
                        "--checkpoint.every_steps=0", "--logging.tensorboard=false", "--data.plugins=[my_loader.py]", "--data.train_path=sums:16",
                        "--reward.plugins=[my_rewards.py]", "--reward.functions={digits_match: 1.0}"],
                       cwd=loader, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l.strip()]
    assert [x["step"] for x in recs] == [1], recs   # scored by digits_match: a name only the plug-in registers
    marks = {p.name for p in (loader / "marks").iterdir()}
    assert any(m.startswith("loader-") for m in marks) and any(not m.startswith("loader-") for m in marks), marks
