"""The bootstrap the sbatch scripts use, on loopback: `ray start --head` on one "node", `ray start --address`
on a second one (own --temp-dir, distinct ports), RAY_AUTH_MODE=disabled for head, worker and driver; the driver waits for
both nodes, places a STRICT_SPREAD layout across them, and stops ONLY the processes it started, by their PIDs (SIGTERM to
each `ray start --block`). Never `ray stop`: outside a PID namespace it stops every Ray on the machine, and even inside one
it deletes `$RAY_TMPDIR/ray/ray_current_cluster` (`/tmp/ray/...` when RAY_TMPDIR is unset), which /tmp shares.

The scenario runs as `python tests/test_ray_bootstrap.py bootstrap OUT.json` in its own PID namespace (see test_placement).
"""
import json, os, signal, socket, subprocess, sys, tempfile, time
import pytest
from pathlib import Path
from test_placement import run_isolated, processes_mentioning, ray_tmp  # noqa: F401  (ray_tmp is a fixture)

@pytest.mark.slow  # CI budget: tests/test_slurm_cluster.py bootstraps Ray across two SLURM nodes with `ray start`
def test_two_node_bootstrap_on_loopback(ray_tmp):
    out = Path(ray_tmp) / "bootstrap.json"
    p = run_isolated(__file__, ["bootstrap", str(out)], ray_tmp, timeout=240)
    r = json.loads(out.read_text()) if out.exists() else {}
    assert p.returncode == 0 and r.get("done"), f"scenario failed (rc {p.returncode}):\n{p.stdout[-4000:]}\n{json.dumps(r, indent=1)[:4000]}"
    assert "--head" in r["commands"]["head"] and "--address=127.0.0.1:" + str(r["port"]) in r["commands"]["worker"]
    nodes = r["nodes"]
    assert len(nodes) == 2 and {n["ip"] for n in nodes} == {"127.0.0.1"} and all(n["gpus"] == 2 for n in nodes)
    learners = [x for x in r["reports"] if x["role"] == "learner"]
    assert len({x["node_id"] for x in learners}) == 2  # STRICT_SPREAD across the two "nodes"
    assert r["master"] == "127.0.0.1" and r["progress"]
    assert r["left_after_stop"] == [], r["left_after_stop"]  # SIGTERM to each `ray start --block` stopped its node
    assert all(v["how"] == "SIGTERM" for v in r["stopped"].values()), r["stopped"]
    assert not processes_mentioning(ray_tmp)

def _free_ports(n:int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks: s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks: s.close()
    return ports

def _wait_started(log:Path, proc, timeout_s:float) -> float:
    "Seconds until `ray start` prints that its node is up; fail early if it exited."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if "Ray runtime started" in log.read_text(errors="replace"): return round(time.monotonic() - t0, 1)
        if proc.poll() is not None: raise RuntimeError(f"ray start exited with {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"ray start not up after {timeout_s} s: {log.read_text()[-2000:]}")

def _stop(proc, timeout_s:float=30) -> dict:
    "Stop one `ray start --block` we started, by its PID: SIGTERM, then SIGKILL if it does not exit."
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try: proc.wait(timeout_s); how = "SIGTERM"
    except subprocess.TimeoutExpired: proc.kill(); proc.wait(); how = "SIGKILL"
    return {"how": how, "returncode": proc.returncode, "seconds": round(time.monotonic() - t0, 2)}

def scenario_bootstrap(out:Path):
    import ray
    from grpo_nb import placement as P
    tmp, res, procs = os.environ["RAY_TMPDIR"], {}, {}
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port, *ports = _free_ports(10)
    # two nodes on one host must not share these ports; a test needs no log streaming
    node_opts = lambda ps: {"dashboard-agent-listen-port": ps[0], "dashboard-agent-grpc-port": ps[1], "metrics-export-port": ps[2],
                            "runtime-env-agent-port": ps[3], "include-log-monitor": "false"}
    common = dict(num_gpus=2, num_cpus=2, object_store_memory=80 * 2**20, ray_bin=ray_bin)
    cmds = {"head": P.ray_start_args("head", "127.0.0.1", port, temp_dir=f"{tmp}/head",
                                     options=node_opts(ports[:4]), **common),
            "worker": P.ray_start_args("worker", "127.0.0.1", port, node_ip="127.0.0.1", temp_dir=f"{tmp}/worker",
                                       options=node_opts(ports[4:8]), **common)}
    res.update(port=port, commands={k: " ".join(v) for k, v in cmds.items()})
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # head, worker and (below) driver alike
    try:
        for name in ("head", "worker"):  # the sbatch scripts do the same: head first, then the workers join
            log = Path(f"{tmp}/{name}.log")
            procs[name] = subprocess.Popen(cmds[name], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
            res[f"{name}_up_s"] = _wait_started(log, procs[name], 150)
        ray.init(address=f"127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)
        progress = []
        res["nodes"] = P.wait_for_nodes(2, 4, timeout_s=120, poll_s=0.5, progress=progress.append, expected_ips=["127.0.0.1"])
        res["progress"] = progress
        lay = P.plan_layout(2, 2, [1, 1], 2, cpus_per_learner=0.5, cpus_per_engine_worker=0.5)
        g = P.create_placement_groups(lay, timeout_s=30)
        try:
            res["reports"] = P.probe_placement(g)
            res["master"] = P.check_placement(lay, res["reports"])
        finally: g.remove()
        ray.shutdown()
        res["stopped"] = {name: _stop(procs.pop(name)) for name in ("worker", "head")}
        time.sleep(1)
        res["left_after_stop"] = [c for c in processes_mentioning(tmp) if not c.startswith(f"{os.getpid()}:")]
        res["done"] = True
    finally:
        for name, proc in procs.items():  # only on failure: what is still running of ours
            res.setdefault("stopped", {})[name] = _stop(proc, 10)
        for name in ("head", "worker"):
            try: res.setdefault("logs", {})[name] = Path(f"{tmp}/{name}.log").read_text()[-1500:]
            except OSError: pass
        out.write_text(json.dumps(res, indent=1, default=str))

if __name__ == "__main__":
    {"bootstrap": scenario_bootstrap}[sys.argv[1]](Path(sys.argv[2]))


BUSY_START = r'''
import json, sys, time
import ray
from grpo_nb.config import load_config
from grpo_nb.placement import Layout
from grpo_nb.trainer import start_ray
cfg = load_config("demo")
layout = Layout.from_config(cfg, cfg.cluster.cpus_per_learner, cfg.cluster.cpus_per_engine_worker)
t0 = time.monotonic()
c = start_ray(cfg, layout, sys.argv[1])
res = {"start_s": time.monotonic() - t0, "cpus": ray.cluster_resources().get("CPU")}
ray.shutdown(); c.shutdown()
print(json.dumps(res))
'''

def test_the_trainers_ray_start_on_a_machine_with_every_core_busy(ray_tmp):
    "The GRPO trainer's local Ray start while another process keeps every core busy: it comes up, and it leaves nothing behind."
    load = subprocess.Popen([sys.executable, "-c", "import multiprocessing as m, os\n"
                             "def spin():\n    while True: pass\n"
                             "ps = [m.Process(target=spin, daemon=True) for _ in range(os.cpu_count())]\n[p.start() for p in ps]; [p.join() for p in ps]"],
                            start_new_session=True)
    try:
        time.sleep(1)   # the cores are busy before Ray starts
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        p = subprocess.run([sys.executable, "-c", BUSY_START, str(Path(ray_tmp) / "ray")], env=env, capture_output=True, text=True, timeout=400)
    finally:
        os.killpg(load.pid, signal.SIGKILL); load.wait()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["cpus"] >= 2, r
    time.sleep(1)
    assert not processes_mentioning(ray_tmp)


def test_a_failed_ray_start_names_the_cause(monkeypatch):
    "After its last try, the start says what failed, the load it saw and the fix."
    import ray.cluster_utils
    from grpo_nb.actors import local_ray_node
    def fail(self, **kw): raise RuntimeError("The current node timed out during startup.")
    monkeypatch.setattr(ray.cluster_utils.Cluster, "add_node", fail)
    with pytest.raises(RuntimeError, match=r"did not start on this machine in 2 tries \(load average .*timed out during startup.*--cluster.ray_address=auto"):
        local_ray_node(2, attempts=2)


def test_a_local_node_starts_where_rays_default_directory_is_missing(tmp_path, monkeypatch):
    "A fresh machine: Ray's default directory (here RAY_TMPDIR/ray) does not exist yet and the session lives elsewhere; Ray still writes the cluster's address there."
    from grpo_nb.actors import local_ray_node
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "fresh"))
    (tmp_path / "fresh").mkdir()
    c = local_ray_node(2, object_store_bytes=100 * 2**20, temp_dir=tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    try: assert (tmp_path / "fresh" / "ray" / "ray_current_cluster").exists()
    finally: c.shutdown()
