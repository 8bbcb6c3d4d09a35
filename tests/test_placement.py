"""Layouts, their refusals, `grpo_nb layout`, and placement on a real multi-node Ray cluster.

The live part runs `ray.cluster_utils.Cluster` (3 nodes x 4 logical GPUs) in a child process that this file starts
inside its own PID namespace (`unshare --pid --fork --mount-proc`), so every Ray process it starts dies with it, even
when Ray fails half-way through starting; without `unshare` the child gets its own session and its process group is
killed by id. The child is this file run as a script: `python tests/test_placement.py cluster OUT.json`.
"""
import json, os, shutil, signal, subprocess, sys, tempfile, time
from pathlib import Path
import pytest
from grpo_nb.placement import (PlacementError, Layout, LearnerSlot, SEED_LAYOUTS, plan_layout, layout_cli, sync_rank,
                               check_placement, learner_env, layout_table, ray_start_args)
from grpo_nb.config import load_config, TrainConfig

# ----------------------------------------------------------------------------------------------------------------------
# The plan (pure)

def test_seed_layouts_worked_through():
    big = plan_layout(**SEED_LAYOUTS["7B on 5 × 8 GPUs (open-instruct)"])
    assert (big.learner_world_size, big.num_engines, big.idle_gpus, big.learner_strategy) == (8, 32, 0, "PACK")
    assert big.learner_bundles == ({"GPU": 8, "CPU": 8},)
    port = plan_layout(**SEED_LAYOUTS["7B on 10 × 4 GPUs (Isambard port)"])
    assert (port.learner_world_size, port.sync_world_size, port.idle_gpus, port.learner_strategy) == (20, 21, 0, "STRICT_SPREAD")
    assert port.learner_bundles == ({"GPU": 2, "CPU": 2},) * 10 and port.engine_bundles == ({"GPU": 1, "CPU": 1},) * 20
    assert all(r == (f"L{2 * n}", f"L{2 * n + 1}", f"E{2 * n}", f"E{2 * n + 1}") for n, r in enumerate(port.node_roles))
    one = plan_layout(**SEED_LAYOUTS["32B on 16 × 4, 1 learner/node, TP 2"])
    packed = plan_layout(**SEED_LAYOUTS["32B on 16 × 4, 16 learners on 4 nodes, TP 2"])
    assert (one.num_engines, one.idle_gpus, one.sync_world_size) == (16, 16, 33)
    assert (packed.num_engines, packed.idle_gpus, packed.sync_world_size) == (24, 0, 49)
    with pytest.raises(PlacementError, match="a node has 4 GPUs"): plan_layout(**SEED_LAYOUTS["7B recipe copied to 4-GPU nodes"])
    with pytest.raises(PlacementError, match="hold at most 16"): plan_layout(**SEED_LAYOUTS["32B, same, asking 24 engines"])

REFUSED = [  # (plan_layout kwargs, texts the message must contain: the numbers and the fix)
    (dict(nodes=5, gpus_per_node=4, learners_per_node=[8], num_engines=0), ["8 GPUs in one bundle", "a node has 4 GPUs", "--learners-per-node 4 4"]),
    (dict(nodes=2, gpus_per_node=4, learners_per_node=[2, 2, 2], num_engines=2), ["3 learner bundles", "2 node(s)", "--nodes 3", "--learners-per-node 3 3"]),
    (dict(nodes=2, gpus_per_node=4, learners_per_node=[1, 1], num_engines=1, tp=8), ["TP=8 needs 8 GPUs on one node", "--tp 4"]),
    (dict(nodes=3, gpus_per_node=4, learners_per_node=[2, 2, 2], num_engines=7), ["= 13 GPUs", "3 × 4 = 12", "--engines 6", "--nodes 4"]),
    (dict(nodes=16, gpus_per_node=4, learners_per_node=[1] * 16, num_engines=24, tp=2),
     ["hold at most 16 engine(s)", "48 free in total", "--engines 16", "--nodes 20", "--learners-per-node 4 4 4 4"]),
    (dict(nodes=2, gpus_per_node=4, learners_per_node=[3, 3], num_engines=1, tp=2), ["free GPUs per node [1, 1]", "hold at most 0", "--nodes 3"]),
    (dict(nodes=2, gpus_per_node=4, learners_per_node=[2, 2], num_engines=4, cpus_per_node=4, cpus_per_engine_worker=2),
     ["reserve 2 CPUs each", "[2, 2]", "--engines 2"]),
    (dict(nodes=1, gpus_per_node=4, learners_per_node=[4], num_engines=0, cpus_per_node=2), ["reserves 4 × 1 = 4 CPUs", "--cpus-per-learner 0.5"]),
    (dict(nodes=1, gpus_per_node=0, learners_per_node=[2], num_engines=1, device="cpu", cpus_per_node=2), ["= 3 CPUs", "1 × 2 = 2", "smaller CPU requests"]),
    (dict(nodes=1, gpus_per_node=0, learners_per_node=[1], num_engines=1), ["--device cpu"]),
    (dict(nodes=1, gpus_per_node=4, learners_per_node=[], num_engines=1), ["one positive count per learner node"]),
    (dict(nodes=1, gpus_per_node=4, learners_per_node=[1], num_engines=-1), ["--engines must be at least 0"]),
]

@pytest.mark.parametrize("kw,texts", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_impossible_layouts_are_refused_with_numbers_and_fix(kw, texts):
    with pytest.raises(PlacementError) as e: plan_layout(**kw)
    assert isinstance(e.value, ValueError) and " Fix: " in str(e.value)
    for t in texts: assert t in str(e.value), (t, str(e.value))

def test_the_suggested_fixes_work():
    "Every fix offered for the 32B packing failure is itself a valid layout."
    kw = dict(nodes=16, gpus_per_node=4, learners_per_node=[1] * 16, num_engines=24, tp=2)
    for change in [dict(num_engines=16), dict(nodes=20), dict(learners_per_node=[4, 4, 4, 4])]:
        assert plan_layout(**{**kw, **change}).num_engines == change.get("num_engines", 24)

def test_ranks_and_weight_sync_group():
    lay = plan_layout(1, 8, [4], 2, tp=2)
    assert lay.learner_strategy == "PACK" and lay.learners[3] == LearnerSlot(rank=3, bundle=0, local_rank=3, node=0)
    assert [e.sync_ranks for e in lay.engines] == [(1, 2), (3, 4)] and lay.sync_world_size == 5
    assert lay.node_roles[0] == ("L0", "L1", "L2", "L3", "E0.0", "E0.1", "E1.0", "E1.1")
    spread = plan_layout(3, 4, [1, 1, 1], 3, tp=2)
    assert [(s.rank, s.bundle, s.local_rank) for s in spread.learners] == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]
    assert [e.node for e in spread.engines] == [0, 1, 2] and spread.idle_gpus == 3
    assert sorted(r for e in spread.engines for r in e.sync_ranks) == list(range(1, spread.sync_world_size))
    assert [sync_rank(i, j, 2) for i in range(3) for j in range(2)] == [1, 2, 3, 4, 5, 6]
    env = learner_env(plan_layout(2, 4, [2, 2], 4), 3, "10.0.0.1", 29500)
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "0",
                   "LOCAL_WORLD_SIZE": "1", "GRPO_NODE_LOCAL_RANK": "1", "GRPO_LEARNER_BUNDLE": "1"}

def test_cpu_layouts_and_config():
    demo = Layout.from_config(load_config("demo"))
    assert (demo.device, demo.learner_bundles, demo.engine_bundles, demo.idle_gpus) == ("cpu", ({"CPU": 1},), ({"CPU": 1},), 0)
    tp2 = plan_layout(1, 0, [1], 1, tp=2, device="cpu", cpus_per_learner=0.5, cpus_per_engine_worker=0.5)
    assert tp2.engine_bundles == ({"CPU": 1},) and tp2.learner_bundles == ({"CPU": 0.5},) and tp2.engine_gpus == 0
    assert Layout.from_config(TrainConfig()).idle_gpus == 3
    cfg = load_config("default", ["--cluster.nodes=10", "--cluster.gpus_per_node=4", "--cluster.learners_per_node=[2,2,2,2,2,2,2,2,2,2]",
                                  "--rollout.num_engines=20", "--rollout.prompts_per_step=20", "--learner.micro_batch_size=1"])
    assert Layout.from_config(cfg) == plan_layout(**SEED_LAYOUTS["7B on 10 × 4 GPUs (Isambard port)"])

def test_check_placement_catches_shared_gpus():
    lay = plan_layout(1, 4, [2], 1)
    rep = [{"role": "learner", "rank": 0, "bundle": 0, "node_id": "a", "ip": "10.0.0.1", "gpu_ids": ["0"]},
           {"role": "learner", "rank": 1, "bundle": 0, "node_id": "a", "ip": "10.0.0.1", "gpu_ids": ["1"]},
           {"role": "engine", "rank": 0, "bundle": 0, "node_id": "a", "ip": "10.0.0.1", "gpu_ids": ["2"]}]
    assert check_placement(lay, rep) == "10.0.0.1"
    with pytest.raises(PlacementError, match="learner 1 and engine 0 share GPU 1 on node a"): check_placement(lay, rep[:2] + [{**rep[2], "gpu_ids": ["1"]}])
    with pytest.raises(PlacementError, match="Duplicate GPU detected"):  # same physical GPU behind different ids
        check_placement(lay, [{**r, "gpu_uuids": ["GPU-same"]} for r in rep])
    spread = plan_layout(2, 4, [1, 1], 0)
    with pytest.raises(PlacementError, match="STRICT_SPREAD"):
        check_placement(spread, [{**rep[0]}, {**rep[1], "bundle": 1}])

def _cli(*args):
    return subprocess.run([sys.executable, "-c", "import sys; from grpo_nb.cli import main; sys.exit(main(sys.argv[1:]))", "layout", *args],
                          capture_output=True, text=True, timeout=60)

def test_layout_cli():
    ok = _cli("--nodes", "10", "--gpus-per-node", "4", "--learners-per-node", *["2"] * 10, "--engines", "20", "--tp", "1", "--json")
    assert ok.returncode == 0, ok.stderr
    d = json.loads(ok.stdout)
    assert (d["learner_world_size"], d["sync_world_size"], d["idle_gpus"], len(d["learner_bundles"]), len(d["engine_bundles"])) == (20, 21, 0, 10, 20)
    assert d["learner_strategy"] == "STRICT_SPREAD" and d["engines"][3]["sync_ranks"] == [4]
    table = _cli("--nodes", "16", "--gpus-per-node", "4", "--learners-per-node", *["1"] * 16, "--engines", "16", "--tp", "2")
    assert table.returncode == 0 and "idle GPUs: 16" in table.stdout and "nodes 0-15" in table.stdout
    bad = _cli("--nodes", "16", "--gpus-per-node", "4", "--learners-per-node", *["1"] * 16, "--engines", "24", "--tp", "2")
    assert bad.returncode == 2 and "hold at most 16" in bad.stderr and "Fix:" in bad.stderr and not bad.stdout
    demo = _cli("--config", "demo", "--json")
    assert demo.returncode == 0 and json.loads(demo.stdout)["device"] == "cpu"
    assert layout_cli(["--gpus-per-node", "4", "--learners-per-node", "2", "--engines", "2"]) == 0  # in-process, default config
    assert _cli("--config", "no-such.yaml").returncode == 2

# ----------------------------------------------------------------------------------------------------------------------
# Running Ray in a process tree that is certain to die

NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--net"]

def can_unshare() -> bool:
    "Whether we may create PID + network namespaces here (root, or user namespaces enabled) and bring loopback up in them."
    if not (shutil.which("unshare") and shutil.which("ip")): return False
    try: return subprocess.run(NAMESPACE + ["ip", "link", "set", "lo", "up"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired): return False

def ray_env(tmp:str) -> dict:
    """Environment of every Ray process we start: no auth tokens, no usage stats, Ray's files under our own temp dir, and
    Python bytecode cached outside the repo (each Ray process imports ray anew; compiled once it starts about 20% faster)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": tmp, "TMPDIR": tmp,
            "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0",
            "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "grpo-nb-pycache"))}

def run_isolated(script:str, args:list, tmp:str, timeout:float) -> subprocess.CompletedProcess:
    """Run `python script args` in its own PID and network namespaces: every process it starts dies with it, its ports
    cannot collide with anyone's, and Ray sees only loopback (outside a network namespace Ray replaces 127.0.0.1 by the
    machine's address). Without namespaces: its own session, whose process group is killed by id afterwards."""
    cmd, ns = [sys.executable, str(Path(script).resolve()), *args], can_unshare()
    if ns: cmd = NAMESPACE + ["sh", "-c", 'ip link set lo up && exec "$@"', "sh"] + cmd
    p = subprocess.Popen(cmd, env=ray_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=not ns)
    try: out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill(); out, _ = p.communicate()  # unshare --kill-child takes the whole namespace with it
    finally:
        if not ns:  # the process group of the session we created, killed by its id
            try: os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError: pass
    return subprocess.CompletedProcess(cmd, p.returncode, out, "")

def processes_mentioning(text:str) -> list[str]:
    "Command lines of live processes that mention `text` (our temp dir): what would have leaked."
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try: cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError: continue
        if text in cmd: found.append(f"{pid}: {cmd[:160]}")
    return found

@pytest.fixture
def ray_tmp():
    d = tempfile.mkdtemp(prefix="rp", dir="/tmp")  # short: Ray's socket paths must stay under 107 characters
    yield d
    shutil.rmtree(d, ignore_errors=True)

# ----------------------------------------------------------------------------------------------------------------------
# The live cluster

def test_placement_on_a_real_three_node_cluster(ray_tmp):
    out = Path(ray_tmp) / "cluster.json"
    p = run_isolated(__file__, ["cluster", str(out)], ray_tmp, timeout=240)
    r = json.loads(out.read_text()) if out.exists() else {}
    assert p.returncode == 0 and r.get("done"), f"scenario failed (rc {p.returncode}):\n{p.stdout[-4000:]}\n{json.dumps(r, indent=1)[:3000]}"
    assert not processes_mentioning(ray_tmp)
    # the nodes joined, with progress lines and a timeout that names what is missing
    assert len(r["nodes"]) == 3 and all(n["gpus"] == 4 for n in r["nodes"]) and r["progress"]
    assert "only 3 of 4 nodes" in r["wait_timeout"]["error"] and "missing: 10.9.9.9" in r["wait_timeout"]["error"]
    # 7B scaled down (10 x 4, two learners a node, two engines a node -> 3 x 4): STRICT_SPREAD, one learner bundle a node
    s = r["seven_b"]
    learners = [x for x in s["reports"] if x["role"] == "learner"]
    assert len({x["node_id"] for x in learners}) == 3 and len(set(s["bundle_nodes"]["learners"])) == 3
    for b in range(3): assert len({x["node_id"] for x in learners if x["bundle"] == b}) == 1
    gpus = [(x["node_id"], g) for x in s["reports"] for g in x["gpu_ids"]]
    assert len(gpus) == 12 and len(set(gpus)) == 12  # every logical GPU of the cluster owned exactly once
    assert all(x["cuda_visible_devices"] == ",".join(x["gpu_ids"]) for x in s["reports"])
    assert s["master"] == next(x["ip"] for x in learners if x["rank"] == 0)
    # 32B scaled down (16 x 4, one learner a node, TP 2 -> 3 x 4): one TP-2 engine a node, one idle GPU a node
    t = r["thirty_two_b"]
    engines = [x for x in t["reports"] if x["role"] == "engine"]
    assert all(len(x["gpu_ids"]) == 2 for x in engines) and len({x["node_id"] for x in engines}) == 3
    assert [x["sync_ranks"] for x in engines] == [[1, 2], [3, 4], [5, 6]]
    assert "is still not placed after 3 s" in t["pending_error"] and "4 GPU (1 free)" in t["pending_error"] and t["pending_seconds"] < 30
    # never-placeable groups are refused within seconds, never a hang
    assert "INFEASIBLE" in r["infeasible"]["error"] and r["infeasible"]["seconds"] < 30
    assert "4 learner bundles need 4 nodes" in r["precheck"]["error"] and r["precheck"]["seconds"] < 5
    # per-GPU bundles in a PACK group do not honour "two learners a node": the reason for one bundle per learner node
    assert sorted(r["pack_per_gpu_bundles"]) != [2, 2, 2], r["pack_per_gpu_bundles"]
    # colocated: learner i and engine i on one GPU of one node, the learners on different GPUs
    c = r["colocated"]
    assert "error" not in c, c
    at = {(x["role"], x["rank"]): (x["node_id"], tuple(x["gpu_ids"])) for x in c["reports"]}
    assert at[("learner", 0)] == at[("engine", 0)] and at[("learner", 1)] == at[("engine", 1)] and at[("learner", 0)] != at[("learner", 1)]
    # a CPU layout (CI, make demo) places actors with CPUs only
    assert all(x["gpu_ids"] == [] for x in r["cpu"]["reports"]) and len(r["cpu"]["reports"]) == 2
    # and with num_gpus=0 Ray leaves CUDA_VISIBLE_DEVICES as it was (all GPUs visible on a GPU node): never 0 GPUs in a GPU bundle
    assert all(x["cuda_visible_devices"] == r["driver_cuda_visible_devices"] for x in r["cpu"]["reports"])

# ----------------------------------------------------------------------------------------------------------------------
# The scenario, run as a script inside the namespace

def _step(result:dict, name:str, out:Path, fn):
    "Run one part of the scenario; keep its result or its error in the JSON (written after every step)."
    t0 = time.monotonic()
    try: result[name] = fn()
    except Exception as e: result[name] = {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    result.setdefault("timings", {})[name] = round(time.monotonic() - t0, 2)
    out.write_text(json.dumps(result, indent=1, default=str))

def _expect_error(fn) -> dict:
    t0 = time.monotonic()
    try: fn()
    except PlacementError as e: return {"error": str(e), "seconds": time.monotonic() - t0}
    raise AssertionError("no PlacementError")

def _kill_rest_of_namespace():
    "In our own PID namespace (we are pid 1) every other process is ours: kill them (what a failed start left behind)."
    if os.getpid() != 1: return
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) != 1:
            try: os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError: pass

def start_cluster(nodes:int, gpus:int, cpus:int, attempts:int=3):
    """`nodes` Ray nodes on this machine, each with `gpus` logical GPUs. Retried: on a loaded machine a raylet gives up after
    15 s waiting for its dashboard agent ("Timed out waiting for file .../metrics_agent_port_...")."""
    from ray.cluster_utils import Cluster
    args = dict(num_cpus=cpus, num_gpus=gpus, object_store_memory=80 * 2**20, include_log_monitor=False)
    for attempt in range(1, attempts + 1):
        cluster = Cluster(initialize_head=False)
        try:
            for i in range(nodes): cluster.add_node(**args, **({"include_dashboard": False} if i == 0 else {}))
            return cluster, attempt
        except Exception:
            cluster.shutdown(); _kill_rest_of_namespace()
            if attempt == attempts: raise

def scenario_cluster(out:Path):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from grpo_nb import placement as P
    res = {"driver_cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    cluster, res["start_attempts"] = start_cluster(3, 4, 2)
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        progress = []
        res["nodes"] = P.wait_for_nodes(3, 12, timeout_s=60, poll_s=0.5, progress=progress.append)
        res["progress"] = progress
        _step(res, "wait_timeout", out, lambda: _expect_error(lambda: P.wait_for_nodes(4, timeout_s=1, expected_ips=["127.0.0.1", "10.9.9.9"])))

        def pack_per_gpu():  # first, while Ray's view of free resources is fresh (PACK is best effort)
            pg = placement_group([{"GPU": 1, "CPU": 0.1}] * 6, strategy="PACK")
            try:
                assert pg.wait(30)
                nodes = list(placement_group_table(pg)["bundles_to_node_id"].values())
                return sorted((nodes.count(n) for n in set(nodes)), reverse=True)
            finally: remove_placement_group(pg)
        _step(res, "pack_per_gpu_bundles", out, pack_per_gpu)

        def seven_b():
            lay = P.plan_layout(3, 4, [2, 2, 2], 6, cpus_per_learner=0.25, cpus_per_engine_worker=0.25)
            g = P.create_placement_groups(lay, timeout_s=30)
            try:
                reps = P.probe_placement(g)
                return {"reports": reps, "bundle_nodes": g.bundle_nodes(), "master": P.check_placement(lay, reps)}
            finally: g.remove()
        _step(res, "seven_b", out, seven_b)

        def thirty_two_b():
            lay = P.plan_layout(3, 4, [1, 1, 1], 3, tp=2, cpus_per_learner=0.25, cpus_per_engine_worker=0.25)
            g = P.create_placement_groups(lay, timeout_s=30)
            try:
                reps = P.probe_placement(g)
                P.check_placement(lay, reps)
                extra = placement_group([{"GPU": 2}], strategy="PACK")  # a 4th TP-2 engine: 3 GPUs are free, one per node
                try: pending = _expect_error(lambda: P.wait_for_group(extra, "engine", timeout_s=3))
                finally: remove_placement_group(extra)
                return {"reports": reps, "pending_error": pending["error"], "pending_seconds": pending["seconds"]}
            finally: g.remove()
        _step(res, "thirty_two_b", out, thirty_two_b)

        four = P.plan_layout(4, 4, [1, 1, 1, 1], 0, cpus_per_learner=0.25)
        _step(res, "precheck", out, lambda: _expect_error(lambda: P.create_placement_groups(four, timeout_s=30)))
        _step(res, "infeasible", out, lambda: _expect_error(lambda: P.create_placement_groups(four, timeout_s=60, check=False)))

        def colocated():   # engine i in learner i's bundle, half a GPU each: Ray must give both the same GPU
            lay = P.plan_colocated(3, 4, [2], 2, cpus_per_learner=0.25, cpus_per_engine_worker=0.25)
            g = P.create_placement_groups(lay, timeout_s=30)
            try:
                reps = P.probe_placement(g)
                return {"reports": reps, "master": P.check_placement(lay, reps)}
            finally: g.remove()
        _step(res, "colocated", out, colocated)

        def cpu():
            lay = P.plan_layout(1, 0, [1], 1, device="cpu", cpus_per_learner=0.25, cpus_per_engine_worker=0.25)
            g = P.create_placement_groups(lay, timeout_s=30)
            try:
                reps = P.probe_placement(g); P.check_placement(lay, reps)
                return {"reports": reps}
            finally: g.remove()
        _step(res, "cpu", out, cpu)
        res["done"] = True
    finally:
        out.write_text(json.dumps(res, indent=1, default=str))
        ray.shutdown(); cluster.shutdown()

if __name__ == "__main__":
    {"cluster": scenario_cluster}[sys.argv[1]](Path(sys.argv[2]))
