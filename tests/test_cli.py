"""The commands' parsers come from their functions' docments: every keyword-only argument is a flag whose
help is its docment, argparse's usage errors exit 2 (never SystemExit), and a command that takes overrides reads its
positional arguments from the leading words only, so `--key value` keeps its value."""
import contextlib, importlib, inspect, io, json
import pytest
from fastcore.docments import docments
from grpo_nb.cli import COMMANDS, main

DOCUMENTED = {"config": "grpo_nb.cli:config_command", "plan": "grpo_nb.memory:plan_command",
              "layout": "grpo_nb.placement:layout_command", "train": "grpo_nb.trainer:train_command",
              "demo": "grpo_nb.trainer:demo_command", "code-server": "grpo_nb.rewards:serve_command",
              "reward-model": "grpo_nb.reward_model:reward_model_command",
              "self-correction": "grpo_nb.self_correction:self_correction_command", "ddp": "grpo_nb.ddp:ddp_command",
              "sbatch": "grpo_nb.slurm:sbatch_command", "preflight": "grpo_nb.preflight:preflight_command"}
# Commands the generated sbatch scripts run as `python -c 'from MODULE import X_cli; ...'` (not `grpo_nb` subcommands).
SCRIPT_COMMANDS = {"wait_ray": ("grpo_nb.slurm:wait_ray_cli", "grpo_nb.slurm:wait_ray_command"),
                   "job_env": ("grpo_nb.preflight:job_env_cli", "grpo_nb.preflight:job_env_command")}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def resolve(spec):
    mod, fn = spec.split(":")
    return getattr(importlib.import_module(mod), fn)


def command(name):
    return resolve(DOCUMENTED[name])


def run_script(name, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = resolve(SCRIPT_COMMANDS[name][0])(argv)
    return rc, out.getvalue(), err.getvalue()


def assert_help_is_the_docments(func, out, where, sep="-"):
    text = " ".join(out.split())
    assert " ".join(func.__doc__.split()) in text
    for arg, doc in docments(func).items():
        assert doc, f"{where}: {arg} has no docment"
        if "{" not in doc: assert doc in text, (where, arg)   # ({presets}) and the like are filled in at run time
    for arg, q in inspect.signature(func).parameters.items():
        if q.kind is q.KEYWORD_ONLY: assert "--" + arg.rstrip("_").replace("_", sep) in out, (where, arg)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_help_is_the_docments(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")   # no wrapping (textwrap would break --gpu-mem-gib at a hyphen)
    assert name in COMMANDS
    func = command(name)
    rc, out, _ = run([name, "--help"])
    assert rc == 0
    assert_help_is_the_docments(func, out, DOCUMENTED[name])   # one spelling: dashes in every command


@pytest.mark.parametrize("name", SCRIPT_COMMANDS)
def test_help_of_the_script_commands_is_the_docments(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    rc, out, _ = run_script(name, ["--help"])
    assert rc == 0
    assert_help_is_the_docments(resolve(SCRIPT_COMMANDS[name][1]), out, name)


def test_sbatch_options_are_documented_by_their_slurm_spec_fields(monkeypatch):
    "`grpo_nb sbatch`'s script options take their help from `SlurmSpec`'s docments (one source), and keep their flags."
    from grpo_nb.slurm import SlurmSpec
    monkeypatch.setenv("COLUMNS", "1000")
    rc, out, _ = run(["sbatch", "--help"])
    text, spec = " ".join(out.split()), docments(SlurmSpec)
    for arg, doc in docments(command("sbatch")).items():
        if "{" in doc:
            field = doc[doc.index("{") + 1:doc.index("}")]
            assert spec[field] and spec[field] in text, (arg, field)
    for flag in ["-o OUTPUT, --output OUTPUT", "--time TIME", "--no-exclusive", "--module MODULE", "--env ENV", "--sbatch SBATCH",
                 "--network {ethernet,infiniband,slingshot}", "--signal-s SIGNAL_S", "--log-dir LOG_DIR"]:
        assert flag in out, flag


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
    (["sbatch"], "the following arguments are required: config"),
    (["sbatch", "demo", "--nodes", "two"], "invalid int value"),
    (["sbatch", "demo", "--network", "myrinet"], "invalid choice"),
    (["preflight", "demo", "--nodes", "x"], "invalid int value"),
    (["preflight", "demo", "--log-dir"], "expected one argument"),
])
def test_usage_errors_exit_2(argv, says):
    rc, _, err = run(argv)
    assert rc == 2 and says in err and f"usage: " in err, err


@pytest.mark.parametrize("name, argv, says", [
    ("wait_ray", ["n1", "--address", "127.0.0.1:9", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("wait_ray", ["--address", "127.0.0.1:9"], "the following arguments are required: hosts"),
    ("wait_ray", ["n1"], "the following arguments are required: --address"),
    ("wait_ray", ["n1", "--address", "a:1", "--timeout", "soon"], "invalid float value"),
    ("job_env", [], "the following arguments are required: config"),
    ("job_env", ["--baked", "x", "demo"], "invalid int value"),
])
def test_script_usage_errors_exit_2(name, argv, says):
    rc, _, err = run_script(name, argv)
    assert rc == 2 and says in err and "usage: " in err, err


@pytest.mark.parametrize("argv", [["sbatch", "demo", "--no-such-flag=1"], ["preflight", "demo", "--no-such-flag=1"]])
def test_unknown_flags_of_override_commands_exit_2(argv, tmp_path, monkeypatch):
    "sbatch and preflight pass flags they do not know on as config overrides, and the config refuses an unknown field."
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(argv)
    assert rc == 2 and "no-such-flag" in out + err, (out, err)


def test_script_command_lines_keep_their_contract(tmp_path, monkeypatch):
    "The lines the sbatch scripts run (new and earlier versions) parse as before: `--baked N CONFIG ...`, `CONFIG ...`, `-o`, repeated flags."
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_script("job_env", ["--baked", "1", "demo", "--total_steps=3", "--seed", "4"])
    assert rc == 0 and "TOTAL_STEPS=3" in out, err
    rc, out, err = run_script("job_env", ["demo", "--total_steps", "5"])   # a script from before --baked
    assert rc == 0 and "TOTAL_STEPS=5" in out, err
    rc, _, err = run_script("job_env", ["--baked", "1", "demo", "--logging.output_dir=elsewhere"])
    assert rc == 2 and "refusing before Ray starts" in err, err
    rc, out, err = run(["sbatch", "-o", "site/a.sbatch", "demo", "--module", "cuda", "--module=nccl", "--env", "A=1", "--env", "B=2",
                        "--no-exclusive", "--time", "1:00:00", "--log-dir", "L", "--total_steps", "7"])
    text = (tmp_path / "site" / "a.sbatch").read_text()
    assert rc == 0 and "module load cuda\nmodule load nccl" in text and "export A=1" in text and "export B=2" in text, err
    assert "#SBATCH --exclusive" not in text and "#SBATCH --time=1:00:00" in text and "BAKED=(--total_steps 7 " in text
    rc, _, err = run(["sbatch", "demo", "--env", "A"])
    assert rc == 2 and "--env wants NAME=VALUE" in err


def test_positionals_are_the_leading_words():
    rc, out, err = run(["config", "--rollout.mode", "sync", "--json"])   # the default config, not one named "sync"
    assert rc == 0 and json.loads(out)["config"]["rollout"]["mode"] == "sync", err
    rc, out, _ = run(["config", "demo", "--learner.zero_stage", "2", "--json"])
    assert rc == 0 and json.loads(out)["config"]["learner"]["zero_stage"] == 2
    rc, _, err = run(["self-correction", "--steps", "x"])
    assert rc == 2 and "Fix: --steps=<integer>" in err


def test_commands_are_callable_from_python(capsys):
    from grpo_nb.cli import config_command
    from grpo_nb.memory import plan_command
    assert config_command("demo", "--rollout.num_samples_per_prompt=4", json_=True) == 0
    assert json.loads(capsys.readouterr().out)["derived"]["sequences_per_step"] == 128
    assert plan_command(model="Qwen2.5-7B", learner_gpus=8, json_=True) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["learners"] == 8
    assert plan_command("--learner.zero_stage=2", model="Qwen2.5-7B") == 2   # overrides need --config
    assert "overrides need --config" in capsys.readouterr().err


def test_train_refuses_a_direct_weight_load_on_cpu_before_ray(tmp_path, monkeypatch):
    "rollout.weight_load=direct cannot update the CPU build of vLLM (it repacks linear weights): refused before Ray starts, with the fix."
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(["train", "demo", "--rollout.backend=vllm", "--rollout.weight_load=direct", f"--logging.output_dir={tmp_path / 'run'}"])
    assert rc == 2 and "rollout.weight_load" in err and "Fix: --rollout.weight_load=auto" in err, (out, err)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_sbatch_nodes_set_the_config_once(tmp_path, monkeypatch):
    "`sbatch --nodes N` bakes --cluster.nodes=N where the config leaves the count open, refuses where it says otherwise, and its check: line carries --nodes N."
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(["sbatch", "default", "--nodes", "2", "-o", "two.sbatch", "--log-dir", "logs"])
    assert rc == 0, err
    assert "check:  grpo_nb preflight default --nodes 2 --log-dir logs --cluster.nodes=2" in out, out
    assert "BAKED=(--cluster.nodes=2 " in (tmp_path / "two.sbatch").read_text()
    rc, out, err = run(["sbatch", "default", "--nodes", "2", "-o", "x.sbatch", "--cluster.nodes=1"])
    assert rc == 2 and "--nodes asks SLURM for 2" in err and "Fix: --cluster.nodes=2" in err, err
    rc, out, err = run(["sbatch", "seed003-debug-1node", "--nodes", "2", "-o", "y.sbatch"])   # the preset says 1 node
    assert rc == 2 and "places work on 1 node(s)" in err, err
    rc, out, err = run(["preflight", "default", "--nodes", "2", "--log-dir", "logs", f"--logging.output_dir={tmp_path / 'run'}"])
    assert rc == 1 and "nodes           FAIL" in out and "--cluster.nodes=2" in out, out


def test_idle_gpus_are_named_with_the_fix():
    rc, out, err = run(["layout", "--config", "default", "--nodes", "2"])
    assert rc == 0 and "11 of 16 GPUs would sit idle" in err and "--rollout.num_engines=12" in err, err
    rc, out, err = run(["plan", "--config", "default", "--model.name_or_path=Qwen2.5-7B", "--cluster.nodes=2"])
    assert rc == 0 and "11 of 16 would sit idle" in out, out


def test_train_refuses_idle_gpus_before_ray_unless_allowed(tmp_path):
    over = ["--cluster.device=cuda", "--cluster.gpus_per_node=4", "--cluster.learners_per_node=[2]", "--rollout.num_engines=1",
            "--cluster.ray_address=auto", f"--logging.output_dir={tmp_path / 'run'}"]   # as inside a job whose Ray has the GPUs (this machine has none)
    rc, out, err = run(["train", "default", *over])
    assert rc == 2 and "1 of 4 GPUs would sit idle" in err and "--rollout.num_engines=2" in err, err
    assert "--cluster.allow_idle_gpus=true" in err and "Ray" not in err, err


def test_plan_of_a_whole_node_leaves_room_for_the_engines():
    rc, out, err = run(["plan", "--model", "Qwen2.5-7B", "--learner-gpus", "8", "--gpus-per-node", "8", "--json"])
    j = json.loads(out)
    assert rc == 0 and not j["fits"] and not j["gpus_fit"] and "--learner-gpus 7" in j["notes"][0], j["notes"]
    rc, out, err = run(["plan", "--model", "Qwen2.5-7B", "--learner-gpus", "7", "--gpus-per-node", "8", "--json"])
    assert json.loads(out)["fits"]


def test_offloaded_states_are_checked_against_host_memory():
    rc, out, err = run(["plan", "--config", "default", "--model.name_or_path=Qwen2.5-7B", "--learner.offload=optimizer",
                        "--cluster.host_mem_gib=64", "--json"])
    j = json.loads(out)
    assert rc == 0 and not j["host_fit"] and "host memory" in j["notes"][-1], j["notes"]


def test_plan_of_a_colocated_config_says_when_the_engine_need_not_sleep():
    over = ["--model.name_or_path=Qwen2.5-0.5B", "--cluster.device=cuda", "--cluster.gpu=H100-80GB", "--cluster.gpus_per_node=1",
            "--cluster.learners_per_node=[1]", "--rollout.placement=colocated", "--rollout.gpu_memory_utilization=0.3"]
    rc, out, err = run(["plan", "--config", "default", *over])
    assert rc == 0 and "--rollout.sleep_level=0 still fits" in out, out
    rc, out, err = run(["plan", "--config", "default", *over, "--rollout.sleep_level=0", "--json"])
    assert rc == 0 and json.loads(out)["sleep_advice"] is None   # awake already: nothing to advise


def test_underscore_flags_still_work_and_are_announced_deprecated():
    rc, out, err = run(["demo", "--start_below", "0.3", "--help"])
    assert rc == 0 and "--start_below is deprecated; write --start-below" in err and "--start-below" in out, err
    rc, out, err = run(["plan", "--model", "Qwen2.5-7B", "--learner_gpus", "8", "--json"])
    assert rc == 0 and json.loads(out)["settings"]["learners"] == 8 and "--learner_gpus is deprecated" in err
    rc, out, err = run(["config", "demo", "--learner.micro_batch_size=16", "--json"])   # config fields keep their underscores
    assert rc == 0 and "deprecated" not in err


def test_every_help_describes_without_importing_the_engines():
    "`grpo_nb CMD --help` builds the real help without importing torch, Ray, DeepSpeed, vLLM or transformers (in a fresh process)."
    import subprocess, sys
    code = ("import contextlib, io, sys; from grpo_nb.cli import main, COMMANDS\n"
            "for name in COMMANDS:\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out): rc = main([name, '--help'])\n"
            "    heavy = [m for m in ('torch', 'ray', 'deepspeed', 'vllm', 'transformers') if m in sys.modules]\n"
            "    print(name, rc, 'usage:' in out.getvalue(), ','.join(heavy) or '-')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    rows = [l.split() for l in r.stdout.splitlines()]
    assert len(rows) == len(COMMANDS), r.stdout + r.stderr
    for name, rc, usage, heavy in rows: assert (rc, usage, heavy) == ("0", "True", "-"), (name, rc, usage, heavy)


def test_a_described_command_still_runs_for_real_afterwards(capsys):
    "The placeholders of a --help are forgotten: the same process then imports the trainer for real."
    import sys
    assert main(["train", "--help"]) == 0
    from grpo_nb.trainer import train_command
    assert "torch" in sys.modules and type(sys.modules["torch"]).__name__ == "module" and hasattr(sys.modules["torch"], "tensor")
    from grpo_nb import learner   # through the package's attribute, too
    assert type(learner.torch).__name__ == "module"


def test_the_gpu_install_line_installs_everything_grpo_nb_imports():
    "`pip install -r requirements/gpu.txt && pip install -e . --no-deps` on a GPU node: every third-party package a module of grpo_nb imports at its top is listed (torch comes from the site)."
    import ast, pathlib, re, sys
    root = pathlib.Path(__file__).resolve().parents[1]
    listed = {re.split(r"[\[<>=~ ;#]", l.strip())[0].lower().replace("-", "_") for l in (root / "requirements" / "gpu.txt").read_text().splitlines()
              if l.strip() and not l.startswith("#")}
    dist = {"yaml": "pyyaml", "math_verify": "math_verify"}   # import name -> distribution name where they differ
    top = set()
    for p in (root / "grpo_nb").glob("*.py"):
        for n in ast.parse(p.read_text()).body:   # module-level imports: what `import grpo_nb.X` needs
            if isinstance(n, ast.Import): top |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module: top.add(n.module.split(".")[0])
    third = {m for m in top if m not in sys.stdlib_module_names and m not in ("grpo_nb", "torch")}
    missing = sorted(m for m in third if dist.get(m, m).lower() not in listed)
    assert not missing, f"requirements/gpu.txt lacks {missing}"


def test_preflight_checks_offloaded_states_against_the_nodes_memory(tmp_path, monkeypatch):
    "With learner.offload and no cluster.host_mem_gib, preflight asks sinfo for the nodes' memory (here a stand-in sinfo: 64 GiB nodes)."
    import os, stat
    fake = tmp_path / "bin" / "sinfo"; fake.parent.mkdir()
    fake.write_text('#!/bin/sh\ncase "$*" in *"%m"*) printf "n1 65536\\nn2 65536\\n";; *) printf "n1 gpu:8 idle\\nn2 gpu:8 idle\\n";; esac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    args = ["preflight", "default", "--model.name_or_path=Qwen2.5-7B", "--learner.offload=optimizer", "--rollout.num_engines=4",
            f"--logging.output_dir={tmp_path / 'run'}", "--log-dir", str(tmp_path / "logs")]
    rc, out, err = run(args)
    assert rc == 1 and "memory plan     FAIL" in out and "host memory" in out and "of its 64 GiB" in out, out
    rc, out, err = run([*args, "--cluster.host_mem_gib=512"])
    assert "memory plan     PASS" in out and "host memory" in out, out
