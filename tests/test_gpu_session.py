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
