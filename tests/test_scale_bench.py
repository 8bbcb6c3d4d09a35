"""bench/scale_4gpu.py's TRL side and bench/scale_report.py, on CPU: the commands and configs a 4-GPU run would use,
the merging of TRL's run into our records, and what the pages render with and without TRL numbers."""
import json, runpy, subprocess, sys, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import scale_4gpu as S   # noqa: E402
import common as COMMON   # noqa: E402

REPORT = runpy.run_path(str(ROOT / "bench" / "scale_report.py"))
PORTS = {"server": 8000, "group": 51216, "main": 29500}


def _plan(layout, tmp_path, micro=S.TRL_MICRO):
    sh = S.preset_work(layout, 10, 2)
    return sh, S.trl_plan(S.PEERS[layout], tmp_path / "model", tmp_path / "p.jsonl", sh, tmp_path, micro, PORTS)


def test_both_sides_get_the_presets_work(tmp_path):
    for layout in ("split", "colocated"):
        sh, plan = _plan(layout, tmp_path)
        assert (sh["prompts"], sh["G"], sh["prompt_len"], sh["gen"]) == (16, 8, 512, 1024)   # the preset's step
        g, n = plan["spec"]["grpo"], S.TRL_ROLES[S.PEERS[layout]]["processes"]
        assert g["per_device_train_batch_size"] * n * g["gradient_accumulation_steps"] == sh["prompts"] * sh["G"]
        assert (g["num_generations"], g["max_completion_length"], g["max_steps"]) == (sh["G"], sh["gen"], sh["steps"])
        over = S.ours_overrides(tmp_path / "model", tmp_path / "p.jsonl", tmp_path, sh, False, "4x NVIDIA H100")
        for flag in (f"--rollout.prompts_per_step={sh['prompts']}", f"--rollout.num_samples_per_prompt={sh['G']}",
                     f"--rollout.max_new_tokens={sh['gen']}", f"--total_steps={sh['steps']}"):
            assert flag in over
        assert plan["accelerate"]["distributed_type"] == "DEEPSPEED" and plan["accelerate"]["deepspeed_config"]["zero_stage"] == 3
        assert plan["accelerate"]["num_processes"] == n and plan["spec"]["model_dir"] == str(tmp_path / "model")


def test_server_mode_beside_split(tmp_path):
    sh, plan = _plan("split", tmp_path)
    srv, tr, g = plan["server"], plan["trainer"], plan["spec"]["grpo"]
    assert srv["env"] == {"CUDA_VISIBLE_DEVICES": "2,3"} and tr["env"] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    c = srv["cmd"]
    assert c[c.index("vllm-serve") + 1:c.index("vllm-serve") + 3] == ["--model", str(tmp_path / "model")]
    assert c[c.index("--tensor-parallel-size") + 1] == "2" and c[c.index("--port") + 1] == "8000"
    assert c[c.index("--gpu-memory-utilization") + 1] == str(sh["gpu_memory_utilization"])
    assert (g["vllm_mode"], g["vllm_server_port"], g["vllm_group_port"]) == ("server", 8000, 51216)
    t = tr["cmd"]
    assert t[1:3] == ["-m", "accelerate.commands.launch"] and t[t.index("--num_processes") + 1] == "2"
    assert t[t.index("--config_file") + 1] == plan["accelerate_path"] and t[-2:] == ["--trl-child", plan["spec_path"]]


def test_colocate_mode_beside_colocated(tmp_path):
    sh, plan = _plan("colocated", tmp_path)
    g = plan["spec"]["grpo"]
    assert plan["server"] is None and plan["trainer"]["env"] == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert plan["trainer"]["cmd"][plan["trainer"]["cmd"].index("--num_processes") + 1] == "4"
    assert (g["vllm_mode"], g["vllm_tensor_parallel_size"], g["vllm_gpu_memory_utilization"]) == ("colocate", 1, sh["gpu_memory_utilization"])
    assert "vllm_server_port" not in g


def test_a_micro_batch_that_does_not_divide_the_step_names_the_ones_that_do(tmp_path):
    with pytest.raises(ValueError, match=r"use one of \[1, 2, 4, 8, 16, 32, 64\]"): _plan("split", tmp_path, micro=7)


def _child(n, step=2.0):
    return {"version": "1.16.0", "steps": [{"step": step + i % 2, "generation": 1.0, "sync": 0.25} for i in range(n)], "args_dropped": []}


def test_trl_fields_and_the_merge_keep_our_record(tmp_path):
    _, plan = _plan("split", tmp_path)
    ours = {"model": "Qwen2.5-7B", "layout": "split", "step_mean_s": 1.25, "exact_sync": True, "trl_backend": None, "trl_step_mean_s": None}
    trl = S.trl_fields("trl:vllm-server", _child(10), 2, {0: 1024, 1: 2048, 2: 4096, 3: 4096}, plan)
    assert trl["trl_timed_steps"] == 8 and trl["trl_step_mean_s"] == 2.5 and trl["trl_step_p90_s"] == 3.0 and trl["trl_error"] is None
    assert trl["trl_peak_gib_measured"] == [1.0, 2.0, 4.0, 4.0] and trl["trl_version"] == "1.16.0"
    assert trl["trl_split_s"]["sync"] == 0.25 and trl["trl_split_s"]["generation"] == 0.75   # the sync runs inside the generation call
    assert "vllm_server_port" not in trl["trl_args"] and any("vllm-serve" in c for c in trl["trl_commands"])
    rec = S.merge_trl(ours, trl)
    assert rec["speedup_mean"] == 2.0 and rec["exact_sync"] and rec["step_mean_s"] == 1.25
    failed = S.trl_fields("trl:vllm-server", None, 2, {}, plan, "TRL trainer exited 1: ValueError: boom")
    again = S.merge_trl(rec, failed)   # a later failed run replaces the TRL keys, never ours
    assert again["speedup_mean"] is None and again["trl_step_mean_s"] is None and "boom" in again["trl_error"]
    assert again["exact_sync"] and again["step_mean_s"] == 1.25
    assert S.merge_trl({**ours, "rc": 1}, trl)["speedup_mean"] is None   # no speed-up against a run of ours that failed
    cut = S.trl_fields("trl:vllm-server", _child(5), 2, {}, plan)   # stopped by its time limit: its steps stay, and it says so
    assert cut["trl_timed_steps"] == 3 and "after 5 of 10 steps" in cut["trl_error"] and not cut["trl_complete"] and trl["trl_complete"]


def test_skip_ours_needs_our_records_on_the_same_gpus(tmp_path):
    H100, H200 = "4x NVIDIA H100 80GB HBM3", "4x NVIDIA H200"
    recs = [{"model": "Qwen2.5-7B", "layout": "split", "step_mean_s": 1.0, "device": H100}, {"model": "OLMo-2-7B", "layout": "split", "device": H100},
            {"model": "Qwen2.5-7B", "layout": "split", "step_mean_s": 0.8, "device": H200}]
    keep, ours = S.existing_records(recs, [("Qwen2.5-7B", "split")], True, H100)
    assert keep == [recs[1], recs[2]] and ours == {("Qwen2.5-7B", "split"): recs[0]}   # the H200 record is kept beside, never merged into
    with pytest.raises(SystemExit, match="none on .* for: Qwen2.5-7B colocated"):
        S.existing_records(recs, [("Qwen2.5-7B", "split"), ("Qwen2.5-7B", "colocated")], True, H100)
    with pytest.raises(SystemExit, match=r"only on 4x NVIDIA H200.*same GPUs"):   # TRL on H100 against our H200 run: refused
        S.existing_records(recs[2:], [("Qwen2.5-7B", "split")], True, H100)
    keep, ours = S.existing_records(recs, [("Qwen2.5-7B", "split")], False, H200)   # a new run of ours replaces only its own GPUs' record
    assert keep == recs[:2] and ours == {("Qwen2.5-7B", "split"): recs[2]}


def _script(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "scale_4gpu.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_dry_run_prints_every_command_and_config(tmp_path):
    r = _script("--layouts", "split,colocated", "--dry-run", "--out", str(tmp_path / "none.json"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("grpo_nb train scale-7b-4gpu-") == 2 and r.stdout.count("accelerate.commands.launch") == 2
    assert "CUDA_VISIBLE_DEVICES=2,3" in r.stdout and "vllm-serve" in r.stdout and r.stdout.count("zero_stage: 3") == 2
    assert not (tmp_path / "none.json").exists()
    r = _script("--layouts", "split", "--peers", "", "--dry-run")
    assert r.returncode == 0 and "accelerate" not in r.stdout
    for bad, says in ((["--peers", "trl:nope"], "use a comma-separated subset"), (["--trl-micro-batch", "7"], "use one of"),
                      (["--layouts", "tp4"], "--layouts: unknown")):
        r = _script("--dry-run", *bad)
        assert r.returncode != 0 and says in r.stderr, r.stderr


def test_set_adds_overrides_on_top_of_the_preset(tmp_path):
    r = _script("--layouts", "colocated", "--peers", "", "--set", "learner.pack_length=49152", "--dry-run")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("ours:"))
    assert line.endswith("--learner.pack_length=49152")   # after the benchmark's own overrides, so it wins
    for bad in ("pack_length", "--learner.pack_length=1"):
        r = _script("--dry-run", f"--set={bad}")
        assert r.returncode != 0 and "give KEY=VALUE" in r.stderr, r.stderr


def test_skip_ours_merges_trl_into_the_file(tmp_path, monkeypatch):
    out = tmp_path / "scale.json"
    other = {"model": "OLMo-2-7B", "layout": "split", "step_mean_s": 3.0}
    ours = {"model": "Qwen2.5-7B", "layout": "split", "step_mean_s": 1.25, "exact_sync": True, "time": "then", "device": "4x NVIDIA H200"}
    out.write_text(json.dumps({"records": [other, ours]}))
    (tmp_path / "models" / "Qwen2.5-7B").mkdir(parents=True); (tmp_path / "models" / "Qwen2.5-7B" / "config.json").write_text("{}")
    def fake_run_trl(layout, model_dir, sh, tmp, timeout, logs, micro, model):   # stands in for the 4-GPU run only
        _, plan = _plan(layout, tmp)
        return S.trl_fields(S.PEERS[layout], _child(sh["steps"]), sh["warmup"], {}, plan)
    monkeypatch.setattr(S, "run_trl", fake_run_trl)
    monkeypatch.setattr(S, "gpus_here", lambda: "4x NVIDIA H200")   # the GPUs our record was measured on
    monkeypatch.setattr(sys, "argv", ["scale_4gpu.py", "--layouts", "split", "--skip-ours", "--out", str(out), "--models-dir", str(tmp_path / "models")])
    S.main()
    recs = json.loads(out.read_text())["records"]
    assert recs[0] == other and len(recs) == 2
    r = recs[1]
    assert r["time"] == "then" and r["device"] == "4x NVIDIA H200" and r["exact_sync"]   # ours as it was
    assert r["trl_backend"] == "trl:vllm-server" and r["speedup_mean"] == 2.0 and "trl_time" in r


def test_rerun_of_ours_keeps_trls_run_paired(tmp_path, monkeypatch):
    # ours run again (another pack, say) without a TRL run: TRL's earlier run of the same model, layout and GPUs stays in the record
    out = tmp_path / "scale.json"
    before = {"model": "OLMo-2-7B", "layout": "colocated", "step_mean_s": 25.0, "rc": 0, "device": "4x NVIDIA H100",
              "trl_backend": "trl:vllm-colocate", "trl_step_mean_s": None, "trl_error": "NotImplementedError: meta tensor", "speedup_mean": None}
    out.write_text(json.dumps({"records": [before]}))
    monkeypatch.setattr(S, "run_one", lambda model, layout, *a, **k: {"model": model, "layout": layout, "step_mean_s": 20.0, "rc": 0})
    monkeypatch.setattr(S, "gpus_here", lambda: "4x NVIDIA H100")
    monkeypatch.setattr(sys, "argv", ["scale_4gpu.py", "--models", "OLMo-2-7B", "--layouts", "colocated", "--peers", "", "--out", str(out),
                                      "--models-dir", str(tmp_path / "models")])
    S.main()
    (r,) = json.loads(out.read_text())["records"]
    assert r["step_mean_s"] == 20.0 and r["trl_backend"] == "trl:vllm-colocate" and r["trl_error"].startswith("NotImplementedError")
    assert r["speedup_mean"] is None


def test_report_without_trl_says_not_measured(tmp_path):
    f = tmp_path / "scale.json"
    f.write_text(json.dumps({"records": [{"model": "Qwen2.5-7B", "layout": "split", "gpus": 4, "tp": 2, "learners": 2, "engines": 1, "rc": 0,
                                          "step_mean_s": 1.25, "exact_sync": True, "device": "4x NVIDIA H200"}]}))
    assert "TRL" not in REPORT["scale_table"](f) and "TRL" not in REPORT["memory_table"](f)
    assert any("not measured (no TRL run on these GPUs yet)" in v for v in REPORT["verdicts"](f))
    assert "4× H200: 2 + 1 × 2" in REPORT["scale_table"](f)


def test_committed_records_pair_each_trl_run_with_ours_on_the_same_gpus():
    for r in REPORT["records"](ROOT / "bench" / "results" / "scale_4gpu.json"):
        if r.get("speedup_mean"): assert r.get("trl_device") == r.get("device"), r["device"]


def test_report_with_trl(tmp_path):
    _, plan = _plan("split", tmp_path)
    base = {"model": "Qwen2.5-7B", "gpus": 4, "tp": 2, "learners": 2, "engines": 1, "rc": 0, "step_mean_s": 1.25, "step_median_s": 1.2,
            "step_p90_s": 1.4, "exact_sync": True, "peak_gib_measured": [70.0] * 4, "peak_gib_planned": [72.0] * 4, "device": "4x NVIDIA H100 80GB HBM3"}
    measured = S.merge_trl({**base, "layout": "split"}, S.trl_fields("trl:vllm-server", _child(10), 2, {i: 40960 for i in range(4)}, plan))
    failed = S.merge_trl({**base, "layout": "colocated"}, S.trl_fields("trl:vllm-colocate", None, 2, {}, plan, "Traceback\ntorch.OutOfMemoryError: CUDA out of memory | x"))
    none = {**base, "model": "OLMo-2-7B", "layout": "split"}
    cut = S.merge_trl({**base, "model": "OLMo-2-7B", "layout": "colocated"}, S.trl_fields("trl:vllm-colocate", _child(5), 2, {}, plan))
    p = tmp_path / "scale.json"; p.write_text(json.dumps({"records": [measured, failed, none, cut]}))
    rows = REPORT["scale_table"](p).splitlines()
    assert "TRL ÷ ours (mean)" in rows[0] and all(r.count("|") == rows[0].count("|") for r in rows)
    assert "| vllm-server | 2.50 / 2.50 / 3.00 | 2.00× |" in rows[2]
    assert "failed: torch.OutOfMemoryError: CUDA out of memory / x" in rows[3] and "| not measured |" in rows[4]
    assert "(3 timed steps; the run stopped) | 1.87× |" in rows[5]
    mem = REPORT["memory_table"](p).splitlines()
    assert "TRL measured peak (GiB)" in mem[0] and mem[2].endswith("| 40.0 |") and mem[-1].endswith("| not measured |")
    assert all(l.endswith("| its run failed |") for l in mem if "| colocated |" in l and "Qwen2.5-7B" in l)   # no peak shown for a peer that never stepped
    split = REPORT["split_table"](p)
    assert "| Qwen2.5-7B | split: TRL vllm-server | 4× H100 | 2.50 | 0.75 | — | 1.50 | 0.25 |" in split
    v = REPORT["verdicts"](p)
    assert "Qwen2.5-7B split on 4× H100: ≥1.5× TRL by mean step time: 2.00× (TRL vllm-server 2.50 s, ours 1.25 s): met." in v
    assert any("colocated on 4× H100: ≥1.2× TRL by mean step time: not measured: TRL vllm-colocate failed (torch.OutOfMemoryError" in x for x in v)
    assert any(x.startswith("OLMo-2-7B split on 4× H100: ≥1.5× TRL") and "no TRL run" in x for x in v)
    assert any(x.startswith("OLMo-2-7B colocated on 4× H100: ≥1.2× TRL") and "TRL stopped after 3 timed steps): met." in x for x in v)


def test_gap_lines_put_each_phase_beside_trls_and_say_how_far_the_target_is(tmp_path):
    _, plan = _plan("colocated", tmp_path)
    base = {"model": "Qwen2.5-7B", "gpus": 4, "tp": 1, "learners": 4, "engines": 4, "rc": 0, "step_mean_s": 2.0, "device": "4x NVIDIA H100 80GB HBM3",
            "time_split": {"time/generation": 0.8, "time/learner": 0.6, "time/sync": 0.05, "time/verify": 0.3, "time/sleep": 0.05, "time/wake": 0.2,
                           "time/release": 0.15}}
    coloc = S.merge_trl({**base, "layout": "colocated"}, S.trl_fields("trl:vllm-colocate", _child(10), 2, {}, plan, "TRL trainer exited timeout"))
    split = S.merge_trl({**base, "layout": "split", "time_split": {**base["time_split"], "time/generation": 0.01, "time/generation_engine": 0.55}},
                        S.trl_fields("trl:vllm-colocate", _child(10), 2, {}, plan))
    p = tmp_path / "scale.json"; p.write_text(json.dumps({"records": [coloc, split, {**base, "layout": "split", "model": "OLMo-2-7B"}]}))
    c, s = REPORT["gap_lines"](p)   # the record without TRL has no line
    assert "Generation 0.80 s against 0.75 s; learner 0.60 s against TRL's learner and the rest 1.50 s; sync 0.05 s against 0.25 s" in c
    assert "with no counterpart in TRL: the bit-exact check 0.30 s, sleep 0.05 s, wake 0.20 s (of which the learners' cache release 0.15 s)" in c
    assert c.endswith("The 1.2× target (2.08 s) is met with 0.08 s to spare.")
    assert "Generation (0.55 s on the engine) runs beside our learner, one step ahead, and the loop waited 0.01 s for it, where TRL waited 0.75 s" in s and "At 1.5× TRL a step would take 1.67 s: 0.33 s less than ours." in s
    assert "(all steps; its process then outlived the time limit)" in REPORT["scale_table"](p)
    slow = tmp_path / "slow.json"; slow.write_text(json.dumps({"records": [{**coloc, "step_mean_s": 3.0}, {**coloc, "step_mean_s": 3.0, "time_split": {**coloc["time_split"], "time/learner": 1.5}}]}))
    over, under = REPORT["gap_lines"](slow)
    assert over.endswith("2.08 s: 0.92 s less than ours. Generation and the learner alone take 1.40 s, less than that: the overhead is what stands between.")
    assert under.endswith("Generation and the learner alone take 2.30 s, more than that: no cut in the overhead reaches the target without a faster learner or engine.")
    assert REPORT["unmeasured"](p) == ["OLMo-2-7B split: ours measured; TRL vllm-server beside it not yet",
                                       "OLMo-2-7B colocated: not measured yet (neither ours nor TRL vllm-colocate)"]


def test_the_reports_layouts_are_the_benchmarks():
    "scale_report.py stays free of the benchmark's imports, so it names the layouts and their TRL modes itself: they must agree."
    assert REPORT["LAYOUTS"] == {k: v.removeprefix("trl:") for k, v in S.PEERS.items()}


def test_trl_is_stopped_once_its_steps_are_written_and_it_hangs(tmp_path):
    out = tmp_path / "steps.json"
    hang = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        t0 = time.monotonic()
        assert S.wait_trl(hang, out, 3, t0 + 1.5, grace=0.5, poll_s=0.1) == "timeout"   # nothing written: waits for the deadline
        out.write_text(json.dumps({"steps": [{"step": 1.0}] * 2}))
        assert S.wait_trl(hang, out, 3, time.monotonic() + 1.0, grace=0.2, poll_s=0.1) == "timeout"   # 2 of 3 steps: still running
        out.write_text(json.dumps({"steps": [{"step": 1.0}] * 3}))
        t0 = time.monotonic()
        assert S.wait_trl(hang, out, 3, t0 + 30, grace=0.3, poll_s=0.1) == "done" and time.monotonic() - t0 < 5
    finally: hang.kill(); hang.wait()
    quick = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert S.wait_trl(quick, out, 3, time.monotonic() + 30, grace=30, poll_s=0.1) == 3   # an exit code wins over the grace


def test_startup_lines_name_each_phase_and_vllms_own(tmp_path):
    recs = [{"model": "Qwen2.5-7B", "layout": "split", "device": "4x NVIDIA H100 80GB HBM3",
             "startup_s": {"ray_s": 4.0, "learners_s": 30.0, "engines_ready_s": 90.0, "engine_load_s": 70.0, "total_s": 95.0,
                           "engine_weights_s": 12.5, "engine_graphs_s": 21.0}},
            {"model": "OLMo-2-7B", "layout": "colocated", "device": "4x NVIDIA H100 80GB HBM3", "startup_note": "why",
             "startup_s": {"ray_s": 4.0, "learners_s": None, "total_s": 100.0}},
            {"model": "OLMo-2-7B", "layout": "split", "device": "4x NVIDIA H100 80GB HBM3"}]
    p = tmp_path / "scale.json"; p.write_text(json.dumps({"records": recs}))
    a, b = REPORT["startup_lines"](p)   # a record without start-up phases has no line
    assert a == ("Qwen2.5-7B split on 4× H100: 95.0 s to the first step: Ray 4.0 s, learners 30.0 s, engines ready 90.0 s, vLLM's load 70.0 s "
                 "(vLLM's phases: weights 12.5 s, graphs 21.0 s).")
    assert b == "OLMo-2-7B colocated on 4× H100: 100.0 s to the first step: Ray 4.0 s (vLLM's phases of its load not logged by this run); why."


def test_child_builds_its_grpo_config(tmp_path):
    "Where TRL is installed: every argument the child passes is a GRPOConfig field, and the config builds on CPU."
    trl = pytest.importorskip("trl")
    for layout in ("split", "colocated"):
        _, plan = _plan(layout, tmp_path)
        g = dict(plan["spec"]["grpo"])
        assert not set(g) - set(trl.GRPOConfig.__dataclass_fields__)
        g.update(bf16=False, use_cpu=True)
        cfg = trl.GRPOConfig(**g)
        assert cfg.generation_batch_size == 128 // S.TRL_ROLES[S.PEERS[layout]]["processes"] and cfg.vllm_mode == g["vllm_mode"]


def test_step_times_hold_the_check_that_follows_each_sync():
    lines = [{"time/step": 9.0, "prompt_len_mean": 512.0}] + [{"time/step": 2.0, "time/verify": 0.5, "prompt_len_mean": 512.0}] * 3 + [{"step": 0}]
    f = S.step_fields(lines, warmup=1)
    assert f["step_s_all"] == [9.0, 2.5, 2.5, 2.5] and f["timed_steps"] == 3 and f["step_mean_s"] == 2.5
    assert f["step_mean_without_verify_s"] == 2.0 and f["prompt_tokens_mean"] == 512.0
    assert S.step_fields([{"time/step": 1.0}], warmup=0)["prompt_tokens_mean"] is None   # older metrics: no prompt length logged


def test_replan_recomputes_the_plan_from_each_records_own_config(tmp_path):
    "`--replan` plans each record's preset with its overrides and the model's built-in shape; the run's own figure is kept beside it."
    cmd = ("grpo_nb train scale-7b-4gpu-split --total_steps=10 --data.max_prompt_tokens=520 --rollout.prompts_per_step=16 "
           "--rollout.num_samples_per_prompt=8 --rollout.max_new_tokens=1024 --reward.functions={arith: 1.0} --checkpoint.every_steps=0")
    rec = {"model": "Qwen2.5-7B", "layout": "split", "smoke": False, "command": cmd, "peak_gib_planned": [1.0] * 4}
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({"records": [rec, {"model": "tiny-untied", "layout": "split", "smoke": True, "command": cmd}]}))
    subprocess.run([sys.executable, str(ROOT / "bench/scale_4gpu.py"), "--replan", "--out", str(out)], check=True, cwd=ROOT, timeout=300)
    got = json.loads(out.read_text())["records"]
    assert got[0]["peak_gib_planned_at_run"] == [1.0] * 4
    learners, engines = got[0]["peak_gib_planned"][:2], got[0]["peak_gib_planned"][2:]
    assert len(set(learners)) == 1 and len(set(engines)) == 1 and learners[0] > 60 and engines[0] > 60   # 2 learner GPUs, 2 engine GPUs of 80 GB
    assert "peak_gib_planned" not in got[1]   # a smoke record has no plan to redo


def test_a_replanned_record_shows_the_plan_it_ran_with(tmp_path):
    "After `--replan`, the memory table and the verdict still show how the plan the run was given compared."
    rec = {"model": "Qwen2.5-7B", "layout": "colocated", "device": "4x NVIDIA H100 80GB HBM3", "peak_gib_measured": [69.0],
           "peak_gib_planned": [71.0], "peak_gib_planned_at_run": [58.0]}
    p = tmp_path / "scale.json"; p.write_text(json.dumps({"records": [rec]}))
    assert "| 69.0 | 71.0 | 0.97 | 58.0 | 1.19 |" in REPORT["memory_table"](p)
    v = [x for x in REPORT["verdicts"](p) if "planner" in x]
    assert v == ["Qwen2.5-7B colocated on 4× H100: planner within 10% of every GPU's peak: met (worst measured ÷ planned 0.97, "
                 "today's planner; the plan the run was given: worst 1.19, missed)."]


def test_a_run_with_overrides_pairs_with_trls_run_of_the_preset_and_says_what_changed(tmp_path):
    "`paired` gives each `--set` run the TRL run of the same model, layout and GPUs; `override_lines` goes from it to the main results' run."
    dev = "4x NVIDIA H100 80GB HBM3"
    base = {"model": "Qwen2.5-7B", "layout": "colocated", "gpus": 4, "tp": 1, "learners": 4, "engines": 4, "rc": 0, "device": dev,
            "step_mean_s": 16.0, "mfu_per_learner_gpu": 0.30, "peak_gib_measured": [68.0, 69.0], "time_split": {"time/learner": 7.0, "time/generation": 6.0},
            "pack_length": 8192, "micro_batches_per_step": 7, "trl_backend": "trl:vllm-colocate", "trl_step_mean_s": 17.0, "trl_device": dev}
    other_gpus = {**base, "device": "4x NVIDIA H200", "trl_step_mean_s": 99.0}
    over = {**{k: v for k, v in base.items() if not k.startswith("trl_")}, "step_mean_s": 13.6, "mfu_per_learner_gpu": 0.43,
            "peak_gib_measured": [67.5], "time_split": {"time/learner": 5.0, "time/generation": 6.1}, "pack_length": 49152, "micro_batches_per_step": 1,
            "overrides": ["learner.pack_length=49152"], "work": {"prompts": 16, "G": 8, "prompt_len": 512, "gen": 1024}}
    main, extra = tmp_path / "main.json", tmp_path / "over.json"
    main.write_text(json.dumps({"records": [other_gpus, base]})); extra.write_text(json.dumps({"records": [over]}))
    [p] = REPORT["paired"](extra, main)
    assert p["trl_step_mean_s"] == 17.0 and p["speedup_mean"] == 17.0 / 13.6 and p["overrides"] == over["overrides"]
    assert "| colocated `--learner.pack_length=49152` | 4× H100: 4 + 4 × 1 | 1 (49152) |" in REPORT["scale_table"]([p])
    assert any(v.startswith("Qwen2.5-7B colocated with --learner.pack_length=49152 on 4× H100: ≥1.2× TRL by mean step time: 1.25×") for v in REPORT["verdicts"]([p]))
    [line] = REPORT["override_lines"](extra, main)
    assert line == ("Qwen2.5-7B colocated on 4× H100, a learner's share of a step (32 sequences of up to 1,536 tokens) from 1 micro-batch of "
                    "up to 49,152 tokens (--learner.pack_length=49152) to 7 micro-batches of up to 8,192 tokens (the preset as it is): "
                    "step 13.60 → 16.00 s, generation 6.10 → 6.00 s, learner 5.00 → 7.00 s, MFU 43.0% → 30.0%, largest GPU peak 67.5 → 69.0 GiB "
                    "(all but the peak: means over the timed steps).")
    lone = tmp_path / "lone.json"; lone.write_text(json.dumps({"records": [{**over, "device": "4x NVIDIA B200"}]}))
    assert REPORT["paired"](lone, main)[0].get("trl_step_mean_s") is None   # no TRL run on those GPUs: nothing to pair with
    assert REPORT["override_lines"](lone, main) == ["Qwen2.5-7B colocated with --learner.pack_length=49152 on 4× B200: no run of this model "
                                                    "and layout on these GPUs in the main results to compare with"]


def test_a_failed_multi_process_peer_is_named_by_its_first_error(tmp_path):
    "The launcher's `ChildFailedError` summary says nothing; the report names the first exception a rank raised."
    log = tmp_path / "trainer.log"
    log.write_text("[INFO] start\n[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x.py\", line 1\n"
                   "[rank1]: NotImplementedError: Cannot copy out of meta tensor; no data!\n[rank3]: RuntimeError: later\n"
                   "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n  traceback : To enable traceback see: https://x/errors.html\n")
    why = COMMON.first_error(log)
    assert why == "[rank1]: NotImplementedError: Cannot copy out of meta tensor; no data!"
    assert COMMON.first_error(tmp_path / "missing.log") is None
    err = f"TRL trainer exited 1 (limit 540 s); first error: {why}\n" + log.read_text()
    rec = {"model": "OLMo-2-7B", "layout": "colocated", "gpus": 4, "tp": 1, "learners": 4, "engines": 4, "rc": 0, "step_mean_s": 25.0,
           "device": "4x NVIDIA H100", "trl_backend": "trl:vllm-colocate", "trl_step_mean_s": None, "trl_error": err}
    assert "| vllm-colocate | failed: NotImplementedError: Cannot copy out of meta tensor; no data! | — |" in REPORT["scale_table"]([rec])
    assert ("OLMo-2-7B colocated: ours measured; TRL vllm-colocate beside it failed (NotImplementedError: Cannot copy out of meta tensor; "
            "no data!)") in REPORT["unmeasured"]([rec])


def test_replan_keeps_the_pack_each_run_had(tmp_path):
    "A record carries its learner's pack, so `--replan` plans the run as it was even after the preset's pack changed (`plan_overrides`)."
    cmd = ("grpo_nb train scale-7b-4gpu-colocated --total_steps=10 --data.max_prompt_tokens=520 --rollout.prompts_per_step=16 "
           "--rollout.num_samples_per_prompt=8 --rollout.max_new_tokens=1024 --reward.functions={arith: 1.0} --checkpoint.every_steps=0")
    recs = [{"model": "Qwen2.5-7B", "layout": "colocated", "smoke": False, "command": cmd, "peak_gib_planned": [1.0] * 4, "pack_length": n}
            for n in (8192, 49152)]
    out = tmp_path / "scale.json"; out.write_text(json.dumps({"records": recs}))
    subprocess.run([sys.executable, str(ROOT / "bench/scale_4gpu.py"), "--replan", "--out", str(out)], check=True, cwd=ROOT, timeout=300)
    assert REPORT["plan_overrides"](recs[1])[-2:] == ["--model.name_or_path=Qwen2.5-7B", "--learner.pack_length=49152"]
    assert "--reward.functions={arith: 1.0}" in REPORT["plan_overrides"](recs[1])   # a value with a space stays whole
    seven, one = (r["peak_gib_planned"][0] for r in json.loads(out.read_text())["records"])
    assert seven != one and 60 < min(seven, one) and max(seven, one) < 80   # two plans of one preset, told apart by the pack each run had
