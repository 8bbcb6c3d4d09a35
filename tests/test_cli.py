"""The commands' parsers come from their functions' docments (issue 15): every keyword-only argument is a flag whose
help is its docment, argparse's usage errors exit 2 (never SystemExit), and a command that takes overrides reads its
positional arguments from the leading words only, so `--key value` keeps its value."""
import contextlib, importlib, inspect, io, json
import pytest
from fastcore.docments import docments
from grpo_nb.cli import COMMANDS, main

DOCUMENTED = {"config": "grpo_nb.config:config_command", "plan": "grpo_nb.memory:plan_command",
              "layout": "grpo_nb.placement:layout_command", "train": "grpo_nb.trainer:train_command",
              "demo": "grpo_nb.trainer:demo_command", "code-server": "grpo_nb.rewards:serve_command",
              "reward-model": "grpo_nb.reward_model:reward_model_command",
              "self-correction": "grpo_nb.self_correction:self_correction_command", "ddp": "grpo_nb.ddp:ddp_command"}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def command(name):
    mod, fn = DOCUMENTED[name].split(":")
    return getattr(importlib.import_module(mod), fn)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_help_is_the_docments(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")   # no wrapping (textwrap would break --gpu-mem-gib at a hyphen)
    assert name in COMMANDS
    func = command(name)
    rc, out, _ = run([name, "--help"])
    assert rc == 0
    text = " ".join(out.split())
    assert " ".join(func.__doc__.split()) in text
    for arg, doc in docments(func).items():
        assert doc, f"{DOCUMENTED[name]}: {arg} has no docment"
        if "{" not in doc: assert doc in text, (name, arg)   # ({presets}) and the like are filled in at run time
    sep = "_" if name == "demo" else "-"
    for arg, q in inspect.signature(func).parameters.items():
        if q.kind is q.KEYWORD_ONLY: assert "--" + arg.rstrip("_").replace("_", sep) in out, (name, arg)


@pytest.mark.parametrize("argv, says", [
    (["config", "--json=yes"], "ignored explicit argument"),
    (["plan", "--model", "Qwen2.5-7B", "--zero", "5"], "invalid choice: 5"),
    (["layout", "--nodes", "two"], "invalid int value"),
    (["train"], "the following arguments are required: config"),
    (["demo", "--start_below", "low"], "invalid float value"),
    (["code-server", "--isolation", "chroot"], "invalid choice"),
    (["reward-model", "tiny", "--gpus", "x"], "invalid int value"),
    (["self-correction", "--out"], "expected one argument"),
    (["ddp", "--resume"], "expected one argument"),
])
def test_usage_errors_exit_2(argv, says):
    rc, _, err = run(argv)
    assert rc == 2 and says in err and f"usage: " in err, err


def test_positionals_are_the_leading_words():
    rc, out, err = run(["config", "--rollout.mode", "sync", "--json"])   # the default config, not one named "sync"
    assert rc == 0 and json.loads(out)["config"]["rollout"]["mode"] == "sync", err
    rc, out, _ = run(["config", "demo", "--learner.zero_stage", "2", "--json"])
    assert rc == 0 and json.loads(out)["config"]["learner"]["zero_stage"] == 2
    rc, _, err = run(["self-correction", "--steps", "x"])
    assert rc == 2 and "Fix: --steps=<integer>" in err


def test_commands_are_callable_from_python(capsys):
    from grpo_nb.config import config_command
    from grpo_nb.memory import plan_command
    assert config_command("demo", "--rollout.num_samples_per_prompt=4", json_=True) == 0
    assert json.loads(capsys.readouterr().out)["derived"]["sequences_per_step"] == 128
    assert plan_command(model="Qwen2.5-7B", learner_gpus=8, json_=True) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["learners"] == 8
    assert plan_command("--learner.zero_stage=2", model="Qwen2.5-7B") == 2   # overrides need --config
    assert "overrides need --config" in capsys.readouterr().err
