"""Score the reward-hacking programs of tests/hacks/ with an earlier sandbox harness and with today's.

    .venv/bin/python bench/reward_hacks_before_after.py [--before a820096]

The earlier harness is read out of git history into a temporary directory, so this needs a clone with history.
Each program is a wrong solution plus one attack on the scorer; its docstring may name its own tests (`# tests:`),
setup code (`# setup:`) and an honest wrong program (`# wrong:`), as tests/test_reward_hacking.py reads them. An
honest scorer gives each attack what it gives the honest wrong program. Only the earlier `run_tests` and its harness are
loaded from history: the sandbox processes (fork server, supervisor, init) come from the installed package, so the
earlier column already has today's file system (the training-data attack, 24, scores 0 in both).
"""
import argparse, importlib.util, json, re, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = {"tests": ["assert add(2, 3) == 5", "assert add(10, 20) == 30"], "setup": "", "wrong": "def add(a, b):\n    return a * b + 7\n"}

def spec_of(path:Path) -> dict:
    out = dict(DEFAULT)
    for key, value in re.findall(r"^# (tests|setup|wrong): (.*)$", path.read_text(), re.M): out[key] = json.loads(value)
    return out

def load_sandbox_at(commit:str, where:Path):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:grpo_nb/sandbox.py"], check=True, capture_output=True, text=True).stdout
    path = where / "sandbox_before.py"; path.write_text(src)
    spec = importlib.util.spec_from_file_location("sandbox_before", path); mod = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = mod; spec.loader.exec_module(mod)
    return mod

def score(mod, program:str, s:dict) -> int:
    try: return mod.run_tests(program, s["tests"], timeout_s=3, setup=s["setup"])["passed"]
    except ValueError: return 0   # an earlier harness refused the test list outright

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--before", default="a820096"); a = ap.parse_args()
    from grpo_nb import sandbox as now
    with tempfile.TemporaryDirectory() as d:
        before = load_sandbox_at(a.before, Path(d))
        rows = []
        for p in sorted((ROOT / "tests" / "hacks").glob("*.py")):
            s = spec_of(p)
            b, n = score(before, p.read_text(), s), score(now, p.read_text(), s)
            wb, wn = score(before, s["wrong"], s), score(now, s["wrong"], s)
            rows.append((p.stem, b > wb, n > wn))
            print(f"{p.stem:28s} at {a.before}: {b}/{len(s['tests'])} (honest wrong: {wb})   now: {n}/{len(s['tests'])} (honest wrong: {wn})", flush=True)
    print(f"attacks that beat the honest wrong program at {a.before}: {sum(r[1] for r in rows)} of {len(rows)}; now: {sum(r[2] for r in rows)} of {len(rows)}")
