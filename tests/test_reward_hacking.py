"""Reward hacking: programs that are wrong and try to be scored as right anyway.

Each program in tests/hacks/ is a wrong solution plus one attack on the scorer: rebinding `exec`, `compile`, `eval`
or builtins the test uses (`range`, `bin`, `map`), walking frames or `gc` to reach a report function or the
expected values, objects that equal anything, lying `__class__`, forged report or reply lines, replies that cost
the receiver time or memory, reading the training data from disk, exceptions named to confuse. A program's
docstring may name its tests (`# tests:`), the dataset's setup code (`# setup:`), an honest correct program
(`# honest:`) and an honest wrong one (`# wrong:`); `# refused: true` marks tests that no program may be scored on.

Every attack must score exactly what the honest wrong program scores on the same tests, through every path that
scores code: `run_tests` in-process, the `code` reward functions, and the HTTP service. Honest correct programs
keep full marks.
"""
import json, re, threading, time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
import pytest
from grpo_nb.rewards import CodeClient, RewardContext, compute_rewards, start_code_service
from grpo_nb.sandbox import isolation_status, run_tests

HACKS = sorted((Path(__file__).parent / "hacks").glob("*.py"))
DEFAULT = {"tests": ["assert add(2, 3) == 5", "assert add(10, 20) == 30"], "setup": "", "refused": False,
           "honest": "def add(a, b):\n    return a + b\n", "wrong": "def add(a, b):\n    return a * b + 7\n"}
TIMEOUT = 3

pytestmark = pytest.mark.skipif(isolation_status()["root"] != "ok" and isolation_status()["userns"] != "ok",
                                reason="no namespace isolation on this machine")


def spec_of(path:Path) -> dict:
    "The hack's tests, setup, honest and wrong programs (defaults: the `add` task)."
    out = dict(DEFAULT)
    for key, value in re.findall(r"^# (tests|setup|honest|wrong|refused): (.*)$", path.read_text(), re.M): out[key] = json.loads(value)
    return out


@lru_cache(maxsize=None)
def score(program:str, tests:str, setup:str) -> tuple:
    "(passed, statuses) of one program in-process (cached: many hacks share the honest programs)."
    r = run_tests(program, json.loads(tests), timeout_s=TIMEOUT, setup=setup)
    return r["passed"], tuple(x["status"] for x in r["results"])


def test_the_suite_is_there():
    assert len(HACKS) >= 38


@pytest.mark.parametrize("hack", HACKS, ids=lambda p: p.stem)
def test_in_process(hack):
    s = spec_of(hack)
    key = (json.dumps(s["tests"]), s["setup"])
    with ThreadPoolExecutor(3) as ex:
        (got, st), (wrong, _), (honest, hst) = ex.map(lambda p: score(p, *key), [hack.read_text(), s["wrong"], s["honest"]])
    assert got == wrong, (hack.stem, st)
    if s["refused"]: assert set(st) == set(hst) == {"unsupported"}, (st, hst)
    else: assert (wrong, honest) == (0, len(s["tests"])), (hack.stem, wrong, honest, hst)


def test_reward_functions_and_the_service():
    specs = [spec_of(p) for p in HACKS]
    completions = [f"```python\n{p.read_text()}\n```" for p in HACKS] + [f"```python\n{s['honest']}```" for s in specs]
    answers = [{"tests": s["tests"], "setup": s["setup"]} for s in specs] * 2
    want = [0.0] * len(HACKS) + [0.0 if s["refused"] else 1.0 for s in specs]
    rb = compute_rewards(completions, answers, {"code": 1.0, "code_all": 1.0}, RewardContext(code_timeout_s=TIMEOUT))
    assert rb.per_function["code"] == want, dict(zip([p.stem for p in HACKS], rb.per_function["code"]))
    assert rb.per_function["code_all"] == want
    url, proc = start_code_service(workers=2)
    slow, stop = [], threading.Event()
    def watch():   # /health must keep answering while programs make the judges work (huge powers, colliding sets)
        with CodeClient(url) as client:
            while not stop.is_set():
                t0 = time.monotonic(); assert client.health()["status"] == "ok"; slow.append(time.monotonic() - t0); time.sleep(0.2)
    watcher = threading.Thread(target=watch, daemon=True); watcher.start()
    try:
        rs = compute_rewards(completions, answers, {"code": 1.0}, RewardContext(code_service_url=url, code_timeout_s=TIMEOUT))
        assert rs.per_function["code"] == want, json.dumps(rs.per_function)
    finally:
        stop.set(); watcher.join(10)
        proc.terminate(); proc.wait(15)
    assert len(slow) >= 3 and max(slow) < 2.0, slow
