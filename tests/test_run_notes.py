"""A run's notes (liger-kernel missing under `model.kernels=auto`, the planner's advice) reach the user when the run
starts, on standard error, and stay in its summary's `events`. They exist only on GPU layouts, so the planner's part is
replaced here: what is checked is that `Run.check` says each note at once."""
import contextlib, io


def test_a_runs_notes_are_said_at_its_start_and_kept_in_its_events(tmp_path, monkeypatch):
    import grpo_nb.trainer as T
    from grpo_nb.config import load_config, validate
    from grpo_nb.models import resolve_model
    cfg = validate(load_config("demo", [f"--logging.output_dir={tmp_path / 'run'}", "--checkpoint.resume=none"]))
    cfg.model.name_or_path = resolve_model(cfg.model.name_or_path)
    note = "model.kernels=auto: liger-kernel is not installed, so the learner runs the model's own kernels. Fix: pip install liger-kernel"
    seen = []
    monkeypatch.setattr(T, "plan_notes", lambda cfg, device: seen.append(device) or [note])
    run, err = T.Run(cfg), io.StringIO()
    with contextlib.redirect_stderr(err): run.check()   # the checks before Ray: nothing is started
    assert seen == [run.layout.device]
    assert err.getvalue() == f"grpo_nb train: note: {note}\n"
    assert run.events[-1] == note
