"""`grpo_nb config --from-open-instruct` end to end, as a user runs it: the seeds' own command lines and YAML in,
a grpo-nb YAML out that `grpo_nb config`, `plan` and `layout` accept, and a named warning for every flag that is
not carried over."""
import os, subprocess, sys
from pathlib import Path
import yaml

ROOT = Path(__file__).resolve().parents[1]

def cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "grpo_nb.cli", "config", "--from-open-instruct", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=120)

# Seed 003, "3. configs/isambard/grpo_7b_rlzero_general.sh": the flags the seed lists, with its Isambard paths
SEED003 = """--num_learners_per_node 2 2 2 2 2 2 2 2 2 2 --vllm_num_engines 20 --vllm_tensor_parallel_size 1
--checkpoint_state_dir /projects/a5k/public/checkpoints_me/grpo-rlzero/exp --output_dir /projects/a5k/public/models_me/grpo-rlzero/exp
--vllm_sync_backend gloo --push_to_hub false --beta 0.0 --clip_higher 0.272 --learning_rate 1e-6 --lr_scheduler_type constant
--apply_verifiable_reward true --temperature 1.0 --num_samples_per_prompt_rollout 8 --num_unique_prompts_rollout 32""".split()


def test_seed003_command_line(tmp_path):
    r = cli(*SEED003, "--cluster.gpus_per_node=4", "--cluster.gpu=GH200-96GB", "--out", str(tmp_path / "run.yaml"))
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load((tmp_path / "run.yaml").read_text())
    assert data["cluster"]["learners_per_node"] == [2] * 10 and data["cluster"]["nodes"] == 10
    assert data["rollout"]["sync_backend"] == "gloo" and data["learner"]["num_mini_batches"] == 1
    assert data["checkpoint"]["dir"].startswith("/projects/a5k")
    assert "--push_to_hub: not translated" in r.stderr
    # the result is a config the other commands take as it is
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (["plan", "--config", str(tmp_path / "run.yaml")], ["layout", "--config", str(tmp_path / "run.yaml")]):
        p = subprocess.run([sys.executable, "-m", "grpo_nb.cli", *cmd], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, (cmd, p.stdout, p.stderr)


def test_seed000_yaml_and_its_traps(tmp_path):
    # seed 000's "Production Config Recommendations" and memory test, as open-instruct YAML
    prod = {"model_name_or_path": "allenai/OLMo-2-0325-32B", "num_unique_prompts_rollout": 32, "num_samples_per_prompt_rollout": 8,
            "response_length": 8192, "pack_length": 10240, "total_episodes": 10000, "save_freq": 200, "local_eval_every": 50,
            "num_learners_per_node": [1] * 16, "vllm_num_engines": 16, "vllm_tensor_parallel_size": 2, "load_ref_policy": False}
    (tmp_path / "prod.yaml").write_text(yaml.safe_dump(prod))
    r = cli(str(tmp_path / "prod.yaml"), "--cluster.gpus_per_node=4")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["total_steps"] == 39
    assert "no checkpoint would happen" in r.stderr and "no evaluation would happen" in r.stderr
    assert "cluster.gpu is not set" in r.stderr   # the unit trap: ask for the board
    r = cli(str(tmp_path / "prod.yaml"), "--total_episodes", "10", "--cluster.gpus_per_node=4")
    assert r.returncode == 0 and "is 0 steps" in r.stderr and yaml.safe_load(r.stdout)["total_steps"] == 1


def test_bad_input_is_named():
    r = cli("--vllm_num_engines", "lots")
    assert r.returncode == 2 and "--vllm_num_engines" in r.stderr
    r = cli("--some_future_flag", "3", "--cluster.gpus_per_node=4")
    assert r.returncode == 0 and "--some_future_flag: no counterpart" in r.stderr
    r = cli("--num_learners_per_node", "9", "--cluster.gpus_per_node=4")   # cannot be placed: the fix is named
    assert r.returncode == 2 and "learners_per_node" in r.stderr


# A debug launch written the way open-instruct's own scripts write them: one flag a line, backslash continuations,
# `uv run python open_instruct/grpo_fast.py` in front, quoted stop strings, bare boolean flags.
SCRIPT = r"""uv run python open_instruct/grpo_fast.py \
    --dataset_mixer_list ai2-adapt-dev/rlvr_gsm8k_zs 64 \
    --dataset_mixer_list_splits train \
    --max_prompt_token_length 512 \
    --response_length 512 \
    --pack_length 1024 \
    --per_device_train_batch_size 1 \
    --num_unique_prompts_rollout 8 \
    --num_samples_per_prompt_rollout 4 \
    --model_name_or_path Qwen/Qwen3-1.7B \
    --stop_strings "</answer>" \
    --apply_verifiable_reward true \
    --temperature 0.7 \
    --learning_rate 3e-7 \
    --total_episodes 200 \
    --deepspeed_stage 2 \
    --num_learners_per_node 1 \
    --beta 0.01 \
    --kl_estimator {kl} \
    --seed 3 \
    --local_eval_every 1 \
    --vllm_sync_backend gloo \
    --vllm_gpu_memory_utilization 0.3 \
    --vllm_enforce_eager \
    --gradient_checkpointing \
    --push_to_hub false"""


def script_args(kl="2", drop=()):
    import shlex
    toks = shlex.split(SCRIPT.format(kl=kl).replace("\\\n", " "))
    toks = toks[toks.index("open_instruct/grpo_fast.py") + 1:]
    out, skip = [], False
    for t in toks:   # drop the named flags and their values
        if t.startswith("--"): skip = t[2:] in drop
        if not skip: out.append(t)
    return out


def test_kl_estimator_is_open_instructs_index(tmp_path):
    for kl, k in (("0", "k1"), ("1", "k2"), ("2", "k3"), ("kl3", "k3")):
        r = cli(*script_args(kl), "--cluster.gpus_per_node=8")
        assert r.returncode == 0, r.stderr
        assert yaml.safe_load(r.stdout)["learner"]["kl"] == k, (kl, r.stdout)
    r = cli(*script_args("3"), "--cluster.gpus_per_node=8")   # importance-weighted, with a KL penalty: refused with the fix
    assert r.returncode == 2 and "importance-weighted" in r.stderr and "Fix: --kl_estimator 2" in r.stderr, r.stderr
    r = cli(*script_args("3", drop=("beta",)), "--beta", "0.0", "--cluster.gpus_per_node=8")
    assert r.returncode == 0 and "--kl_estimator 3: with beta 0 no KL is computed" in r.stderr, r.stderr


def test_omitted_flags_take_open_instructs_defaults():
    r = cli(*script_args(), "--cluster.gpus_per_node=8")
    assert r.returncode == 0, r.stderr
    d = yaml.safe_load(r.stdout)
    assert d["rollout"]["mode"] == "one-step-off"                 # async_steps 1, its default
    assert d["learner"]["drop_zero_variance_groups"] is True      # filter_zero_std_samples True, its default
    assert d["learner"]["clip_high"] == 0.2 and d["checkpoint"]["every_steps"] == 200
    assert "async_steps=1" in r.stderr and "open-instruct's default" in r.stderr
    assert "--truncated_importance_sampling_ratio_cap not given" in r.stderr    # kept at grpo-nb's value, and said
    assert "--deepspeed_stage not given" not in r.stderr                        # the script gives it
    r = cli(*script_args(drop=("beta",)), "--load_ref_policy", "false", "--cluster.gpus_per_node=8")
    d = yaml.safe_load(r.stdout)
    assert r.returncode == 0 and d["learner"].get("kl_beta", 0) == 0 and d["learner"]["ref_policy"] == "none", r.stderr


def test_filter_zero_std_samples_and_a_missing_model():
    r = cli(*script_args(drop=("model_name_or_path",)), "--filter_zero_std_samples", "false", "--cluster.gpus_per_node=8")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["learner"]["drop_zero_variance_groups"] is False
    assert "--filter_zero_std_samples: no counterpart" not in r.stderr
    assert "--model_name_or_path not given" in r.stderr and "/path/to/your/hf/model" in r.stderr
