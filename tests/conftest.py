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


def pytest_collection_modifyitems(config, items):
    "`make test` skips tests marked slow; GRPO_NB_SLOW_TESTS=1 runs them too."
    if os.environ.get("GRPO_NB_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set GRPO_NB_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
