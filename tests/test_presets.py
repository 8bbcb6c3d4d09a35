"""Every preset shipped in configs/ (one per run the seed documents describe) resolves, plans, lays out and
preflights here, with no GPU: `grpo_nb config`, `grpo_nb plan --config`, `grpo_nb layout --config` and
`grpo_nb preflight` (offline: only the model and data checks, which need the weights and the data files, and the sinfo check, which needs a
SLURM controller, may fail). Also the bad inputs: an unknown preset lists the ones that exist; a cycle of
`extends`; a config of another trainer given to the GRPO trainer."""
import contextlib, io, json
import pytest
from grpo_nb.cli import config_cli
from grpo_nb.config import ConfigError, TRAINERS, config_data, load_config, shipped_presets, trainer_of

PRESETS = shipped_presets()
BY_TRAINER = {t: sorted(k for k, p in PRESETS.items() if trainer_of(config_data(p))[0] == t) for t in TRAINERS}


def run(fn, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = fn(argv)
    return rc, out.getvalue(), err.getvalue()


def test_every_seed_has_presets():
    seeds = {k[:7] for k in PRESETS}
    assert {"seed000", "seed001", "seed002", "seed003", "seed004"} <= seeds, sorted(PRESETS)
    assert len(BY_TRAINER["grpo"]) >= 11 and BY_TRAINER["ddp"] and len(BY_TRAINER["reward-model"]) == 3 and len(BY_TRAINER["self-correction"]) == 2
    for k, p in ((k, p) for k, p in PRESETS.items() if k.startswith("seed")):   # a header naming the seed and its section
        head = p.read_text().splitlines()[0]
        assert head.startswith(f"# Seed {k[4:7]}"), (k, head)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_resolves(name):
    rc, out, err = run(config_cli, [name, "--json"])
    assert rc == 0, err
    assert json.loads(out)


@pytest.mark.parametrize("name", BY_TRAINER["grpo"])
def test_grpo_presets_plan_layout_preflight(name):
    from grpo_nb.memory import plan_cli
    from grpo_nb.placement import layout_cli
    from grpo_nb.preflight import preflight_cli
    rc, out, err = run(plan_cli, ["--config", name, "--json"])
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["fits"], (name, plan.get("advice"))
    rc, out, err = run(layout_cli, ["--config", name])
    assert rc == 0, (out, err)
    rc, out, err = run(preflight_cli, [name])
    rows = {l[:16].strip(): l[16:22].strip() for l in out.splitlines() if l[:16].strip() and l[16:22].strip() in ("PASS", "FAIL", "WARN", "SKIP")}
    assert rows["config"] == rows["memory plan"] == "PASS" and rows["layout"] in ("PASS", "WARN"), out
    if rows["layout"] == "WARN": assert "would sit idle" in out and "Fill them: --" in out, out   # the seeds' own layouts may leave GPUs idle
    assert all(v != "FAIL" for k, v in rows.items() if k not in ("model", "data", "nodes (sinfo)")), out   # weights and data live on the cluster


def test_seed_runs_train_one_optimizer_step_per_rollout():
    from grpo_nb.config import derive
    for name in BY_TRAINER["grpo"]:
        assert derive(load_config(name)).optimizer_steps_per_step == 1, name


def test_seed_capacity_is_what_nvidia_smi_reports():
    cfg = load_config("seed000-olmo2-7b-math")
    assert cfg.cluster.gpu == "GH200-96GB" and abs(cfg.cluster.gpu_mem_gib - 97871 / 1024) < 1e-9


def test_unknown_preset_lists_the_shipped_ones():
    rc, out, err = run(config_cli, ["seed000-olmo-7b"])
    assert rc == 2 and "seed000-olmo2-7b-math" in err and "grpo_nb config --list" in err


def test_extends_cycle_and_wrong_trainer(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"extends: {b}\n"); b.write_text(f"extends: {a}\n")
    with pytest.raises(ConfigError, match="cycle"): load_config(str(a))
    with pytest.raises(ConfigError, match="reward-model trainer"): load_config("seed002-rm-qwen3-4b-8gpu")
    rc, out, err = run(config_cli, ["--list"])
    assert rc == 0 and "seed004-score-4gpu" in out and "self-correction" in out


def test_engine_knobs_reach_the_engine():
    from grpo_nb.trainer import _engine_kwargs
    kw = _engine_kwargs(load_config("demo", ["--rollout.chunked_prefill=off"]), "cpu")
    assert kw["enable_chunked_prefill"] is False
    assert "enable_chunked_prefill" not in _engine_kwargs(load_config("demo"), "cpu")   # "auto": vLLM's own default
    cfg = load_config("seed003-isambard-7b")
    assert (cfg.rollout.sync_backend, cfg.rollout.startup_timeout_s) == ("gloo", 1800)
    with pytest.raises(ConfigError, match="sync_backend"): load_config("demo", ["--rollout.sync_backend=mpi"])


def test_seed001_ddp_on_v100s():
    from grpo_nb.ddp import ddp_sbatch, load_run, pick_precision
    cfg, _ = load_run("seed001-ddp-2xv100")
    assert pick_precision("cuda", cfg.model.dtype, bf16_ok=False)[0] == "fp16-autocast"     # V100: no bf16
    assert pick_precision("cuda", "bfloat16", bf16_ok=False)[2]                              # replaced, with a warning
    with pytest.raises(ConfigError, match="logging.wandb"): load_run("seed001-ddp-2xv100", ["--logging.wandb=online"])
    assert "#SBATCH --gres=gpu:volta:2" in ddp_sbatch(gres="gpu:volta:2")


@pytest.mark.parametrize("name", BY_TRAINER["ddp"] + BY_TRAINER["reward-model"] + BY_TRAINER["self-correction"])
def test_other_trainers_presets_are_planned_by_their_own_memory_models(name):
    "`grpo_nb plan --config` plans the torchrun, reward-model and self-correction presets instead of refusing them."
    from grpo_nb.cli import main
    gpus = {"ddp": 2, "reward-model": int(name.split("-")[-1].removesuffix("gpu")) if name.endswith("gpu") else 1}.get(trainer_of(config_data(PRESETS[name]))[0], 1)
    rc, out, err = run(main, ["plan", "--config", name, "--gpus", str(gpus), "--gpu-mem-gib", "80", "--host-mem-gib", "512", "--json"])
    assert rc == 0, err
    p = json.loads(out)
    assert p["trainer"] == trainer_of(config_data(PRESETS[name]))[0] and p["fits"], p


def test_self_correction_without_offload_does_not_fit_the_runs_gpus():
    from grpo_nb.cli import main
    rc, out, err = run(main, ["plan", "--config", "seed004-score-2gpu", "--optimizer_offload=false", "--gpu-mem-gib", "44.5"])
    assert rc == 0 and "DOES NOT FIT" in out and "--optimizer_offload=true" in out, out
    rc, out, err = run(main, ["plan", "--config", "seed004-score-2gpu", "--gpu-mem-gib", "44.5", "--host-mem-gib", "64"])
    assert "cpu" in out and "DOES NOT FIT" in out, out   # the offloaded states need more than a 64 GiB node
