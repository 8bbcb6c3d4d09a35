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
