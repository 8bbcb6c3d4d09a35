"""bench/gpu_session.sh, the script that runs the GPU benchmarks in lanes: it parses, every lane its header names exists,
and every benchmark option a lane passes is one its script accepts (the GPU runs themselves happen on GPU nodes)."""
import re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_session.sh"


def test_parses_and_names_only_lanes_it_has():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    text = SCRIPT.read_text()
    header = " ".join(l for l in text.splitlines()[:8] if l.startswith("#"))
    named = set(re.findall(r"\b(s7\w+|mfu\w*|tp2|coloc\w*|split01\w*|single1|trl\w+|ws\w+01|ipc0|sc2|verl\d\w*)\b", header.split("lanes:", 1)[1]))
    defined = set(re.findall(r"^lane_(\w+)\(\)", text, flags=re.M))
    assert named and named <= defined, named - defined


def _help(script:str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT).stdout


def test_four_gpu_lanes_pass_options_their_scripts_accept():
    text = re.sub(r"\\\n\s*", " ", SCRIPT.read_text())   # continuation lines joined: a lane's options on its second line are checked too
    for script, pattern in (("scale_4gpu.py", r"^lane_s7\w+\(\) \{ scale \w+ \d+ (.*); \}$"),
                            ("learner_mfu.py", r"^lane_mfu(?:7b\d\w*|olmo2)\(\) .*learner_mfu\.py (.*?);"),
                            ("tp2_gpu.py", r"^\s*run tp2_gpu \d+ [\d,]+ python3 bench/tp2_gpu\.py (.*?);")):
        accepted = set(re.findall(r"(--[\w-]+)", _help(script)))
        lines = re.findall(pattern, text, flags=re.M)
        assert lines, script
        for line in lines:
            assert set(re.findall(r"(--[\w-]+)", line)) <= accepted, (script, line)


def test_benchmarks_named_on_one_gpu_run_one_after_the_other(tmp_path):
    """Lanes run at once; two that name the same GPU (two one-GPU lanes on a one-GPU node) must not time each other's work.
    The script's own `run` function, taken out of it, runs two benchmarks on GPU 0 and one on GPU 1 at once: those on GPU 0
    never overlap, the one on GPU 1 overlaps them, and each benchmark's exit status is logged."""
    text = SCRIPT.read_text()
    fn = re.search(r"^run\(\) \{.*?^\}", text, flags=re.M | re.S).group(0)
    (tmp_path / "logs").mkdir()
    bench = 'echo "$1 start $(date +%s.%N) $CUDA_VISIBLE_DEVICES" >> "$OUT/marks"; sleep 1; echo "$1 end $(date +%s.%N)" >> "$OUT/marks"; exit $2'
    script = f"""set -u\nOUT={tmp_path}\n{fn}\nb() {{ {bench}; }}\nexport -f b; export OUT
run a 20 0 bash -c 'b a 0' & run b 20 0 bash -c 'b b 3' & run c 20 1 bash -c 'b c 0' & wait\n"""
    assert subprocess.run(["bash", "-c", script], timeout=60).returncode == 0
    marks = {}
    for line in (tmp_path / "marks").read_text().splitlines():
        name, what, t = line.split()[:3]; marks.setdefault(name, {})[what] = float(t)
    (s0, e0), (s1, e1) = sorted((marks[n]["start"], marks[n]["end"]) for n in "ab")
    assert e0 <= s1, marks                                     # GPU 0: one after the other
    assert marks["c"]["start"] < e0 and marks["c"]["end"] > s0, marks   # GPU 1: beside them
    log = (tmp_path / "logs" / "session.log").read_text()
    assert "end b rc=3" in log and "end a rc=0" in log and "waiting for them" in log, log


def test_a_node_without_liger_kernel_is_refused_before_any_benchmark(tmp_path):
    """requirements/gpu.txt installs liger-kernel; a node without it would measure every learner with unfused kernels (slower,
    more memory) and record that as the default. The session stops before its first benchmark and says how to bring it."""
    import os, pytest
    if subprocess.run(["python3", "-c", "import liger_kernel"], capture_output=True).returncode == 0: pytest.skip("liger-kernel is installed here")
    env = {k: v for k, v in os.environ.items() if k != "NO_LIGER"} | {"GPUWORK": str(tmp_path / "work"), "SITE": str(tmp_path / "site"),
                                                                       "STAGE": str(tmp_path / "no-stage")}
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "colocb"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "liger-kernel is not installed" in r.stdout and "pip download liger-kernel" in r.stdout, r.stdout + r.stderr
    assert "start " not in r.stdout and not (tmp_path / "work" / "e2e").exists()   # no benchmark began
