"""Layouts that cannot run are refused by `grpo_nb train` before Ray or any GPU is touched: exit status 2, one error line
naming the fix, no traceback, and no claim about checkpoints (nothing started)."""
import json
import pytest


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
def test_a_layout_that_cannot_run_is_refused_before_anything_starts(model_and_data, tmp_path, monkeypatch, extra, says):
    "In this process, as `grpo_nb train` runs it (the subprocess would only add the imports): exit status 2, and Ray never started."
    import contextlib, io
    import ray
    from grpo_nb.trainer import train_cli
    model, d = model_and_data
    monkeypatch.setenv("RAY_ADDRESS", "")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = train_cli(["scale-7b-4gpu-split", f"--model.name_or_path={model}", f"--data.train_path={d / 'p.jsonl'}",
                        f"--logging.output_dir={tmp_path / 'run'}", "--cluster.ray_address=auto", *extra])   # as in a job whose Ray has the GPUs:
    # a local start on this GPU-less machine would be refused first, for the GPUs it lacks (tests/test_trainer.py)
    assert rc == 2, err.getvalue()[-2000:]
    assert says in err.getvalue() and "Fix:" in err.getvalue(), err.getvalue()[-2000:]
    assert "Traceback" not in err.getvalue() and "checkpoint is kept" not in err.getvalue()
    assert not ray.is_initialized()
