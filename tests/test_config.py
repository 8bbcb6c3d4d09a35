"""Bad configurations are refused with a message naming the field and the fix (at least 8 cases)."""
import subprocess, sys
import pytest
from grpo_nb.config import ConfigError, load_config, derive

BAD = [  # (override or data, text the message must contain)
    (["--learner.zero_stage=4"], "learner.zero_stage: must be one of 0, 1, 2, 3"),
    (["--lerner.learning_rate=1e-6"], "did you mean 'learner'"),
    (["--learner.learning_rat=1e-6"], "did you mean 'learning_rate'"),
    (["--learner.agg=token_mean"], "'token-mean'"),
    (["--learner.learning_rate=fast"], "expected a number"),
    (["--rollout.num_samples_per_prompt=1"], "--rollout.num_samples_per_prompt=8"),
    (["--rollout.prompts_per_step=1", "--rollout.num_samples_per_prompt=2"], "--rollout.prompts_per_step=2"),  # fewer sequences than learners
    (["--learner.offload=optimizer", "--learner.zero_stage=1"], "needs ZeRO stage 2 or 3"),
    (["--rollout.top_p=1.5"], "rollout.top_p: must be in (0, 1]"),
    (["--learner.kl_beta=0.05"], "--learner.ref_policy=gpu"),
    (["--cluster.learners_per_node=[2,2,2]", "--cluster.nodes=2"], "--cluster.nodes=3"),
    (["--cluster.learners_per_node=[16]"], "asks for 16 learners on a node with 8 GPUs"),
    (["--rollout.tensor_parallel_size=16"], "tensor parallelism must stay inside a node"),
    (["--model.gradient_checkpointing=maybe"], "expected true or false"),
    (["--rollout.max_new_tokens"], "override has no value"),
    (["learner.learning_rate=1e-6"], "overrides look like --section.field=value"),
    (["--learner.dual_clip=0.5"], "must be > 1 or none"),
    (["--reward.functions=[math]"], "expected a mapping"),
]

@pytest.mark.parametrize("overrides,expected", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_is_refused_with_fix(overrides, expected):
    with pytest.raises(ConfigError) as e: load_config(None, overrides)
    assert expected in str(e.value), str(e.value)

def test_bad_yaml_file(tmp_path):
    p = tmp_path / "run.yaml"; p.write_text("learner:\n  zero_stage: [3\n")
    with pytest.raises(ConfigError, match="not valid YAML"): load_config(p)
    with pytest.raises(ConfigError, match="no such file"): load_config(tmp_path / "missing.yaml")
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"): load_config(p)

def test_good_config_roundtrip_and_derived(tmp_path):
    cfg = load_config("default", ["--cluster.learners_per_node=[2,2]", "--cluster.nodes=4", "--rollout.num_engines=4",
                                  "--rollout.tensor_parallel_size=2"])
    d = derive(cfg)
    assert (d.learner_world_size, d.sync_world_size, d.gpus_needed, d.effective_batch) == (4, 9, 12, 32)

def test_cli_exit_codes():
    bad = subprocess.run([sys.executable, "-c", "import sys; from grpo_nb.cli import main; sys.exit(main(['config', '--learner.zero_stage=9']))"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Fix: --learner.zero_stage=3" in bad.stderr
    helped = subprocess.run([sys.executable, "-c", "from grpo_nb.cli import main; main(['--help'])"], capture_output=True, text=True)
    assert "plan" in helped.stdout and "sbatch" in helped.stdout

def test_reward_and_cluster_fields_match_their_modules():
    "The config's defaults for rewards and the sandbox are the ones those modules use when called directly."
    from grpo_nb.rewards import RewardContext
    from grpo_nb.sandbox import Limits
    r, c = load_config("default").reward, load_config("default").cluster
    assert (r.math_timeout_s, r.code_workers, r.code_timeout_s) == (RewardContext.math_timeout_s, RewardContext.max_workers, RewardContext.code_timeout_s)
    assert (r.code_memory_mb, r.code_nproc) == (Limits.memory_mb, Limits.nproc)
    assert (c.cpus_per_learner, c.cpus_per_engine_worker) == (1.0, 1.0)
    with pytest.raises(ConfigError, match="--reward.code_workers=1"): load_config("default", ["--reward.code_workers=0"])

def test_demo_preset_is_valid_and_small():
    cfg = load_config("demo")
    assert cfg.cluster.device == "cpu" and cfg.reward.functions == {"arith": 1.0} and cfg.rollout.kv_cache_mib > 0
    assert derive(cfg).optimizer_steps_per_step >= 1

def test_a_pack_shorter_than_the_longest_sequence_is_refused():
    "The open-instruct 32B run's low-memory tip (2048-token prompts and responses packed into 3072) cannot work: refused with the fix."
    with pytest.raises(ConfigError, match=r"--learner.pack_length=4096"):
        load_config("default", ["--data.max_prompt_tokens=2048", "--rollout.max_new_tokens=2048", "--learner.pack_length=3072"])
    assert load_config("default", ["--data.max_prompt_tokens=1024", "--rollout.max_new_tokens=2048", "--learner.pack_length=3072"])

def test_a_list_field_takes_commas_and_its_hint_is_a_valid_override():
    cfg = load_config("default", ["--cluster.nodes=2", "--cluster.learners_per_node=2,2"])
    assert cfg.cluster.learners_per_node == [2, 2]
    with pytest.raises(ConfigError) as e: load_config("default", ["--cluster.nodes=2", "--cluster.learners_per_node=2,x"])
    fix = e.value.fix.split()[0]
    assert fix.startswith("--cluster.learners_per_node=[") and "[0]" not in str(e.value)
    assert load_config("default", ["--cluster.nodes=2", fix]).cluster.learners_per_node == [1, 1]   # the hint itself loads

def test_a_missing_plugin_is_refused_at_config_time(tmp_path):
    with pytest.raises(ConfigError, match="reward.plugins: no file"): load_config("default", [f"--reward.plugins={tmp_path}/r.py"])
    with pytest.raises(ConfigError, match="data.plugins: no module 'no_such_pkg_here'"): load_config("default", ["--data.plugins=no_such_pkg_here"])
    (tmp_path / "r.py").write_text("raise SystemExit('must not run at config time')\n")
    assert load_config("default", [f"--reward.plugins={tmp_path}/r.py"]).reward.plugins == [str(tmp_path / "r.py")]
