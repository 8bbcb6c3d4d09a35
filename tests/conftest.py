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


# Files that take minutes (real Ray clusters, SLURM, vLLM, trainer runs), longest first. With `-n 2 --dist loadfile`
# each worker takes whole files in collection order, so starting these first keeps the two workers' ends close together.
LONG_FILES = ["test_trainer.py", "test_slurm_cluster.py", "test_placement.py", "test_weight_sync_vllm.py", "test_colocate.py",
              "test_learner.py", "test_ddp.py", "test_reward_model.py", "test_self_correction.py", "test_rewards_sandbox.py"]

def pytest_collection_modifyitems(config, items):
    "The long files first (see LONG_FILES); `make test` skips tests marked slow; GRPO_NB_SLOW_TESTS=1 runs them too."
    rank = {f: i for i, f in enumerate(LONG_FILES)}
    items.sort(key=lambda it: rank.get(it.path.name, len(LONG_FILES)))   # stable: file order and test order kept otherwise
    if os.environ.get("GRPO_NB_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set GRPO_NB_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
