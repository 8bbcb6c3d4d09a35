"""Reward hacking (issue 21.9): programs that fail every test honestly and try to fake passes anyway.

Each program in tests/hacks/ defines a wrong `add` (a * b + 7) plus one attack on the harness: rebinding
`exec`, `compile` or `eval`, walking frames to call the report function or rewrite the tests, objects that
equal anything, int subclasses, forged report lines (before, after, from a thread, with the real nonce),
exiting 0 early, reading the tests from files and memory, patching json/repr/type. The verdict is computed
by the caller from plain data (`grpo_nb.sandbox.plan_assert` / `judge`), so every one must score 0 through
every path that scores code: `run_tests` in-process, the `code` reward functions, and the HTTP service.
Honest programs still pass.
"""
import json
from pathlib import Path
import pytest
from grpo_nb.rewards import CodeClient, RewardContext, compute_rewards, start_code_service
from grpo_nb.sandbox import isolation_status, run_tests

HACKS = sorted((Path(__file__).parent / "hacks").glob("*.py"))
TESTS = ["assert add(2, 3) == 5", "assert add(10, 20) == 30"]
HONEST = "def add(a, b):\n    return a + b\n"

pytestmark = pytest.mark.skipif(isolation_status()["root"] != "ok" and isolation_status()["userns"] != "ok",
                                reason="no namespace isolation on this machine")


def test_the_suite_is_there():
    assert len(HACKS) >= 15


@pytest.mark.parametrize("hack", HACKS, ids=lambda p: p.stem)
def test_in_process(hack):
    r = run_tests(hack.read_text(), TESTS, timeout_s=5)
    assert (r["passed"], r["total"]) == (0, 2), (hack.stem, r["results"])


def test_reward_functions_and_the_service():
    completions = [f"```python\n{p.read_text()}\n```" for p in HACKS] + [f"```python\n{HONEST}```"]
    answers = [TESTS] * len(completions)
    rb = compute_rewards(completions, answers, {"code": 1.0, "code_all": 1.0}, RewardContext(code_timeout_s=5))
    assert rb.per_function["code"][:-1] == [0.0] * len(HACKS), dict(zip([p.stem for p in HACKS], rb.per_function["code"]))
    assert rb.per_function["code_all"][:-1] == [0.0] * len(HACKS) and rb.per_function["code"][-1] == 1.0
    url, proc = start_code_service(workers=2)
    try:
        with CodeClient(url, batch_size=4, concurrency=2) as client:
            res = client.run_batch([{"program": p.read_text(), "tests": TESTS, "timeout_s": 5} for p in HACKS] +
                                   [{"program": HONEST, "tests": TESTS}])
        report = {p.stem: r["passed"] for p, r in zip(HACKS, res)}
        assert all(v == 0 for v in report.values()), report
        assert res[-1]["passed"] == 2
        ctx = RewardContext(code_service_url=url, code_timeout_s=5)
        rs = compute_rewards(completions, answers, {"code": 1.0}, ctx)
        assert rs.per_function["code"] == rb.per_function["code"], json.dumps(rs.per_function)
    finally:
        proc.terminate(); proc.wait(15)
