"""Errors in a run's prompts are refused by `grpo_nb train` before any step: a row without its prompt before Ray starts,
and prompts of which none fits `data.max_prompt_tokens` (found only by tokenizing them: before Ray when their tokens are
cached, otherwise once Ray is up, while the engines start). Exit status 2, one error line naming the fix, no traceback, no
claim about checkpoints, Ray shut down and no metrics written."""
import contextlib, io, json


def test_no_prompt_that_fits_is_refused_and_nothing_is_trained(tmp_path, monkeypatch):
    """No prompt fits `data.max_prompt_tokens`: the tokens say so, exit 2, no step, and whatever the start had begun is shut
    down (on a cold prompt cache the tokens are made once Ray is up; page 08's examples show where the error is raised)."""
    import ray
    from grpo_nb.trainer import train_cli
    from grpo_nb.tiny import default_cache_dir, tiny_model_dir
    tiny_model_dir("tiny-arith", warm_steps=100)   # the demo's policy, built once and shared; the prompts' cache starts empty
    cache = tmp_path / "cache"; cache.mkdir(); (cache / "tiny").symlink_to(default_cache_dir() / "tiny", target_is_directory=True)
    monkeypatch.setenv("GRPO_NB_CACHE", str(cache))
    monkeypatch.setenv("RAY_ADDRESS", "")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = train_cli(["demo", "--data.max_prompt_tokens=1", "--checkpoint.resume=none", f"--logging.output_dir={tmp_path / 'run'}"])
    text = err.getvalue()
    assert rc == 2, text[-2000:]
    assert "has no usable prompts" in text and "Fix: --data.max_prompt_tokens=<larger>" in text, text[-2000:]
    assert "Traceback" not in text and "checkpoint is kept" not in text
    assert not ray.is_initialized()   # what the start had begun is shut down
    assert not list((tmp_path / "run").glob("**/metrics.jsonl"))
    assert list((cache / "prompts").glob("*.json"))   # tokenized here (cold), not read from a cache: the error came from the start's wait


def test_a_row_without_its_prompt_is_refused_before_ray(tmp_path, monkeypatch):
    "A row that lacks the prompt key is named when the rows are read, before Ray starts."
    import ray
    from grpo_nb.trainer import train_cli
    monkeypatch.setenv("RAY_ADDRESS", "")
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"question": "2+2=", "answer": "4"}) + "\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = train_cli(["demo", f"--data.train_path={data}", "--checkpoint.resume=none", f"--logging.output_dir={tmp_path / 'run'}"])
    text = err.getvalue()
    assert rc == 2 and "data.train_path: row 2 of" in text and "lacks 'prompt'" in text and "Fix: complete or drop that row" in text, text[-2000:]
    assert "Traceback" not in text
    assert not ray.is_initialized()
