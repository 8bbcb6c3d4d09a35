"""A real SLURM (Debian's slurmctld + slurmd + munge) on this one machine, for tests.

`LocalSlurm` brings up munged, one slurmctld and one slurmd per emulated node (Debian builds slurmd with
MULTIPLE_SLURMD, so `slurmd -N n1`, `slurmd -N n2` emulate two nodes on one host) with fake GPUs declared
through GRES (files that are symlinks to /dev/null). Everything lives under a temporary directory and
inside a network namespace this harness creates, so:

- nothing system-wide is read or written (no /etc/slurm, /etc/munge, /run/munge);
- Ray clusters started by jobs bind loopback addresses inside the namespace and cannot collide with
  Ray clusters that other processes on this machine run at the same time;
- teardown is exact: every process whose network namespace is ours was started by us (the daemons, the
  jobs, their Ray processes), so `stop()` signals exactly those PIDs (SIGTERM, then SIGKILL; slurmd ignores
  SIGTERM while it retries a dead controller).

Debian's slurmctld/slurmd/munge, a private munge key, every path under a temp dir, emulated nodes on loopback.

    with LocalSlurm(nodes=2, gpus_per_node=4) as s:
        job = s.sbatch("sbatch/grpo.sbatch", "cfg.yaml")
        s.wait_done([job])
"""
from __future__ import annotations
import os, re, shutil, signal, subprocess, sys, tempfile, time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
SHADOW = 'raise ImportError("not loaded in the SLURM tests: it builds a Lark grammar at import")\n'

TOOLS = ["slurmctld", "slurmd", "sbatch", "munged", "mungekey", "unshare", "nsenter", "ip"]


def missing_tools() -> list[str]:
    "Programs the harness needs that are not on PATH."
    return [d for d in TOOLS if shutil.which(d) is None]


def ensure_installed(quiet:bool=True) -> float:
    "Install Debian's SLURM and munge with apt-get when missing (we are root in CI); returns seconds spent."
    if not missing_tools(): return 0.0
    if os.geteuid() != 0: raise RuntimeError(f"SLURM is not installed ({missing_tools()}) and installing it needs root.")
    t0, out = time.time(), subprocess.DEVNULL if quiet else None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, stdout=out, stderr=out, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                   check=True, stdout=out, stderr=out, env=env)
    if missing_tools(): raise RuntimeError(f"still missing after apt-get install: {missing_tools()}")
    return time.time() - t0


def slurm_conf(root:Path, nodes:int, gpus_per_node:int, cpus_per_node:int, mem_mb:int) -> str:
    "slurm.conf of the local cluster: every path under `root`, emulated nodes n1..nN on loopback."
    r = root
    last = nodes
    return "\n".join([
        "ClusterName=grpotest",
        "SlurmctldHost=localhost",
        "SlurmctldPort=6817",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={r}/munge/munge.socket",
        f"StateSaveLocation={r}/state",
        f"SlurmdSpoolDir={r}/spool/%n",
        f"SlurmctldPidFile={r}/run/slurmctld.pid",
        f"SlurmdPidFile={r}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={r}/log/slurmctld.log",
        f"SlurmdLogFile={r}/log/slurmd-%n.log",
        f"PlugStackConfig={r}/plugstack.conf",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={r}/log/jobcomp.txt",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",  # start a chained job as soon as its dependency ends
        "MpiDefault=none",
        "ReturnToService=2",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "MinJobAge=3600",      # keep finished jobs visible to scontrol for the whole test
        "KillWait=5",          # seconds between SIGTERM and SIGKILL at the time limit
        "InactiveLimit=0",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName=n[1-{last}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-{17000 + last}] "
        f"CPUs={cpus_per_node} RealMemory={mem_mb} Gres=gpu:{gpus_per_node} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ""])


class LocalSlurm:
    "A throw-away SLURM cluster of `nodes` emulated nodes × `gpus_per_node` fake GPUs, in its own network namespace."
    def __init__(self, nodes:int=2, gpus_per_node:int=4, cpus_per_node:int=2, mem_mb:int=12000, root:str|None=None):
        self.nodes, self.gpus_per_node, self.cpus_per_node, self.mem_mb = nodes, gpus_per_node, cpus_per_node, mem_mb
        self.root = Path(root or tempfile.mkdtemp(prefix="slurm-"))
        self.conf = self.root / "etc" / "slurm.conf"
        self.netns_pid:int|None = None
        self.netns:str|None = None
        self.procs:list[subprocess.Popen] = []
        self.timings:dict[str, float] = {}

    # -- running things inside the namespace --------------------------------------------------------
    def env(self, **extra) -> dict:
        """Environment for SLURM clients and jobs: our slurm.conf, a private HOME and TMPDIR, and two speed-ups for
        the many Python processes a Ray bring-up starts on 2 cores: a bytecode cache (the venv has no .pyc files and
        PYTHONDONTWRITEBYTECODE may be set) and a stand-in for `rfc3987_syntax`, which jsonschema imports when
        present and which builds a Lark grammar at import time (about 2 s of CPU in every `import ray`)."""
        e = dict(os.environ, SLURM_CONF=str(self.conf), HOME=str(self.root / "home"), TMPDIR=str(self.root / "tmp"),
                 PYTHONPYCACHEPREFIX=str(self.root / "pycache"),
                 PYTHONPATH=os.pathsep.join(filter(None, [str(self.root / "pyshadow"), os.environ.get("PYTHONPATH", "")])))
        e.pop("PYTHONDONTWRITEBYTECODE", None)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def cmd(self, *argv) -> list[str]:
        "`argv` prefixed so that it runs in our network namespace."
        return ["nsenter", "-t", str(self.netns_pid), "-n", "--", *map(str, argv)]

    def run(self, *argv, check:bool=True, env:dict|None=None, timeout:float=60, **kw) -> subprocess.CompletedProcess:
        "Run a command (e.g. `sbatch`, `squeue`) inside the namespace and return its completed process."
        return subprocess.run(self.cmd(*argv), check=check, capture_output=True, text=True,
                              env=env or self.env(), timeout=timeout, **kw)

    def _spawn(self, *argv, log:str) -> subprocess.Popen:
        f = open(self.root / "log" / log, "ab")
        p = subprocess.Popen(self.cmd(*argv), stdout=f, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        f.close()
        self.procs.append(p)
        return p

    # -- bring-up -----------------------------------------------------------------------------------
    WARM_MODULES = ["ray", "ray.scripts.scripts", "ray.dashboard.agent", "ray._private.log_monitor",
                    "ray.autoscaler._private.monitor", "ray.util.client.server.server",
                    "ray._private.runtime_env.agent.main", "ray._private.workers.default_worker", "grpo_nb.preflight", "grpo_nb.slurm"]

    def warm_start(self, python:str=sys.executable) -> subprocess.Popen:
        """Fill this cluster's bytecode cache with what every Ray start imports, in the background (run it while apt-get
        installs SLURM): the first job's Ray then starts as fast as the later ones. The modules are imported with the
        bytecode that sits beside their sources (the venv is installed with it), then each one's file is linked into
        the cache; only modules without one (this repository's) are compiled. Python checks every cached file against
        its source as usual and writes a fresh one in place of a link that has gone stale."""
        (self.root / "pycache").mkdir(parents=True, exist_ok=True); (self.root / "pyshadow").mkdir(exist_ok=True)
        (self.root / "pyshadow" / "rfc3987_syntax.py").write_text(SHADOW)
        code = ("import importlib, importlib.util, os, pkgutil, py_compile, sys\n"
                "prefix, sys.pycache_prefix, sys.dont_write_bytecode = sys.pycache_prefix, None, True\n"
                f"for n in {self.WARM_MODULES!r}:\n"
                "    try: importlib.import_module(n)\n"
                "    except Exception: pass\n"
                "import ray.dashboard.modules as m\n"
                "for i in pkgutil.walk_packages(m.__path__, 'ray.dashboard.modules.'):\n"
                "    try: importlib.import_module(i.name)\n"
                "    except Exception: pass\n"
                "for mod in list(sys.modules.values()):\n"
                "    src = getattr(mod, '__file__', None)\n"
                "    if not (isinstance(src, str) and src.endswith('.py') and os.path.isabs(src)): continue\n"
                "    sys.pycache_prefix = None; beside = importlib.util.cache_from_source(src)\n"
                "    sys.pycache_prefix = prefix; cached = importlib.util.cache_from_source(src)\n"
                "    if os.path.exists(cached): continue\n"
                "    try:\n"
                "        os.makedirs(os.path.dirname(cached), exist_ok=True)\n"
                "        if os.path.exists(beside): os.symlink(beside, cached)\n"
                "        else: py_compile.compile(src, cfile=cached, doraise=True)\n"
                "    except Exception: pass\n")
        self._warm = subprocess.Popen([python, "-c", code], env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self._warm

    def warm_wait(self, timeout:float=120):
        if getattr(self, "_warm", None) is not None:
            try: self._warm.wait(timeout=timeout)
            except subprocess.TimeoutExpired: self._warm.kill()
            self._warm = None

    def _write_files(self):
        r = self.root
        for d in ["etc", "state", "run", "log", "home", "tmp", "gpu", "munge", "pycache", "pyshadow"] + [f"spool/n{i}" for i in range(1, self.nodes + 1)]:
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "pyshadow" / "rfc3987_syntax.py").write_text(SHADOW)
        os.chmod(r / "munge", 0o700)
        self.conf.write_text(slurm_conf(r, self.nodes, self.gpus_per_node, self.cpus_per_node, self.mem_mb))
        (r / "plugstack.conf").write_text("")
        for g in range(self.gpus_per_node):  # fake GPU device files: SLURM only needs paths it can stat
            dev = r / "gpu" / f"gpu{g}"
            if not dev.exists(): dev.symlink_to("/dev/null")
        (r / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName=n[1-{self.nodes}] Name=gpu File={r}/gpu/gpu[0-{self.gpus_per_node - 1}]\n")

    def _start_netns(self):
        "A sleeping process in a fresh network namespace; everything else joins it with nsenter."
        p = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"], start_new_session=True)
        self.procs.append(p)
        self.netns_pid = p.pid
        for _ in range(100):
            try:
                ns = os.readlink(f"/proc/{p.pid}/ns/net")
                if ns != os.readlink("/proc/self/ns/net"): self.netns = ns; break
            except OSError: pass
            time.sleep(0.02)
        if self.netns is None: raise RuntimeError("could not create a network namespace (unshare --net)")
        subprocess.run(self.cmd("ip", "link", "set", "lo", "up"), check=True)
        subprocess.run(self.cmd("ip", "addr", "add", "127.0.0.2/8", "dev", "lo"), check=True)

    def start(self, timeout:float=30) -> "LocalSlurm":
        "Start munged, slurmctld and the slurmds; return when every node is idle."
        t0 = time.time()
        self._write_files()
        self._start_netns()
        r = self.root
        key = r / "munge" / "munge.key"
        if not key.exists(): subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        os.chmod(key, 0o600)
        self._spawn("munged", "--foreground", "--force", f"--key-file={key}", f"--socket={r}/munge/munge.socket",
                    f"--pid-file={r}/run/munged.pid", f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/seed",
                    log="munged.out")
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), 10, "munged socket")
        self._spawn("slurmctld", "-D", "-i", "-f", self.conf, log="slurmctld.out")
        for i in range(1, self.nodes + 1):
            self._spawn("slurmd", "-D", "-f", self.conf, "-N", f"n{i}", log=f"slurmd-n{i}.out")
        self._wait(self._all_idle, timeout, "all nodes idle")
        self.timings["bring_up_s"] = time.time() - t0
        return self

    def _all_idle(self) -> bool:
        p = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
        states = dict(l.split() for l in p.stdout.splitlines() if l.strip())
        return p.returncode == 0 and len(states) == self.nodes and all(s == "idle" for s in states.values())

    def _wait(self, pred, timeout:float, what:str, every:float=0.1):
        t0 = time.time()
        while time.time() - t0 < timeout:
            for p in self.procs:
                if p.poll() is not None and p.pid != self.netns_pid:
                    raise RuntimeError(f"{p.args[5:7]} exited with {p.returncode} while waiting for {what}; logs in {self.root}/log")
            if pred(): return
            time.sleep(every)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}; logs in {self.root}/log")

    def spawn_listener(self, port:int) -> subprocess.Popen:
        "A process in the namespace that holds TCP port `port` on 127.0.0.1 (to make a Ray port look taken)."
        code = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                f"s.bind(('127.0.0.1', {port})); s.listen(); print('listening', flush=True); time.sleep(3600)")
        p = subprocess.Popen(self.cmd("python3", "-c", code), stdout=subprocess.PIPE, text=True, env=self.env())
        assert p.stdout.readline().strip() == "listening"
        return p  # not in self.procs (its exit is no daemon failure); stop() ends it with everything in the namespace

    # -- jobs ---------------------------------------------------------------------------------------
    def sbatch(self, *args, env:dict|None=None, cwd:str|None=None) -> int:
        "Submit a batch job (`sbatch --parsable ...`) and return its job id."
        p = self.run("sbatch", "--parsable", *args, env=env, cwd=cwd, check=False)
        if p.returncode: raise RuntimeError(f"sbatch {' '.join(map(str, args))} failed: {p.stderr.strip()}")
        return int(p.stdout.strip().split(";")[0])

    def job(self, job_id:int) -> dict:
        "`scontrol show job -o` as a dict (JobState, Command, ExitCode, ...); {} once the controller forgot it."
        p = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if p.returncode: return {}
        return dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", p.stdout))

    def jobs(self) -> list[dict]:
        "Every job the controller knows, oldest first."
        p = self.run("scontrol", "show", "job", "-o", check=False)
        out = [dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", l)) for l in p.stdout.splitlines() if l.startswith("JobId=")]
        return sorted(out, key=lambda j: int(j["JobId"]))

    def wait_done(self, job_ids=None, timeout:float=120, every:float=0.5, until_idle:bool=False) -> list[dict]:
        "Wait until the given jobs (or, with `until_idle`, every job including ones they submit) have finished."
        live = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT")
        def done():
            js = self.jobs() if until_idle else [self.job(j) for j in job_ids]
            return all(j and j.get("JobState") not in live for j in js)
        self._wait(done, timeout, f"jobs {job_ids or 'all'} to finish", every)
        return self.jobs()

    # -- teardown -----------------------------------------------------------------------------------
    def our_pids(self) -> list[int]:
        "PIDs of every process in our network namespace (all of them were started by this harness or its jobs)."
        pids = []
        if self.netns is None: return pids
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid(): continue
            try:
                if os.readlink(f"/proc/{d}/ns/net") == self.netns: pids.append(int(d))
            except OSError: pass
        return pids

    def stop(self, grace:float=1.5) -> dict:
        "Stop everything we started, by PID: SIGTERM, then SIGKILL after `grace` seconds. Returns counts."
        t0 = time.time()
        pids = self.our_pids()
        for pid in pids:
            try: os.kill(pid, signal.SIGTERM)
            except ProcessLookupError: pass
        deadline = time.time() + grace
        while time.time() < deadline and self.our_pids(): time.sleep(0.05)
        left = self.our_pids()
        for pid in left:
            try: os.kill(pid, signal.SIGKILL)
            except ProcessLookupError: pass
        for p in self.procs:
            try: p.wait(timeout=5)
            except subprocess.TimeoutExpired: pass
        deadline = time.time() + 5
        while time.time() < deadline and self.our_pids(): time.sleep(0.05)
        self.timings["teardown_s"] = time.time() - t0
        return {"terminated": len(pids), "killed": len(left), "remaining": len(self.our_pids())}

    def __enter__(self): return self.start()
    def __exit__(self, *exc): self.stop()
