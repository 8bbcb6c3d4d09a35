"""Every public name of every module is defined and usable (a `@patch` once rebound
`grpo_nb.rewards.run_tests` to None, so `from grpo_nb.rewards import run_tests` gave None)."""
import importlib, pkgutil
import pytest
import grpo_nb

MODULES = sorted(m.name for m in pkgutil.iter_modules(grpo_nb.__path__) if not m.name.startswith("_"))


@pytest.mark.parametrize("name", MODULES)
def test_every_name_in_all_is_defined_and_not_none(name):
    mod = importlib.import_module(f"grpo_nb.{name}")
    names = getattr(mod, "__all__", [])
    missing = [n for n in names if not hasattr(mod, n)]
    none = [n for n in names if hasattr(mod, n) and getattr(mod, n) is None]
    assert not missing and not none, f"grpo_nb.{name}: undefined {missing}, None {none}"


def test_the_in_process_code_runner_is_importable_from_rewards():
    from grpo_nb.rewards import run_tests
    from grpo_nb import sandbox
    assert run_tests is sandbox.run_tests and callable(run_tests)
    assert run_tests("def f(x): return x + 1", ["assert f(1) == 2"], 10)["passed"] == 1


def test_reward_context_reads_every_reward_field():
    "The DDP trainer dropped the math time-out and the sandbox limits; one constructor now reads them all."
    from dataclasses import fields
    from grpo_nb.config import RewardConfig
    from grpo_nb.rewards import RewardContext
    R = RewardConfig(code_service_url="http://x:1", code_timeout_s=3.0, allow_unisolated=True, math_timeout_s=1.5, code_workers=3,
                     code_memory_mb=300, code_nproc=7, code_packages=["json5"])
    c = RewardContext.from_config(R)
    assert c.packages == ("json5",)
    assert (c.code_service_url, c.code_timeout_s, c.allow_unisolated, c.math_timeout_s, c.max_workers) == ("http://x:1", 3.0, True, 1.5, 3)
    assert (c.limits.memory_mb, c.limits.nproc) == (300, 7)
    used = {"code_service_url", "code_timeout_s", "allow_unisolated", "math_timeout_s", "code_workers", "code_memory_mb", "code_nproc", "code_packages"}
    assert {f.name for f in fields(RewardConfig)} - {"functions", "plugins"} <= used, "a new reward field must reach RewardContext.from_config"   # plugins are imported before, not passed
    import inspect, grpo_nb.ddp, grpo_nb.trainer
    for mod in (grpo_nb.ddp, grpo_nb.trainer): assert "RewardContext.from_config(" in inspect.getsource(mod)
