"""bench/e2e_vs_trl.py on CPU: it leaves no TRL server behind (the server runs in its own session, so a run killed by
its time limit cannot take it down; the parent ends what the run's pid file names before the next run needs the GPU),
and it counts TRL's time to the first step as it counts ours, from the process's start."""
import os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import e2e_vs_trl as E   # noqa: E402
from common import alive_group   # noqa: E402


def _server_like(ignore_term:bool) -> subprocess.Popen:
    "A process in its own session with a child, like `trl vllm-serve` and its engine; optionally deaf to SIGTERM."
    code = ("import signal, subprocess, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\ntime.sleep(300)\n")
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(1.0)
    return p


def _orphan_server(ignore_term:bool) -> int:
    "The same server left behind as a killed run leaves it: started by a process that has exited, so init reaps it; its pid."
    code = ("import signal, subprocess, sys, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\ntime.sleep(300)\n")
    spawn = ("import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', " + repr(code) + "], start_new_session=True, "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True, timeout=30).stdout)
    time.sleep(1.0)
    return pid


def test_a_leftover_server_is_ended_with_its_children(tmp_path):
    out = tmp_path / "run_trl_vllm-server_bench.json"
    for deaf in (False, True):   # one that leaves on SIGTERM, one that needs the SIGKILL
        pid = _orphan_server(deaf)
        E.server_pid_path(out).write_text(str(pid))
        assert alive_group(pid)
        E.end_leftover_server(out, grace=2)
        assert not alive_group(pid) and not E.server_pid_path(out).exists()


def test_no_pid_file_is_a_no_op(tmp_path):
    E.end_leftover_server(tmp_path / "run_ours_split_sync_bench.json")   # ours has no server: nothing to end, nothing raised


def test_first_step_counts_from_the_process_start():
    from grpo_nb.trainer import process_age_s
    now = time.perf_counter()
    got = E.from_process_start(now, own_s=0.25)
    age = process_age_s()
    assert got["first_step_from"] == "process start"
    assert abs(got["first_step_s"] - (age - 0.25)) < 0.5   # the process's age at `now`, less the benchmark's own work
    assert E.from_process_start(None, 0.0) == {}   # no first step: nothing to report


def test_stop_group_ends_an_own_child_and_its_children():
    from common import stop_group
    p = _server_like(ignore_term=False)   # our own child this time: its exit is collected, no zombie keeps the group alive
    stop_group(p, grace=5)
    assert p.returncode is not None and not alive_group(p.pid)


def test_a_variant_of_ours_adds_its_overrides_last(tmp_path, monkeypatch):
    "--ours-extra reaches every run of ours (after the benchmark's own overrides, so it wins) and nothing else."
    base = E.ours_overrides("colocated", "sync", E.SHAPES["bench"], tmp_path / "model", tmp_path / "p.jsonl", tmp_path, "cuda")
    assert not any(o.startswith("--rollout.sleep_level") for o in base)   # the benchmark runs the default
    monkeypatch.setenv("E2E_OURS_EXTRA", "--rollout.sleep_level=2 --learner.logprob_kernel=torch")
    variant = E.ours_overrides("colocated", "sync", E.SHAPES["bench"], tmp_path / "model", tmp_path / "p.jsonl", tmp_path, "cuda")
    assert variant == base + ["--rollout.sleep_level=2", "--learner.logprob_kernel=torch"]
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e_vs_trl.py"), "--runs", "ours:colocated:sync:bench,trl:vllm-colocate:bench",
                          "--dry-run", "--ours-extra=--rollout.sleep_level=2"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "E2E_OURS_EXTRA"})
    ours, trl = (l for l in out.stdout.splitlines() if l.startswith(("ours:", "trl ")))
    assert out.returncode == 0 and ours.endswith("--rollout.sleep_level=2") and "sleep_level" not in trl, out.stdout + out.stderr


def test_a_merged_record_keeps_every_steps_generation_of_both_sides(tmp_path):
    "Each side's run file carries `generation_s_all`; the merge keeps it beside the step times, so a page can tell a slow start from slow steps."
    import json
    shape = {**E.SHAPES["bench"], "steps": 3}
    def run(name, steps, gens):
        return {"run": name, "device": "GPU", "config": shape, "step_s_all": steps, "generation_s_all": gens,
                "stats": E.stats(steps[shape["warmup"]:]), "split_s": {"generation": sum(gens[2:]) / 3}}
    (tmp_path / "run_ours_colocated_sync_bench.json").write_text(json.dumps(run("ours:colocated:sync:bench", [5.0, 1.4, 1.2, 1.6, 1.3], [4, 1.0, 0.8, 1.2, 0.9])))
    (tmp_path / "run_trl_vllm-colocate_bench.json").write_text(json.dumps(run("trl:vllm-colocate:bench", [3.0, 1.9, 1.8, 2.0, 1.7], [2, 1.4, 1.3, 1.5, 1.2])))
    rec = next(r for r in E.merge(tmp_path)["records"] if r["peer"] == "trl" and r["trl_backend"] == "vllm-colocate" and r["shape"] == "bench")
    assert rec["ours_generation_s_all"] == [4, 1.0, 0.8, 1.2, 0.9] and rec["trl_generation_s_all"] == [2, 1.4, 1.3, 1.5, 1.2]
    assert abs(rec["speedup_mean"] - (1.8 + 2.0 + 1.7) / (1.2 + 1.6 + 1.3)) < 1e-9


def test_a_shape_without_runs_adds_no_records_and_steady_times_the_bench_work_longer(tmp_path):
    "`steady` is the bench's work with more timed steps; a merge lists a shape's unmeasured comparisons only once the shape has a run, and only in its layouts."
    import json
    work = lambda s: {k: v for k, v in s.items() if k != "steps"}
    assert work(E.SHAPES["steady"]) == work(E.SHAPES["bench"]) and E.SHAPES["steady"]["steps"] >= 3 * E.SHAPES["bench"]["steps"]
    shape = {**E.SHAPES["bench"], "steps": 3}
    steps = [5.0, 1.4, 1.2, 1.6, 1.3]
    (tmp_path / "run_ours_colocated_sync_bench.json").write_text(json.dumps({"run": "ours:colocated:sync:bench", "device": "GPU", "config": shape,
        "step_s_all": steps, "stats": E.stats(steps[2:]), "split_s": {"generation": 1.0}}))
    recs = E.merge(tmp_path)["records"]
    assert {r["shape"] for r in recs} == {"bench"}   # no steady, long or wide rows while none of them has run
    assert any(r["shape"] == "bench" and r["peer"] == "trl" and r["trl_backend"] == "vllm-server" and not r.get("speedup_mean") for r in recs)   # still listed: unmeasured
    (tmp_path / "run_ours_colocated_sync_steady.json").write_text(json.dumps({"run": "ours:colocated:sync:steady", "device": "GPU", "config": shape,
        "step_s_all": steps, "stats": E.stats(steps[2:]), "split_s": {"generation": 1.0}}))
    steady = [r for r in E.merge(tmp_path)["records"] if r["shape"] == "steady"]
    assert steady and {r["layout"] for r in steady} == {"colocated"}   # a colocated-only shape lists no split comparisons


def test_a_run_records_its_gpus_clocks_and_each_steps_mean_sm_clock(tmp_path, monkeypatch):
    "`ClockLog` samples nvidia-smi for the length of a run (here a stand-in that prints as nvidia-smi does); each step gets the mean SM clock inside it."
    import json, stat
    from common import CLOCK_FIELDS, ClockLog, parse_clock_lines
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\n"
                    "for i in 1 2 3 4 5 6; do date '+%Y/%m/%d %H:%M:%S.%3N, 0, 1980, 3201, 250.5, 45, 97'; sleep 0.1; done\n"
                    "echo 'cut mid-li'\nsleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    t0 = time.time()
    with ClockLog(every_ms=100) as log: time.sleep(1.0)
    t1 = time.time()
    assert len(log.samples) == 6 and all(t0 - 1 < s["t"] < t1 + 1 and s["clocks.sm"] == 1980.0 and s["power.draw"] == 250.5 for s in log.samples)
    assert "--id=0" in (tmp_path / "args").read_text() and log.proc.poll() is not None   # the run's GPU only; the sampler ended with the block
    rec = E.clock_fields(log.samples, 100, [t1, t1 + 60], [t1 - t0 + 1, 5.0])
    assert rec["gpu_clocks"]["fields"] == ["t_s", "gpu", *CLOCK_FIELDS] and len(rec["gpu_clocks"]["rows"]) == 6
    assert rec["sm_clock_mhz_per_step"] == [1980.0, None]   # the second step's window holds no sample
    assert parse_clock_lines("2026/11/30 13:17:35.120, 1, [N/A], 1593, 80.1, 40, 0\nWarning: x\n")[0]["clocks.sm"] is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))   # no nvidia-smi at all: the block runs, nothing is sampled, nothing is added
    with ClockLog() as none: pass
    assert none.samples == [] and E.clock_fields(none.samples, 500, None, None) == {}
    json.dumps(rec)   # what the run file stores


def test_the_clock_query_parses_what_a_real_nvidia_smi_printed():
    "The committed output of ClockLog's query on an H200 (driver 580): every sample line parses, the comment lines are skipped."
    from common import parse_clock_lines
    text = (ROOT / "bench/results/logs/h200_2026-11-30_1317/clock_query/nvidia_smi_clock_query.txt").read_text()
    got = parse_clock_lines(text)
    assert len(got) == sum(1 for l in text.splitlines() if not l.startswith("#")) == 6
    assert all(s["gpu"] == 0 and s["clocks.sm"] == 345.0 and s["clocks.mem"] == 3201.0 and 82 < s["power.draw"] < 84 for s in got)
    assert 0.45 < got[1]["t"] - got[0]["t"] < 0.55   # half a second apart, as --loop-ms=500 asks
