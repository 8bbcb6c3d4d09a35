"""Layouts that cannot run are refused by `grpo_nb train` before Ray or any GPU is touched: exit status 2, one error line
naming the fix, no traceback, and no claim about checkpoints (nothing started)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    from grpo_nb.tiny import build_tiny_model
    d = tmp_path_factory.mktemp("refusals")
    (d / "p.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    return build_tiny_model("tiny-untied"), d


@pytest.mark.parametrize("extra, says", [
    (["--rollout.num_engines=2"], "the layout cannot be placed: 2 learner GPU(s) + 2 engine(s) × 2 GPU(s) = 6 GPUs"),
    (["--cluster.gpus_per_node=8"], "idle"),
    (["--rollout.tensor_parallel_size=3"], "TP=3 cannot split 2 query heads and 2 KV heads"),   # named before any placement advice
])
def test_a_layout_that_cannot_run_is_refused_before_anything_starts(model_and_data, tmp_path, extra, says):
    model, d = model_and_data
    r = subprocess.run([sys.executable, "-m", "grpo_nb.cli", "train", "scale-7b-4gpu-split", f"--model.name_or_path={model}",
                        f"--data.train_path={d / 'p.jsonl'}", f"--logging.output_dir={tmp_path / 'run'}", *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})
    assert r.returncode == 2, r.stderr[-2000:]
    assert says in r.stderr and "Fix:" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "checkpoint is kept" not in r.stderr
