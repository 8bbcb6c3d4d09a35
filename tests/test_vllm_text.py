"""The text of a vLLM engine's completions: decoded once at the end (`detokenize="auto"`) it is the text vLLM's own
detokenizer gives (`detokenize="engine"`), on a real vLLM engine (CPU build), in a process of its own."""
import json, os, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CODE = r"""
import json, os
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from grpo_nb.tiny import tiny_model_dir
from grpo_nb.rollout import VllmEngine, SamplingSpec
eng = VllmEngine(tiny_model_dir("tiny-arith"), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_num_seqs=32)
prompts = [eng.tokenizer.encode(p) for p in ("12+7=", "3+4=", "40+2=")]
out = {}
for mode in ("auto", "engine"):
    eng.detokenize = mode
    for name, spec in (("free", SamplingSpec(n=4, max_new_tokens=24, temperature=1.0, seed=3)),
                       ("stop", SamplingSpec(n=4, max_new_tokens=24, temperature=1.0, seed=3, stop=["5"]))):
        s = eng.generate(prompts, spec)
        out[f"{mode}/{name}"] = [[x.completion_ids, x.text] for x in s]
eng.close()
print("RESULT " + json.dumps(out))
"""


def test_late_decoding_gives_vllms_text():
    pytest.importorskip("vllm")
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, r.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    assert out["auto/free"] == out["engine/free"]   # same tokens (same seeds), same text
    assert out["auto/stop"] == out["engine/stop"]   # stop strings: vLLM's running text either way
    assert any(text for _, text in out["auto/free"]) and len({tuple(ids) for ids, _ in out["auto/free"]}) > 1
