"""sbatch/grpo.sbatch, unchanged, under a real SLURM on this machine.

Three emulated nodes with four fake GPUs each (tests/slurm_harness.py: Debian's slurmctld/slurmd/munge,
installed with apt-get when missing, state under a temp dir, inside a network namespace of its own).
The trainer is the stand-in of tests/slurm_standin_trainer.py (same contract as `grpo_nb train`), named
through TRAIN_CMD, the one variable the script reads it from. A chain of three jobs runs over all three nodes, and a
separate job gets its SIGUSR1 the moment it starts (it must stop cleanly and chain on).

The chain is driven by the real pre-walltime signal: every job runs with `--time=2` and
`--signal=B:USR1@45` (given as SBATCH_SIGNAL, which `--export=ALL` carries into the chained jobs).
slurmctld checks time limits every 30 s and sends the signal at the first check that is less than
45 + 30 s before the walltime, i.e. at least 45 s after the job started: Ray has 45 s to form on three
emulated nodes and the trainer to take a step, and three jobs take about six checks. On a machine busy with
other work the test stretches the walltime further (see `job_timing`): slower, same checks.
"""
import json, os, re, shutil, subprocess, sys, time
from pathlib import Path
import pytest
from slurm_harness import LocalSlurm, ensure_installed

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="a private SLURM needs root (apt-get, munge, network namespace)")
MAX_CHAINS = 3


def job_timing(cluster) -> tuple[int, int]:
    """(--time in minutes, --signal seconds) of every job. The defaults give Ray and the first step at least 45 s
    before the signal (slurmctld checks time limits every 30 s). Twenty seconds (`--time=1 --signal=B:USR1@10`)
    were enough on two idle cores but not while the other half of the test suite ran Ray clusters beside this one:
    no job of the chain reached its first step; with 30 s one job of three had 6 s to spare. On a machine busy
    with other work (a warm `import ray` takes longer than 2.5 s), Ray's start-up can take a minute: stretch the
    walltime rather than fail (slower, same checks). Three minutes leave at least 90 s before the signal; four made the chain of three jobs take close to
    10 minutes, most of CI's budget. GRPO_SLURM_TEST_TIME_MIN / GRPO_SLURM_TEST_SIGNAL_S force either."""
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import ray"], env=cluster.env(), check=True)
    busy = time.time() - t0 > 2.5
    cluster.timings["import_ray_s"] = time.time() - t0
    minutes = int(os.environ.get("GRPO_SLURM_TEST_TIME_MIN", 3 if busy else 2))
    signal_s = int(os.environ.get("GRPO_SLURM_TEST_SIGNAL_S", 10 if minutes == 1 else 60 if busy else 45))   # --time=1: 20 s
    return minutes, signal_s


@pytest.fixture(scope="module")
def cluster():
    t0 = time.time()
    s = LocalSlurm(nodes=3, gpus_per_node=4, cpus_per_node=2)
    s.warm_start(sys.executable)  # bytecode for Ray's processes, while apt-get runs
    apt_s = ensure_installed()
    s.warm_wait()
    s.timings["warm_s"] = time.time() - t0 - apt_s
    s.job_timing = job_timing(s)  # before slurmctld starts: its 30 s time-limit checks count from its start
    try:
        s.start()
        s.timings["apt_s"], s.timings["t0"] = apt_s, t0
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def run(cluster):
    "Submit the chain's first job as soon as the scheduler is up; wait until the chain has finished."
    s, r = cluster, cluster.root
    TIME_MIN, SIGNAL_S = s.job_timing
    (r / "logs").mkdir()
    cfg = r / "run.yaml"
    cfg.write_text(f"total_steps: 100000\n"
                   f"cluster: {{device: cpu, nodes: 3, gpus_per_node: 4, learners_per_node: [4, 4, 4]}}\n"
                   f"rollout: {{prompts_per_step: 12}}\n"
                   f"logging: {{output_dir: {r}/run}}\n"
                   f"checkpoint: {{dir: {r}/run/ckpt, keep_last: 2}}\n")
    env = s.env(TRAIN_CMD=f"python {ROOT}/tests/slurm_standin_trainer.py --step-s 0.25", MAX_JOB_CHAINS=MAX_CHAINS,
                SBATCH_SIGNAL=f"B:USR1@{SIGNAL_S}", SBATCH_OUTPUT=f"{r}/logs/%x-%j.out",
                RAY_TMPDIR_BASE=str(r), RAY_OBJECT_STORE_MEMORY=100_000_000, RAY_HEAD_POLL_S=1, RAY_WAIT_S=90 * TIME_MIN, RAY_STOP_S=20,
                RAY_prestart_worker_first_driver=0)
    script = str(ROOT / "sbatch" / "grpo.sbatch")
    first = s.sbatch("--nodes=3", f"--time={TIME_MIN}", script, str(cfg), env=env, cwd=str(ROOT))
    t_submit = time.time()
    jobs = s.wait_done(until_idle=True, timeout=60 + MAX_CHAINS * 90 * TIME_MIN, every=1)
    s.timings["chain_s"] = time.time() - t_submit
    logs = {int(j["JobId"]): (r / "logs" / f"grpo-{j['JobId']}.out").read_text() for j in jobs}
    print("\n".join(f"--- job {k}\n{v}" for k, v in logs.items()))
    print(s.timings)
    return dict(first=first, jobs=jobs, logs=logs, root=r, env=env, script=script, config=str(cfg), time_min=TIME_MIN,
                chain=[int(j["JobId"]) for j in jobs if int(j["JobId"]) >= first])


def test_the_script_finds_itself_through_scontrol(run):
    log = run["logs"][run["first"]]
    assert f"{ROOT}/sbatch/grpo.sbatch {run['root']}/run.yaml" in log, log  # Command=, not $0 (the spooled copy)


def test_ray_cluster_forms_across_all_nodes(run):
    log = run["logs"][run["first"]]
    assert re.search(r"Ray cluster ready in [\d.]+ s: 3 node\(s\) \(n1, n2, n3\), 12 GPU\(s\)", log), log
    trained = [j for j in run["chain"] if (run["root"] / "run" / f"standin_cluster_{j}.json").exists()]   # the job that took step 1
    assert trained, "no job of the chain started training"
    probe = json.loads((run["root"] / "run" / f"standin_cluster_{trained[0]}.json").read_text())
    assert probe["hosts"] == ["n1", "n2", "n3"] and probe["gpus"] == 12
    assert len({node for _, node in probe["tasks_ran_on"]}) == 3  # a task ran on each Ray node


def test_three_jobs_chained_by_the_walltime_signal_then_the_cap(run):
    chain = run["chain"]
    assert len(chain) == MAX_CHAINS, [(j["JobId"], j["JobState"]) for j in run["jobs"]]
    for i, job in enumerate(chain):
        info = next(j for j in run["jobs"] if int(j["JobId"]) == job)
        log = run["logs"][job]
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, log)
        assert "got SIGUSR1" in log and "trainer exit 0" in log, log
        assert f"chain: job {i + 1} (ledger: {i + 1})" in log, log
        if i < MAX_CHAINS - 1: assert f"chain: submitted job {chain[i + 1]} (GRPO_CHAIN_INDEX={i + 1})" in log, log
    assert f"GRPO_CHAIN_INDEX=2 is the last of MAX_JOB_CHAINS={MAX_CHAINS}" in run["logs"][chain[-1]]
    ledger = (run["root"] / "run" / "slurm_chain.log").read_text().splitlines()
    assert [l.split()[:3] for l in ledger if l.startswith("started")] == [["started", str(j), f"index={i}"] for i, j in enumerate(chain)]
    assert [l for l in ledger if l.startswith("submitted")] == [f"submitted {j}" for j in chain[1:]]


def test_steps_are_continuous_across_the_chain(run):
    rows = [l.split() for l in (run["root"] / "run" / "steps.log").read_text().splitlines()]
    steps, jobs = [int(s) for s, _ in rows], [int(j) for _, j in rows]
    assert steps == list(range(1, len(steps) + 1)), steps  # none repeated, none skipped
    # every job trained, in chain order; except one whose walltime signal came before its first step (a loaded machine
    # can start Ray that slowly): it stops cleanly and the chain goes on from the same checkpoint
    early = [j for j in run["chain"] if "before the first step" in run["logs"][j] or "before training started" in run["logs"][j]]
    assert sorted(set(jobs) | set(early)) == run["chain"] and jobs == sorted(jobs), (jobs, early)
    latest = (run["root"] / "run" / "ckpt" / "latest").read_text().strip()
    assert latest == f"step_{steps[-1]}"
    assert f"checkpoint step -1 -> " in run["logs"][run["chain"][0]]
    for job in sorted(set(jobs)):
        first_step = steps[jobs.index(job)]
        assert f"training from step {first_step - 1 if first_step > 1 else -1}:" in run["logs"][job]  # resumed from the checkpoint


def test_workers_leave_after_the_head_and_exit_zero(run):
    for job in run["chain"]:
        log = run["logs"][job]
        assert all(f"Ray on n{k} ({'head' if k == 1 else 'worker'}) exited with 0" in log for k in (1, 2, 3)), log
        assert "the head is gone" in (run["root"] / "logs" / f"ray-{job}-n2.log").read_text()


def test_a_node_that_cannot_join_is_named_and_nothing_chains(cluster, run):
    "The worker of n2 finds its Ray port taken (another job's Ray, say): the job fails at once, naming n2."
    s, r = cluster, cluster.root
    port = 20000 + 128  # n2's node-manager port: RAY_NODE_PORT_BASE shifted by 128 x rank (it shares the head's address)
    blocker = s.spawn_listener(port)
    env = run["env"]
    job = s.sbatch("--nodes=3", f"--time={run['time_min']}", run["script"], run["config"], f"--logging.output_dir={r}/run_missing", env=env, cwd=str(ROOT))
    jobs = s.wait_done([job], timeout=120, every=1)
    blocker.kill()
    info = next(j for j in jobs if int(j["JobId"]) == job)
    log = (r / "logs" / f"grpo-{job}.out").read_text()
    print(log)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", (info, log)
    assert f"Ray on n2 ended before the cluster formed: see {r}/logs/ray-{job}-n2.log" in log, log
    assert "port 20128 on 127.0.0.1 is taken" in (r / "logs" / f"ray-{job}-n2.log").read_text()
    assert "Ray on n1 (head) exited with 0" in log and "chain: submitted" not in log
    assert max(int(j["JobId"]) for j in s.jobs()) == job  # it submitted nothing


def test_a_job_that_cannot_run_the_config_fails_at_once_and_does_not_chain(cluster, run):
    s, r = cluster, cluster.root
    job = s.sbatch("--nodes=1", f"--time={run['time_min']}", run["script"], run["config"], f"--logging.output_dir={r}/run_bad",
                   env=run["env"], cwd=str(ROOT))
    info = next(j for j in s.wait_done([job], timeout=60, every=0.5) if int(j["JobId"]) == job)
    log = (r / "logs" / f"grpo-{job}.out").read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", (info, log)
    assert "has 1" in log and "sbatch --nodes=3" in log, log
    assert "Ray:" not in log and "chain: submitted" not in log
    assert max(int(j["JobId"]) for j in s.jobs()) == job  # it submitted nothing


def test_an_early_signal_stops_cleanly_and_the_chain_goes_on(cluster, run):
    """Under a real scheduler: SIGUSR1 reaches the batch shell as soon as the job runs, while the trainer
    (here one that takes 3 s to install its handlers, as `grpo_nb train` does while importing) may not be up yet.
    The job ends COMPLETED with exit 0, and the chain goes on: the next job trains from the same (here: no) checkpoint."""
    s, r = cluster, cluster.root
    cfg = r / "early.yaml"
    cfg.write_text(f"total_steps: 4\ncluster: {{device: cpu, nodes: 1, gpus_per_node: 4, learners_per_node: [4]}}\nrollout: {{prompts_per_step: 4}}\n"
                   f"logging: {{output_dir: {r}/early}}\ncheckpoint: {{dir: {r}/early/ckpt, keep_last: 2}}\n")
    env = {**run["env"], "TRAIN_CMD": f"python {ROOT}/tests/slurm_standin_trainer.py --step-s 0.25 --startup-s 3", "MAX_JOB_CHAINS": "2"}
    first = s.sbatch("--nodes=1", f"--time={run['time_min']}", run["script"], str(cfg), env=env, cwd=str(ROOT))   # one node: the signal's timing, not the cluster, is the point
    s._wait(lambda: s.job(first).get("JobState") == "RUNNING", 60, f"job {first} to run", 0.05)
    # the batch shell's first log line comes right after its traps: a signal before them would find a shell that has not
    # started (SLURM's --signal=B:USR1@S fires minutes before the walltime, never in a job's first milliseconds)
    out = r / "logs" / f"grpo-{first}.out"
    s._wait(lambda: out.exists() and f"job {first} on" in out.read_text(), 60, f"job {first}'s first log line", 0.05)
    s.run("scancel", "--signal=USR1", "--batch", str(first))   # what --signal=B:USR1@S does, at the worst moment
    jobs = s.wait_done(until_idle=True, timeout=60 + 2 * 90 * run["time_min"], every=1)
    second = max(int(j["JobId"]) for j in jobs)
    logs = {j: (r / "logs" / f"grpo-{j}.out").read_text() for j in (first, second)}
    print("\n".join(f"--- job {k}\n{v}" for k, v in logs.items()))
    info = {int(j["JobId"]): j for j in jobs}
    assert info[first]["JobState"] == "COMPLETED" and info[first]["ExitCode"] == "0:0", logs[first]
    assert "got SIGUSR1" in logs[first] and f"chain: submitted job {second} (GRPO_CHAIN_INDEX=1)" in logs[first], logs[first]
    assert second > first and info[second]["JobState"] == "COMPLETED", logs[second]
    if "before the first step" in logs[second] or "before training started" in logs[second]: return   # a loaded machine: signalled early too
    rows = [l.split() for l in (r / "early" / "steps.log").read_text().splitlines()]
    assert rows and rows[0] == ["1", str(second)] and {j for _, j in rows} == {str(second)}, rows   # the next job trained from scratch


def test_teardown_by_pid_leaves_nothing(cluster, run):
    assert cluster.our_pids()  # the daemons are still up here
    out = cluster.stop()
    assert out["remaining"] == 0 and cluster.our_pids() == [], out
    print({k: round(v, 1) for k, v in cluster.timings.items() if k != "t0"}, f"total {time.time() - cluster.timings['t0']:.0f} s")


@pytest.mark.slow  # the real trainer (Ray + vLLM + DeepSpeed) under SLURM: minutes on 2 cores, beyond CI's budget
def test_the_real_trainer_runs_and_resumes_under_the_exported_script(cluster):
    """`grpo_nb train` itself (not the stand-in) under sbatch/grpo.sbatch on the two emulated nodes: the Ray cluster the
    script starts is joined with ray_address=auto, the tiny demo policy trains with a real vLLM engine and a DeepSpeed
    learner, checkpoints, and a second submission resumes with `--resume auto` and continues without repeating a step."""
    import yaml
    from grpo_nb.config import PRESETS
    s = cluster
    r = s.root / "real"
    (r / "logs").mkdir(parents=True)
    cfg = json.loads(json.dumps(PRESETS["demo"]))
    cfg.update(total_steps=3, eval_every=0)
    cfg["cluster"].update(nodes=2, gpus_per_node=4, learners_per_node=[1])
    cfg["rollout"].update(prompts_per_step=4, num_samples_per_prompt=4)
    cfg["learner"].update(micro_batch_size=16)
    cfg["logging"].update(output_dir=f"{r}/run", progress_bar=False)
    cfg["checkpoint"].update(dir=f"{r}/run/ckpt", every_steps=1)
    path = r / "run.yaml"; path.write_text(yaml.safe_dump(cfg))
    env = s.env(TRAIN_CMD=f"{sys.executable} -m grpo_nb.cli train", MAX_JOB_CHAINS=1, SBATCH_OUTPUT=f"{r}/logs/%x-%j.out",
                RAY_TMPDIR_BASE=str(r), RAY_OBJECT_STORE_MEMORY=200_000_000, RAY_HEAD_POLL_S=1, RAY_WAIT_S=300, RAY_STOP_S=20,
                SBATCH_SIGNAL="B:USR1@30")  # the production header signals 600 s early: more than this 10-minute job
    logs = []
    for total in (2, 3):  # the first job stops at step 2, the second resumes and runs step 3
        path.write_text(yaml.safe_dump({**cfg, "total_steps": total}))
        job = s.sbatch("--time=10", str(ROOT / "sbatch" / "grpo.sbatch"), str(path), env=env, cwd=str(ROOT))
        info = s.wait_done([job], timeout=600, every=1)[0]
        logs.append((r / "logs" / f"grpo-{job}.out").read_text())
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, logs[-1][-8000:])
        assert re.search(r"Ray cluster ready in [\d.]+ s: 2 node\(s\)", logs[-1]), logs[-1][-8000:]
    recs = [json.loads(l) for l in (r / "run" / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [x["step"] for x in recs if "reward_mean" in x]
    assert steps == [1, 2, 3], steps  # none repeated, none skipped
    assert "checkpoint step -1 -> 2" in logs[0] and "checkpoint step 2 -> 3" in logs[1], logs  # the script reads `latest`
    assert (r / "run" / "ckpt" / "latest").read_text().strip().endswith("3")
