"""The generated SLURM scripts without a scheduler: syntax, the known SLURM traps (see nbs/09_slurm.ipynb), the chain decision (nbs/09a_chain.ipynb),
signal forwarding and the per-node Ray bootstrap (with a fake `ray`). Fast; the real scheduler runs in
tests/test_slurm_cluster.py."""
import os, re, signal, socket, subprocess, sys, tempfile, textwrap, time
from pathlib import Path
import pytest
import grpo_nb.slurm as lib
import grpo_nb.chain as chain
import grpo_nb.preflight as preflight

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "sbatch"
SCRIPTS = [SBATCH / name for name in lib.LADDER] + [SBATCH / "ray_node_setup.sh"]  # ours; other notebooks write there too


def test_committed_scripts_are_what_the_notebook_renders(tmp_path):
    paths = lib.render_scripts(tmp_path)
    assert {p.name for p in paths} == {p.name for p in SCRIPTS}
    for p in paths:
        assert (SBATCH / p.name).exists() and (SBATCH / p.name).read_text() == p.read_text(), f"sbatch/{p.name} is stale: run tools/render_scripts.py"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(path):
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.access(path, os.X_OK)


def commands(text:str) -> list[str]:
    "Shell lines without comments, backslash continuations joined."
    text = re.sub(r"\\\n\s*", " ", text)
    return [l.split(" #")[0] for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.suffix == ".sbatch"], ids=lambda p: p.name)
def test_traps_are_avoided(path):
    text = path.read_text()
    cmds = commands(text)
    # 1. the chain counter is not SLURM_*-named (sbatch --export keeps the running job's SLURM_* value)
    exports = [c for c in cmds if "--export=" in c]
    assert exports and all("GRPO_CHAIN_INDEX=$next" in c for c in exports)
    assert not re.search(r"--export=\S*SLURM_", text) and "SLURM_JOB_CHAIN_COUNT" not in text
    # ... and the cap is also checked against the ledger, independently of the counter
    assert '"$JOBS_IN_CHAIN" -ge "$MAX_JOB_CHAINS"' in text and '"$next" -ge "$MAX_JOB_CHAINS"' in text
    # 2. every srun names its node and task count; background steps overlap
    sruns = [c for c in (re.sub(r'log "[^"]*"', "", c) for c in cmds) if re.search(r"(^|\s|\$\()srun\s", c)]
    assert len(sruns) >= 3
    for c in sruns:
        assert "--overlap" in c and "--ntasks=1" in c and "--nodes=1" in c and " -w " in c, c
    # 3. the walltime signal goes to the batch shell, is trapped first thing, and the trainer runs in the background
    assert re.search(r"^#SBATCH --signal=B:USR1@\d+$", text, re.M)
    body = text.split("# <<< functions")[1]
    assert body.index("trap 'on_stop USR1' USR1") < body.index("scontrol show job")
    assert re.search(r'^\s*\$TRAIN_CMD .*&$', text, re.M) and 'wait "$TRAIN_PID"' in text
    assert 'kill -USR1 "$TRAIN_PID"' in text
    # 4. the script's directory comes from scontrol's Command=, never from $0 (the spooled copy)
    assert "job_field Command" in text and not any("$0" in c for c in cmds) and "BASH_SOURCE" not in text
    # 5. resubmission: after this job ends, same script, resume
    assert '--dependency="afterany:$SLURM_JOB_ID"' in text and "--resume auto" in text
    # the trainer is named in exactly one place
    assert len(re.findall(r"^TRAIN_CMD=", text, re.M)) == 1 and text.count("grpo_nb train") == 1


def test_node_setup_never_stops_other_rays():
    text = (SBATCH / "ray_node_setup.sh").read_text()
    assert "ray stop" not in text and "pkill" not in text and "killall" not in text
    for flag in ["--node-manager-port", "--object-manager-port", "--min-worker-port", "--max-worker-port",
                 "--dashboard-agent-listen-port", "--runtime-env-agent-port", "--metrics-export-port", "--port="]:
        assert flag in text, flag


CHAIN_CASES = [  # (kwargs of run_chain_case, submits?, words the log line must contain)
    (dict(rc=0, start=4, end=9), True, "submitted job 4242"),
    (dict(rc=0, start=4, end=9, stop=0), False, "before the walltime signal"),
    (dict(rc=1, start=4, end=9), False, "the trainer failed (exit 1)"),
    (dict(rc=0, start=-1, end=-1), True, "submitted job 4242"),   # a signal before the first step chains on
    (dict(rc=0, start=7, end=7), True, "submitted job 4242"),
    (dict(rc=0, start=90, end=100), False, "run is complete"),
    (dict(rc=0, start=4, end=9, index=2, ledger_jobs=3), False, "MAX_JOB_CHAINS=3"),
    (dict(rc=0, start=4, end=9, index=0, ledger_jobs=3), False, "lists 3 jobs"),      # counter stuck (the SLURM_* trap)
    (dict(rc=0, start=4, end=9, index=5, ledger_jobs=1), False, "GRPO_CHAIN_INDEX=5"),  # ledger lost: the counter still caps
]

@pytest.mark.parametrize("kw,submits,says", CHAIN_CASES, ids=[str(c[0]) for c in CHAIN_CASES])
def test_chain_decision(kw, submits, says):
    line, argv = chain.run_chain_case((SBATCH / "grpo.sbatch").read_text(), **kw)
    assert says in line, line
    assert bool(argv) == submits
    if submits:
        assert argv.startswith("--parsable --dependency=afterany:41 --nodes=2 --time=01:00:00 --job-name=grpo --partition=gpu")
        assert f"--export=ALL,GRPO_CHAIN_INDEX={kw.get('index', 0) + 1},MAX_JOB_CHAINS=3" in argv
        assert argv.endswith("/x/grpo.sbatch cfg.yaml --a.b=1")


def funcs(text:str) -> str:
    return chain.functions_block(text)


def _signal_the_train_block(tmp_path, trainer_body:str, poll_s:float=0.05) -> str:
    """Run the script's train block (its functions, the USR1 trap) with `trainer_body` as the trainer; USR1 the batch shell as soon as
    the trainer says `started`, as `--signal=B:USR1@S` does (only the batch shell gets it); return the block's output."""
    trainer = tmp_path / "trainer.sh"
    trainer.write_text("#!/bin/bash\n" + textwrap.dedent(trainer_body)); trainer.chmod(0o755)
    script = (funcs((SBATCH / "grpo.sbatch").read_text()) +
              f'STOP_REQUESTED=0 TRAIN_PID= CKPT_DIR={tmp_path}/ckpt CONFIG=c.yaml OVERRIDES=() CODE_URL= TRAIN_CMD={trainer}\n'
              "trap 'on_stop USR1' USR1\n" + lib.BLOCK_TRAIN + '\necho "RC=$TRAIN_RC START=$START_STEP END=$END_STEP STOP=$STOP_REQUESTED"\n')
    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(int(10 / poll_s)):
        if (tmp_path / "started").exists(): break
        time.sleep(poll_s)
    os.kill(p.pid, signal.SIGUSR1)
    return p.communicate(timeout=30)[0]


def test_signal_reaches_a_background_trainer_and_its_exit_status_is_kept(tmp_path):
    "The USR1 trap forwards the signal; `wait` is retried after the trap; the trainer's own exit status is kept."
    (tmp_path / "ckpt").mkdir(); (tmp_path / "ckpt" / "latest").write_text("step_5\n")
    out = _signal_the_train_block(tmp_path, f"""\
        trap 'echo got-usr1 > {tmp_path}/seen; sleep 0.3; echo 7 > {tmp_path}/ckpt/latest; exit 0' USR1
        touch "$GRPO_NB_READY_FILE"   # as grpo_nb.stop.catch_early does once its handlers are in
        echo started > {tmp_path}/started
        for i in $(seq 200); do sleep 0.05; done
        exit 3
        """)
    assert (tmp_path / "seen").exists(), out
    assert "RC=0 START=5 END=7 STOP=1" in out, out
    assert "got SIGUSR1: asking the trainer (pid" in out


def test_a_signal_before_the_trainer_can_take_it_waits_for_its_handlers(tmp_path):
    "The walltime signal right after the trainer was spawned is forwarded only once the trainer is ready."
    (tmp_path / "ckpt").mkdir()
    out = _signal_the_train_block(tmp_path, f"""\
        echo started > {tmp_path}/started
        sleep 1                        # the seconds grpo_nb spends importing before its handlers exist
        trap 'echo got-usr1 > {tmp_path}/seen; exit 0' USR1
        touch "$GRPO_NB_READY_FILE"
        for i in $(seq 200); do sleep 0.05; done
        exit 3
        """, poll_s=0.01)   # USR1 before the trainer's trap exists: forwarded at once, its default action would kill it
    assert (tmp_path / "seen").exists() and "RC=0" in out and "STOP=1" in out, out


def test_a_foreground_trainer_would_not_get_the_signal_in_time(tmp_path):
    "Why the trainer runs in the background: bash defers a trap until the foreground command ends."
    script = "trap 'echo trapped at $SECONDS' USR1\n(sleep 1.5)\necho done at $SECONDS\n"
    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3); os.kill(p.pid, signal.SIGUSR1)
    out, _ = p.communicate(timeout=10)
    trapped = int(re.search(r"trapped at (\d+)", out).group(1))
    assert trapped >= 1 and out.index("trapped") < out.index("done"), out  # only once the 1.5 s command had finished


# ---- ray_node_setup.sh with a fake `ray` --------------------------------------------------------------
FAKE_RAY = textwrap.dedent("""\
    #!/usr/bin/env python3
    # fake `ray start ... --block`: records its arguments, listens on the dashboard agent port, runs until SIGTERM
    import os, signal, socket, sys, time
    args = sys.argv[1:]
    with open(os.environ["FAKE_RAY_LOG"], "a") as f: f.write(" ".join(args) + "\\n")
    port = int(next(a.split("=")[1] for a in args if a.startswith("--dashboard-agent-listen-port=")))
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", port)); s.listen()
    if "--head" in args:
        g = socket.socket(); g.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        g.bind(("127.0.0.1", int(next(a.split("=")[1] for a in args if a.startswith("--port="))))); g.listen()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("Ray runtime started.", flush=True)
    while True: time.sleep(0.1)
    """)


def free_port_block(n=400) -> int:
    "A base port with `n` free ports above it (best effort)."
    for base in range(41000, 60000, 997):
        ok = True
        for p in (base, base + 4, base + 128, base + 132, base + n):
            with socket.socket() as s:
                try: s.bind(("127.0.0.1", p))
                except OSError: ok = False; break
        if ok: return base
    raise RuntimeError("no free ports")


def test_node_setup_head_and_worker_lifecycle(tmp_path):
    "Head and worker start with explicit ports (the worker shifted: same address), the worker exits 0 once the head leaves."
    bin_ = tmp_path / "bin"; bin_.mkdir()
    (bin_ / "ray").write_text(FAKE_RAY); (bin_ / "ray").chmod(0o755)
    base = free_port_block()
    gcs = base + 300
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", FAKE_RAY_LOG=str(tmp_path / "ray.log"), SLURM_JOB_ID="77",
               RAY_PORT=str(gcs), RAY_NODE_PORT_BASE=str(base), RAY_TMPDIR_BASE=str(tmp_path), RAY_HEAD_POLL_S="0.2",
               NODE_IP_CMD="echo 127.0.0.1", RAY_WAIT_S="30")
    setup = str(SBATCH / "ray_node_setup.sh")
    head = subprocess.Popen(["bash", setup, "head", "0", "n1", "127.0.0.1", "4", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(400):  # grpo.sbatch starts the workers once the head's .up file exists
        if (tmp_path / "ray-77-0.up").exists(): break
        time.sleep(0.05)
    assert (tmp_path / "ray-77-0.up").exists(), "the head never came up"
    worker = subprocess.Popen(["bash", setup, "worker", "1", "n2", "127.0.0.1", "4", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(200):
            log = (tmp_path / "ray.log").read_text() if (tmp_path / "ray.log").exists() else ""
            if log.count("\n") >= 2: break
            time.sleep(0.05)
        head_args, worker_args = log.splitlines()[:2]
        assert "--head" in head_args and f"--port={gcs}" in head_args and f"--node-manager-port={base} " in head_args
        assert '"slurm_node_n1": 1' in head_args and "--num-gpus=4" in head_args and f"--temp-dir={tmp_path}/ray-77-0" in head_args
        assert f"--address=127.0.0.1:{gcs}" in worker_args and f"--node-manager-port={base + 128} " in worker_args  # shifted
        assert '"slurm_node_n2": 1' in worker_args
        time.sleep(0.5)
        assert worker.poll() is None  # the worker stays while the head is there
        os.kill(int((tmp_path / "ray-77-0.pid").read_text()), signal.SIGTERM)  # what grpo.sbatch's stop_ray does
        assert head.wait(timeout=20) == 0
        assert not (tmp_path / "ray-77-0.up").exists()
        assert worker.wait(timeout=20) == 0  # the head left: the worker stops its Ray and exits 0
        out = worker.stdout.read()
        assert "the head is gone" in out, out
    finally:
        for p in (head, worker):
            if p.poll() is None: p.kill()


def test_node_setup_refuses_a_taken_port(tmp_path):
    "Another job's Ray on the same ports: fail at once with the fix, rather than after Ray's 30 s start-up timeout."
    base = free_port_block()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); taken.bind(("127.0.0.1", base + 4)); taken.listen()
        env = dict(os.environ, SLURM_JOB_ID="78", RAY_PORT=str(base + 300), RAY_NODE_PORT_BASE=str(base), RAY_TMPDIR_BASE=str(tmp_path))
        r = subprocess.run(["bash", str(SBATCH / "ray_node_setup.sh"), "head", "0", "n1", "127.0.0.1", "0", "1"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"port {base + 4} on 127.0.0.1 is taken" in r.stdout and "RAY_NODE_PORT_BASE" in r.stdout, r.stdout
    assert "ray start" not in r.stdout  # refused before starting anything


def test_job_env_refuses_a_mismatched_allocation(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"; cfg.write_text("cluster: {nodes: 2, learners_per_node: [4, 4]}\n")
    os.environ["SLURM_JOB_NUM_NODES"] = "1"
    try: rc = preflight.job_env_cli([str(cfg)])
    finally: del os.environ["SLURM_JOB_NUM_NODES"]
    assert rc == 2 and "sbatch --nodes=2" in capsys.readouterr().err


def test_sbatch_command_writes_a_runnable_pair(tmp_path):
    cfg = tmp_path / "c.yaml"; cfg.write_text("cluster: {nodes: 4, gpus_per_node: 8, learners_per_node: [8]}\n")
    out = tmp_path / "site" / "run.sbatch"
    r = subprocess.run([sys.executable, "-c", "import sys; from grpo_nb.slurm import sbatch_cli; sys.exit(sbatch_cli())", str(cfg),
                        "-o", str(out), "--partition=gpu", "--account=proj", "--time=48:00:00", "--network=slingshot",
                        "--module=cuda/12.6", f"--log-dir={tmp_path}/logs", "--rollout.num_engines=8"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    for line in ["#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu", "#SBATCH --account=proj",
                 "#SBATCH --time=48:00:00", "module load cuda/12.6", "export FI_PROVIDER=cxi", f"CONFIG=${{1:-{cfg}}}",
                 "BAKED=(--rollout.num_engines=8 "]:
        assert line in text, line
    assert (tmp_path / "site" / "ray_node_setup.sh").exists() and (tmp_path / "logs").is_dir()
    assert lib.bash_syntax_errors(text) == ""
    bad = subprocess.run([sys.executable, "-c", "import sys; from grpo_nb.slurm import sbatch_cli; sys.exit(sbatch_cli())", str(cfg),
                          "--learner.zero_stage=7"], capture_output=True, text=True)
    assert bad.returncode == 2 and "learner.zero_stage" in bad.stderr


@pytest.mark.parametrize("command", ["sbatch", "preflight"])
def test_help_of_the_commands(command):
    r = subprocess.run([sys.executable, "-c", f"import sys; from grpo_nb.cli import main; sys.exit(main(['{command}', '--help']))"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and f"grpo_nb {command}" in r.stdout, r.stderr


def test_preflight_table_and_exit_codes(tmp_path, capsys):
    model = tmp_path / "m"; model.mkdir(); (model / "config.json").write_text("{}"); (model / "model.safetensors").write_bytes(b"x")
    ok = preflight.preflight_cli(["demo", f"--model.name_or_path={model}", f"--logging.output_dir={tmp_path}/out", f"--log-dir={tmp_path}/logs"])
    out = capsys.readouterr().out
    assert "model" in out and "PASS" in out and "checkpoint dir" in out
    assert ok == (1 if "FAIL" in out else 0)
    bad = preflight.preflight_cli(["demo", f"--model.name_or_path={tmp_path}/missing", f"--logging.output_dir={tmp_path}/out"])
    out = capsys.readouterr().out
    assert bad == 1 and re.search(r"model\s+FAIL", out) and "preflight: FAILED: model" in out
    assert preflight.preflight_cli(["demo", "--learner.zero_stage=9"]) == 2


def test_preflight_passes_on_its_own_demo_preset_and_uses_the_planner():
    "`grpo_nb preflight demo` passes (`tiny-arith@100` is a built-in model); the memory check is the planner's plan_config."
    import contextlib, io
    from grpo_nb.cli import main
    from grpo_nb.config import load_config
    from grpo_nb.memory import GiB, plan_config
    from grpo_nb.preflight import check_memory
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out): rc = main(["preflight", "demo"])
    assert rc == 0 and "model           PASS" in out.getvalue(), out.getvalue()
    for extra in (["--learner.pack_length=8192", "--learner.micro_batch_size=8"], ["--learner.kl_beta=0.05", "--learner.ref_policy=gpu"]):
        cfg = load_config("default", ["--model.name_or_path=Qwen2.5-7B", "--cluster.device=cuda", *extra])
        status, detail = check_memory(cfg)
        assert f"{plan_config(cfg).learner.peak_bytes / GiB:.1f} GiB" in detail, (status, detail)


def test_the_sbatch_check_hint_names_the_log_dir(tmp_path):
    "The printed `check:` line runs preflight against the same --log-dir the script writes to."
    import contextlib, io
    from grpo_nb.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out): rc = main(["sbatch", "demo", "-o", str(tmp_path / "g.sbatch"), "--log-dir", str(tmp_path / "L")])
    line = next(l for l in out.getvalue().splitlines() if l.startswith("check:"))
    assert rc == 0 and f"--log-dir {tmp_path / 'L'}" in line, out.getvalue()


def test_baked_overrides_never_move_a_submitted_config_to_another_runs_directories(tmp_path, monkeypatch):
    "The script once baked --logging.output_dir of run A; submitting config B must refuse before Ray, naming both paths."
    import contextlib, io
    from grpo_nb.preflight import job_env_cli
    b = tmp_path / "b.yaml"
    b.write_text(f"logging:\n  output_dir: {tmp_path / 'runB'}\ncluster:\n  device: cpu\n")
    for k in ("SLURM_JOB_NUM_NODES", "SLURM_GPUS_ON_NODE"): monkeypatch.delenv(k, raising=False)
    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = job_env_cli(list(argv))
        return rc, out.getvalue(), err.getvalue()
    rc, out, err = run("--baked", "1", str(b), f"--logging.output_dir={tmp_path / 'runA'}")
    assert rc == 2 and str(tmp_path / "runA") in err and str(tmp_path / "runB") in err, err
    rc, out, err = run("--baked", "1", str(b), f"--logging.output_dir={tmp_path / 'runA'}", f"--logging.output_dir={tmp_path / 'runC'}")
    assert rc == 0 and f"OUTPUT_DIR={tmp_path / 'runC'}" in out, err   # what is given at submission wins
    rc, out, err = run("--baked", "1", str(b), "--total_steps=7")                 # baked overrides that move nothing are fine
    assert rc == 0 and "TOTAL_STEPS=7" in out, err


def test_the_job_runs_the_preflight_layout_check_before_ray(monkeypatch):
    "A layout that cannot fit (14 learner GPUs asked of 3 nodes x 4) is refused by the job's first step, with the fix."
    import contextlib, io
    from grpo_nb.preflight import job_env_cli
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3"); monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = job_env_cli(["default", "--cluster.device=cuda", "--cluster.nodes=3", "--cluster.gpus_per_node=4",
                          "--cluster.learners_per_node=[4,4,4]", "--rollout.num_engines=2", "--rollout.prompts_per_step=12"])
    assert rc == 2 and "cannot be placed" in err.getvalue() and "Fix:" in err.getvalue(), err.getvalue()
