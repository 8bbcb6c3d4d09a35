"""Math and format rewards, the registry, batch scoring, and the math-verify worker pool."""
import os, stat, sys, time
import pytest
from grpo_nb.config import RewardConfig
from grpo_nb.rewards import (REWARDS, RewardContext, VerifyPool, arith_reward, check_functions, compute_rewards,
                             default_verify_pool, extract_answer, extract_boxed, extract_code, format_boxed_reward,
                             format_think_reward, math_equal, math_reward, parse_number, reference_answer, register)

@pytest.mark.parametrize("text,expected", [
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"first \boxed{1}, finally \boxed{2}", "2"),
    (r"\boxed{\left\{ x : x^{2} > 1 \right\}}", r"\left\{ x : x^{2} > 1 \right\}"),
    (r"\fbox{7}", "7"),
    (r"\boxed {12}", "12"),
    (r"\boxed{unclosed", None),
    ("", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected

@pytest.mark.parametrize("text,expected", [
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
    ("#### 1,000,000.", "1,000,000"),
    ("so 3 + 4 = 7 apples", "7"),
    ("-0.5 and then 2.25", "2.25"),
    ("The answer is \\boxed{x+1}. Also 5.", "x+1"),
    ("no numbers here", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected

def test_parse_number_is_exact():
    assert parse_number("0.1") + parse_number("0.2") == parse_number("0.3")
    assert parse_number("1,234.5") == parse_number("2469/2")
    assert parse_number("\\dfrac{3}{4}") == parse_number("0.75")
    assert parse_number("1e400") is not None and parse_number("abc") is None

@pytest.mark.parametrize("completion,answer,expected", [
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{4}}", "0.5", 1.0),
    ("The total is 1,024", "1024", 1.0),
    ("#### 72", "Natalia sold 48/2 = 24 clips in May.\n#### 72", 1.0),
    ("\\boxed{73}", "72", 0.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("\\boxed{x^2+2x}", "x^2+2x+1", 0.0),
    ("no answer", "3", 0.0),
    ("\\boxed{" + "9" * 1000 + "x}", "3", 0.0),  # too long for sympy: refused, not parsed
])
def test_math_reward(completion, answer, expected):
    assert math_reward(completion, answer) == expected

def test_cpu_timeout_scores_an_expensive_check_zero_and_keeps_the_worker():
    "The budget is CPU time (a busy machine does not turn right answers into zeros); past it the check is False."
    pool = default_verify_pool()
    gold, pred = "(x+y+z)^{20}", "(x+y+z)^{19}(x+y+z)"  # equal, but expanding takes sympy a few tenths of a CPU second
    assert pool.equal(gold, pred, timeout_s=0.02) is False and pool.killed == 0
    assert pool.equal(gold, pred, timeout_s=10) is True

def test_math_reward_from_threads_is_right():
    "math-verify's signal timeouts fail in threads; the worker pool makes threaded calls correct."
    ctx = RewardContext(max_workers=4)
    comps = ["\\boxed{(x+1)^2}", "\\boxed{x^2+2x+1}", "\\boxed{\\frac{\\pi}{2}}", "\\boxed{1.5707}"] * 2
    answers = ["x^2+2x+1", "(x+1)^2", "\\pi/2", "\\pi/2"] * 2
    assert compute_rewards(comps, answers, {"math": 1.0}, ctx).total == [1.0, 1.0, 1.0, 0.0] * 2

def test_verify_pool_kills_a_stuck_worker(tmp_path):
    "A worker that never answers is killed after the timeout and replaced; the call reports None."
    fake = tmp_path / "stuck_python"
    fake.write_text("#!/bin/sh\necho '{\"ready\": true}'\nexec sleep 600\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    pool = VerifyPool(workers=1, python=str(fake), hang_s=0.5)
    t0 = time.monotonic()
    assert pool.equal("1", "2") is None  # silent for 0.5 s of wall time: hung
    assert pool.killed == 1 and time.monotonic() - t0 < 10
    assert pool.equal("1", "2") is None and pool.killed == 2  # replaced, and killed again
    pool.close()
    assert not pool._live

def test_arith_reward():
    assert [arith_reward(c, "12") for c in [" 12", "12\n3", " 1 2", "-12", "", " 012"]] == [1, 1, 0, 0, 0, 1]
    assert arith_reward(" -3", -3) == 1.0 and arith_reward("7", "not an int") == 0.0

def test_format_rewards():
    assert format_think_reward("<think>\nstep\n</think>\nThe answer is 4") == 1.0
    assert format_think_reward("<think>a</think><think>b</think> 4") == 0.0
    assert format_think_reward("4 <think>a</think> 4") == 0.0
    assert format_boxed_reward("so \\boxed{4}") == 1.0 and format_boxed_reward("\\boxed{}") == 0.0

def test_extract_code():
    text = "Plan.\n```python\ndef f(): return 1\n```\nTest:\n```\nprint(f())\n```\n```text\nout\n```"
    assert extract_code(text) == "print(f())\n"
    assert extract_code("def g(): pass") == "def g(): pass"
    assert extract_code("```rust\nfn main(){}\n```") == "fn main(){}\n"

def test_reference_answer():
    assert reference_answer("so #### 18") == "18" and reference_answer("is \\boxed{\\frac12}") == "\\frac12"
    assert reference_answer(42) == "42"

def test_registry_and_weights():
    for name in ["math", "arith", "format_boxed", "format_think", "code", "code_all"]: assert name in REWARDS
    with pytest.raises(ValueError, match="did you mean 'arith'"): check_functions({"arithm": 1.0})
    b = compute_rewards([" 5", " 6", "5"], ["5", "5", "5"], {"arith": 2.0})
    assert b.total == [2.0, 0.0, 2.0] and b.per_function == {"arith": [1.0, 0.0, 1.0]}
    with pytest.raises(ValueError, match="2 completions but 1 answers"): compute_rewards(["a", "b"], ["a"], {"arith": 1.0})

def test_register_a_custom_reward():
    @register("length_test")
    def length(completions, answers, ctx): return [min(len(c), 10) / 10 for c in completions]
    try:
        assert compute_rewards(["abc", "x" * 20], [None, None], {"length_test": 1.0, "arith": 0.0}).total == [0.3, 1.0]
    finally:
        REWARDS.pop("length_test")

def test_context_from_config():
    ctx = RewardContext.from_config(RewardConfig(code_service_url="http://h:1", code_timeout_s=3.0, allow_unisolated=True))
    assert (ctx.code_service_url, ctx.code_timeout_s, ctx.allow_unisolated) == ("http://h:1", 3.0, True)

def test_math_equal_fast_path_needs_no_worker():
    "Plain numbers never reach math-verify: a pool that cannot start is never asked."
    pool = VerifyPool(workers=1, python="/nonexistent/python")
    assert math_equal("1,000", "1000.0", pool=pool) and not math_equal("3", "4", pool=pool)
    assert math_equal("\\frac{1}{2}", "0.5", pool=pool) and not pool._live


def test_code_reward_in_process_through_the_module():
    "The exported module scores code without a service (a `@patch`ed method once shadowed the sandbox's `run_tests`)."
    from grpo_nb.rewards import RewardContext, compute_rewards
    ctx = RewardContext(code_timeout_s=5.0)
    comps = ["```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return a - b\n```"]
    b = compute_rewards(comps, [["assert add(1, 2) == 3", "assert add(0, 0) == 0"]] * 2, {"code": 1.0}, ctx)
    assert b.per_function["code"] == [1.0, 0.5], b.per_function


# --- the code reward on the test formats real datasets use (sample rows in data/code_formats/) ---
import ast, json
from pathlib import Path
from grpo_nb.rewards import CODE_FORMATS, start_code_service, code_tests_of_row
from grpo_nb.sandbox import isolation_status, run_tests

FORMATS = Path(__file__).resolve().parents[1] / "data" / "code_formats"
needs_sandbox = pytest.mark.skipif(isolation_status()["root"] != "ok" and isolation_status()["userns"] != "ok",
                                   reason="no namespace isolation on this machine")

def reference_program(row:dict) -> str:
    "The row's correct program, from its format's own solution field."
    if "canonical_solution" in row: return row["prompt"] + row["canonical_solution"]
    if "code" in row: return row["code"]
    if isinstance(row.get("solutions"), str): return json.loads(row["solutions"])[0]
    if isinstance(row.get("solutions"), dict): return row["solutions"]["solution"][0]
    return row["solution"]

def wrong_program(correct:str) -> str:
    "The same top-level functions, each returning None; a stdin program that prints 0."
    names = [n.name for n in ast.parse(correct).body if isinstance(n, ast.FunctionDef)]
    return "".join(f"def {n}(*a, **k):\n    return None\n" for n in names) or "print(0)\n"

def sample_rows() -> list[tuple[str, dict]]:
    return [(p.stem, json.loads(line)) for p in sorted(FORMATS.glob("*.jsonl")) for line in p.read_text().splitlines()]

def test_every_format_has_sample_rows():
    assert {p.stem for p in FORMATS.glob("*.jsonl")} == {"mbpp", "humaneval", "multi_assert", "apps", "taco", "codecontests", "open_instruct_code"}
    for name, row in sample_rows(): assert code_tests_of_row(row.get("answer", row))["tests"], name

@needs_sandbox
def test_code_reward_reads_every_format_in_process_and_through_the_service():
    rows = sample_rows()
    right = [f"```python\n{reference_program(r)}```" for _, r in rows]
    wrong = [f"```python\n{wrong_program(reference_program(r))}```" for _, r in rows]
    answers = [r.get("answer", r) for _, r in rows] * 2
    rb = compute_rewards(right + wrong, answers, {"code": 1.0, "code_all": 1.0}, RewardContext(code_timeout_s=5))
    names = [n for n, _ in rows]
    assert rb.per_function["code_all"][:len(rows)] == [1.0] * len(rows), dict(zip(names, rb.per_function["code"]))
    assert all(x < 1.0 for x in rb.per_function["code"][len(rows):]), dict(zip(names, rb.per_function["code"][len(rows):]))
    url, proc = start_code_service(workers=2)
    try:
        rs = compute_rewards(right + wrong, answers, {"code": 1.0}, RewardContext(code_service_url=url, code_timeout_s=5))
        assert rs.per_function["code"] == rb.per_function["code"]
    finally:
        proc.terminate(); proc.wait(15)

def test_a_row_without_tests_is_refused_naming_the_formats():
    with pytest.raises(ValueError, match="expected one of") as e: code_tests_of_row({"question": "q", "solutions": "[]"})
    assert all(k.split(" ")[0] in str(e.value) for k in CODE_FORMATS)
    with pytest.raises(ValueError, match="'inputs' and 'outputs'"): code_tests_of_row({"input_output": '{"input": ["1"], "output": ["1"]}'})

@needs_sandbox
def test_malformed_stdin_cases_are_refused_with_the_keys_expected():
    r = run_tests("print(3)", [{"inputs": "1 2", "outputs": "3"}, {"stdin": "", "expected_output": "3"}], timeout_s=5)
    assert r["passed"] == 0 and {x["status"] for x in r["results"]} == {"unsupported"}
    assert "{'input': str, 'output': str}" in r["results"][0]["detail"] and "inputs" in r["results"][0]["detail"]

@needs_sandbox
def test_the_service_refuses_an_unknown_allowed_package(capsys):
    from grpo_nb.rewards import serve_cli
    assert serve_cli(["--port", "0", "--packages", "grpo_no_such_pkg"]) == 2
    assert "not installed" in capsys.readouterr().err
