"""Shared pytest set-up: the environment every real engine needs on this CPU machine."""
import os

for k, v in {"RAY_AUTH_MODE": "disabled", "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
             "DS_BUILD_OPS": "0", "TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0",
             "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}.items():
    os.environ.setdefault(k, v)

import pytest

@pytest.fixture(scope="session")
def tiny_model():
    "Factory `tiny_model(name='tiny-arith', seed=0, warm_steps=0) -> Path`: a built, cached tiny Qwen2 directory (grpo_nb.tiny)."
    from grpo_nb.tiny import tiny_model_dir
    return tiny_model_dir


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: longer than CI's budget allows; runs only with GRPO_NB_SLOW_TESTS=1")


# Test files that take longest on CI's two cores, longest first (from the `--durations` of its logs). `make test` runs the
# files on two workers, one file at a time each, in collection order (`--no-loadscope-reorder`: pytest-xdist otherwise
# hands out the files with the most tests first, which leaves the long few-test files for the end): starting the long
# ones first keeps one worker from finishing its last long file alone while the other has nothing left. The SLURM chain
# is mostly waiting for the scheduler's 30-second time-limit checks: `make test` runs it in a pytest of its own, in the
# background from its start (tools/ci_test.sh); a plain `make pytest` starts it first, beside the CPU-bound files.
LONGEST_FIRST = ["test_slurm_cluster.py", "test_trainer.py", "test_weight_sync_vllm.py", "test_ddp.py", "test_colocate.py",
                 "test_reward_model.py", "test_self_correction.py", "test_learner.py", "test_placement.py",
                 "test_reward_hacking.py", "test_rewards_sandbox.py", "test_plugins.py", "test_ray_bootstrap.py"]


def pytest_collection_modifyitems(config, items):
    "The long test files first (`LONGEST_FIRST`); `make test` skips tests marked slow, GRPO_NB_SLOW_TESTS=1 runs them too."
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))   # stable: the rest keep their order, files stay together
    if os.environ.get("GRPO_NB_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set GRPO_NB_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
