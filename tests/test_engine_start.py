"""bench/engine_start.py refuses what it cannot time, before starting any engine."""
import subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "engine_start.py"), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_bad_arguments_are_named_with_the_fix(tmp_path):
    r = run("--repeats", "0", "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "--repeats must be at least 1" in r.stderr
    r = run("--model", str(tmp_path), "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "no config.json there. Fix: a local HF checkpoint directory" in r.stderr
    assert not (tmp_path / "x.json").exists()
