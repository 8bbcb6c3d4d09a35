"""Errors in a run's prompts are refused by `grpo_nb train` before any work: a row without its prompt before Ray starts,
and prompts of which none fits `data.max_prompt_tokens` (found only by tokenizing them, which overlaps Ray's and the
engines' start) before any engine loads or learner starts. Exit status 2, one error line naming the fix, no traceback,
no claim about checkpoints, Ray shut down and no metrics written."""
import contextlib, io, json


def test_no_prompt_that_fits_is_refused_before_any_engine_loads(tmp_path, monkeypatch):
    "No prompt fits `data.max_prompt_tokens`: the tokens say so, and the run stops before its engines load and its learners start."
    import ray
    from grpo_nb.trainer import train_cli
    monkeypatch.setenv("RAY_ADDRESS", "")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = train_cli(["demo", "--data.max_prompt_tokens=1", "--checkpoint.resume=none", f"--logging.output_dir={tmp_path / 'run'}"])
    text = err.getvalue()
    assert rc == 2, text[-2000:]
    assert "has no usable prompts" in text and "Fix: --data.max_prompt_tokens=<larger>" in text, text[-2000:]
    assert "Traceback" not in text and "checkpoint is kept" not in text
    assert not ray.is_initialized()   # what the start had begun is shut down
    assert not list((tmp_path / "run").glob("**/metrics.jsonl")) and not list((tmp_path / "run").glob("**/engine*_load.log"))


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
