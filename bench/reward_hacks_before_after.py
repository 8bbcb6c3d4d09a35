"""Score the reward-hacking programs of tests/hacks/ with the sandbox harness before issue 21.9 and with today's.

    .venv/bin/python bench/reward_hacks_before_after.py [--before 9510a1a]

The earlier harness is read out of git history into a temporary directory, so this needs a clone with history.
Each program defines a wrong `add` plus one attack on the harness; an honest scorer gives every one 0/2.
"""
import argparse, importlib.util, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["assert add(2, 3) == 5", "assert add(10, 20) == 30"]

def load_sandbox_at(commit:str, where:Path):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:grpo_nb/sandbox.py"], check=True, capture_output=True, text=True).stdout
    path = where / "sandbox_before.py"; path.write_text(src)
    spec = importlib.util.spec_from_file_location("sandbox_before", path); mod = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = mod; spec.loader.exec_module(mod)
    return mod

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--before", default="9510a1a"); a = ap.parse_args()
    from grpo_nb import sandbox as now
    with tempfile.TemporaryDirectory() as d:
        before = load_sandbox_at(a.before, Path(d))
        rows = []
        for p in sorted((ROOT / "tests" / "hacks").glob("*.py")):
            b = before.run_tests(p.read_text(), TESTS, timeout_s=5); n = now.run_tests(p.read_text(), TESTS, timeout_s=5)
            rows.append((p.stem, b["passed"], n["passed"]))
            print(f"{p.stem:28s} harness at {a.before}: {b['passed']}/{b['total']}   harness now: {n['passed']}/{n['total']}", flush=True)
    print(f"scored 2/2 at {a.before}: {sum(r[1] == 2 for r in rows)} of {len(rows)}; now: {sum(r[2] == 2 for r in rows)} of {len(rows)}")
