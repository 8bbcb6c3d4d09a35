"""The code sandbox and the code-execution service under attack.

Every program in tests/hostile/ defines `solve()` returning 1 only if its attack worked, and is scored
with the test `assert solve() == 1`: a passed test means a broken sandbox. The hostile suite runs
through the HTTP service, which carries a planted secret in its environment; afterwards the service
must be healthy and answer correct programs, and no process of any sandbox uid may be left.
"""
import concurrent.futures as cf, contextlib, json, os, secrets, signal, socket, subprocess, sys, tempfile, textwrap, threading, time
from pathlib import Path
import pytest
from grpo_nb.rewards import CodeClient, RewardContext, compute_rewards
from grpo_nb.sandbox import UID_BASE, UID_COUNT, Limits, SandboxError, isolation_status, resolve_isolation, run_tests

HOSTILE = sorted((Path(__file__).parent / "hostile").glob("*.py"))
REPO = str(Path(__file__).resolve().parents[1])
SMALL = Limits(memory_mb=256, total_memory_mb=768, nproc=16)
EXPECT = {  # statuses these programs may report (others: anything but passed); a loaded machine may turn slow crashes into timeouts
    "03_infinite_loop": {"timeout"}, "04_sleep_past_deadline": {"timeout"}, "02_shell_fork_bomb": {"timeout"},
    "05_memory_hog": {"memory"}, "07_huge_stdout": {"output_limit"}, "08_huge_stderr": {"output_limit"},
    "17_deep_recursion": {"crashed", "timeout"}, "24_exit_zero_early": {"not_run"}, "19_close_fds": {"not_run"},
    "26_forge_reports": {"not_run", "unusable_value"},
}

pytestmark = pytest.mark.skipif(isolation_status()["root"] != "ok" and isolation_status()["userns"] != "ok",
                                reason="no namespace isolation on this machine")

def _proc_table() -> dict[int, tuple[int, int]]:
    "pid -> (uid, parent pid) of every host process readable now."
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit(): continue
        try: uid, stat = os.stat(f"/proc/{d}").st_uid, Path(f"/proc/{d}/stat").read_text()
        except OSError: continue
        table[int(d)] = (uid, int(stat[stat.rindex(")") + 2:].split()[1]))
    return table

def sandbox_processes(root: int | None = None) -> list[str]:
    """Host processes running under a sandbox uid (there must be none between runs). With `root`, only those this
    test can own: descendants of `root`, and strays whose nearest ancestor outside the sandbox uids is init (a sandbox
    that outlived its runner). Other tests' sandboxes, running beside this one under pytest-xdist, are not counted."""
    table, out = _proc_table(), []
    is_sbx = lambda pid: pid in table and UID_BASE <= table[pid][0] < UID_BASE + UID_COUNT
    for pid, (uid, _) in table.items():
        if not is_sbx(pid): continue
        if root is not None:
            owner = _ancestors(pid, table)
            outside = next((p for p in owner if not is_sbx(p)), 1)   # the nearest ancestor outside the sandbox uids
            if not (outside <= 1 or outside == root or root in _ancestors(outside, table)): continue
        out.append(f"{pid} uid={uid}")
    return out

def _ancestors(pid: int, table: dict[int, tuple[int, int]]) -> list[int]:
    "The parent chain of `pid` in `table`, nearest first."
    out = []
    while pid in table and table[pid][1] > 0 and table[pid][1] not in out: pid = table[pid][1]; out.append(pid)
    return out

def children_of(pid: int) -> list[tuple[int, str]]:
    "(pid, state) of the direct children of `pid`."
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit(): continue
        try: s = Path(f"/proc/{d}/stat").read_text()
        except OSError: continue
        fields = s[s.rindex(")") + 2:].split()
        if int(fields[1]) == pid: out.append((int(d), fields[0]))
    return out

@contextlib.contextmanager
def counting(srv:socket.socket):
    "Accept on `srv` in a thread while the block runs; yields the list of connections it accepted (it must stay empty)."
    srv.listen(16); srv.settimeout(0.2)
    hits, stop = [], threading.Event()
    def accept():
        while not stop.is_set():
            try: hits.append(srv.accept()[0])
            except OSError: pass
    t = threading.Thread(target=accept, daemon=True); t.start()
    try: yield hits
    finally: stop.set(); t.join(); srv.close()

@pytest.fixture(scope="module")
def listener():
    "A TCP listener on the host's loopback that counts connections (the sandbox must never reach it)."
    srv = socket.socket(); srv.bind(("127.0.0.1", 0))
    with counting(srv) as hits: yield srv.getsockname()[1], hits

@pytest.fixture(scope="module")
def secret_file():
    "A root-only file outside /tmp (the sandbox hides /var/tmp; it must not read this in any case)."
    d = tempfile.mkdtemp(prefix="grpo-secret-", dir="/var/tmp"); os.chmod(d, 0o755)
    p = Path(d, "secret.txt"); p.write_text("TOP-SECRET-" + secrets.token_hex(8)); p.chmod(0o600)
    yield p
    p.unlink(); os.rmdir(d)

@pytest.fixture(scope="module", autouse=True)
def unix_listener():
    "A host UNIX socket outside /tmp, /run and /dev/shm (32_unix_socket_var_tmp must not reach it); counts connections."
    path = "/var/tmp/grpo_sbx_unix.sock"
    if os.path.exists(path): os.unlink(path)
    srv = socket.socket(socket.AF_UNIX); srv.bind(path); os.chmod(path, 0o777)
    with counting(srv) as hits: yield hits
    os.unlink(path)
    assert not hits, "a sandboxed program connected to a host UNIX socket under /var/tmp"

@pytest.fixture(scope="module")
def service():
    "The code service as the sbatch script starts it, with a secret in its environment."
    secret = "s3cr3t-" + secrets.token_hex(12)
    env = {**os.environ, "GRPO_SERVICE_SECRET": secret}
    ready = Path(tempfile.mkdtemp()) / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_nb.rewards", "serve", "--host", "127.0.0.1", "--port", "0",
                             "--workers", "4", "--max-timeout", "5", "--memory-mb", str(SMALL.memory_mb),
                             "--nproc", str(SMALL.nproc), "--ready-file", str(ready)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if ready.exists() or proc.poll() is not None: break
        time.sleep(0.05)
    assert ready.exists(), proc.stderr.read()
    info = json.loads(ready.read_text())
    ready.unlink(); ready.parent.rmdir()
    yield info | {"secret": secret, "proc": proc}
    proc.send_signal(signal.SIGTERM)
    try: proc.wait(15)
    except subprocess.TimeoutExpired: proc.kill(); proc.wait()

def prepare(path: Path, port: int, secret_file: Path, secret: str) -> str:
    return (path.read_text().replace("@REPO@", REPO).replace("@PORT@", str(port))
            .replace("@SECRET_FILE@", str(secret_file)).replace("@SECRET@", secret))

def test_hostile_suite_through_the_service(service, listener, secret_file):
    port, hits = listener
    assert len(HOSTILE) >= 20
    jobs = [{"program": prepare(p, port, secret_file, service["secret"]), "tests": ["assert solve() == 1"], "timeout_s": 2.0}
            for p in HOSTILE]
    t0 = time.monotonic()
    with CodeClient(service["url"], batch_size=2, concurrency=4) as client:
        results = client.run_batch(jobs)
        elapsed = time.monotonic() - t0
        report = {p.stem: (r["results"][0]["status"], r["results"][0]["detail"][:80]) for p, r in zip(HOSTILE, results)}
        print(json.dumps(report, indent=1), f"\n{len(jobs)} hostile programs in {elapsed:.1f} s")
        for p, r in zip(HOSTILE, results):
            assert r["total"] == 1 and r["passed"] == 0, (p.stem, r)
            status = r["results"][0]["status"]
            assert status != "sandbox_error", (p.stem, r)
            if p.stem in EXPECT: assert status in EXPECT[p.stem], (p.stem, r)
            assert service["secret"] not in json.dumps(r) and "TOP-SECRET" not in json.dumps(r), p.stem
        assert not hits, "a sandbox reached the host's loopback listener"
        for path in [Path(REPO, "grpo_sbx_escape_marker"), Path("/tmp/grpo_sbx_escape_marker"), Path("/var/tmp/grpo_sbx_escape_marker")]:
            assert not path.exists(), f"{path} was written from inside the sandbox"
        assert not list(Path("/dev/shm").glob("grpo_fill*")), "the host's /dev/shm was written"
        # the service is still healthy and still right
        h = client.health()
        assert h["status"] == "ok" and h["errors"] == 0, h
        good = client.run_tests("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3", "assert add(2, 2) == 4"])
        assert (good["passed"], good["total"]) == (2, 2), good
    assert service["proc"].poll() is None
    # nothing left behind: no process under a sandbox uid, no zombie child of the service
    deadline = time.monotonic() + 5
    while (sandbox_processes(service["pid"]) or [c for c in children_of(service["pid"]) if c[1] == "Z"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sandbox_processes(service["pid"]), sandbox_processes(service["pid"])
    assert not [c for c in children_of(service["pid"]) if c[1] == "Z"], children_of(service["pid"])

def test_in_process_run_tests_hides_the_callers_environment(secret_file, listener):
    "The same sandbox in-process (no service): the caller's environment never reaches the program."
    port, hits = listener
    secret = "inproc-" + secrets.token_hex(8)
    os.environ["GRPO_SERVICE_SECRET"] = secret
    try:
        for name in ("12_read_service_env", "11_read_secrets", "13_socket_loopback"):
            src = prepare(Path(__file__).parent / "hostile" / f"{name}.py", port, secret_file, secret)
            r = run_tests(src, ["assert solve() == 1"], timeout_s=3, limits=SMALL)
            assert r["passed"] == 0 and r["results"][0]["status"] == "failed", (name, r)
            assert secret not in json.dumps(r), name
    finally:
        del os.environ["GRPO_SERVICE_SECRET"]
    assert not hits

def test_fork_bomb_is_bounded_and_cleaned_up():
    "While a fork bomb runs the sandbox holds at most nproc processes of its uid; afterwards none."
    seen = []
    def watch(stop):
        while not stop.is_set(): seen.append(len(sandbox_processes(os.getpid()))); time.sleep(0.05)
    stop = threading.Event(); t = threading.Thread(target=watch, args=(stop,)); t.start()
    try: r = run_tests((Path(__file__).parent / "hostile" / "01_fork_bomb.py").read_text(), ["assert solve() == 1"],
                       timeout_s=2, limits=Limits(memory_mb=256, nproc=8))
    finally: stop.set(); t.join()
    assert r["passed"] == 0 and r["results"][0]["status"] == "timeout" and r["clean"], r
    assert 1 <= max(seen) <= 8 + 1, max(seen)   # the program's nproc, plus the judge (its own sandbox uid)
    assert not sandbox_processes(os.getpid())

def test_correct_programs_and_test_styles():
    mbpp = "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n"
    r = run_tests(mbpp, ["assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
                         "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
                         "assert similar_elements((11, 12, 14, 13), (17, 15, 14, 13)) == (13, 14)"], timeout_s=5)
    assert (r["passed"], r["total"]) == (3, 3), r
    stdio = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\nprint(max(nums))\n"
    r = run_tests(stdio, [{"input": "1 2 3\n", "output": "6\n3\n"}, {"input": "5", "output": "5\n5"},
                          {"input": "1 1", "output": "2\n2"}, {"input": "", "output": "0"}], timeout_s=5)
    assert [x["status"] for x in r["results"]] == ["passed", "passed", "failed", "error"], r
    big = "x" * 300_000  # stdin larger than a pipe buffer
    r = run_tests("import sys\nprint(len(sys.stdin.read()))", [{"input": big, "output": str(len(big))}], timeout_s=5)
    assert r["passed"] == 1, r
    r = run_tests("import math\ndef f():\n    return math.pi", ["assert round(f(), 2) == 3.14"], setup="import math", timeout_s=5)
    assert r["passed"] == 1, r
    r = run_tests("def f(:\n", ["assert f() == 1", "assert f() == 2"], timeout_s=5)
    assert [x["status"] for x in r["results"]] == ["error", "error"] and "SyntaxError" in r["results"][0]["detail"]
    with pytest.raises(ValueError, match="mix"): run_tests("", ["assert 1", {"input": "", "output": ""}])

def test_partial_results_survive_a_timeout():
    prog = "import time\ndef f(x):\n    if x == 2: time.sleep(60)\n    return x\n"
    r = run_tests(prog, ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"], timeout_s=1.5)
    assert [x["status"] for x in r["results"]] == ["passed", "timeout", "timeout"], r

def test_userns_mode_is_refused_as_root():
    "Its uid map would run the program as host uid 0: as root only `root` mode isolates."
    if os.geteuid() != 0: pytest.skip("the caller is not root")
    assert isolation_status()["userns"].startswith("refused as root"), isolation_status()
    with pytest.raises(SandboxError, match="isolation='root'"): resolve_isolation("userns")
    assert resolve_isolation("auto") == "root"

def test_unisolated_mode_is_refused_unless_allowed():
    with pytest.raises(SandboxError, match="allow_unisolated=True"): resolve_isolation("none")
    if not os.path.exists("/usr/bin/python3"): pytest.skip("no system python that a fresh uid can run")
    r = run_tests("import os\ndef f(): return os.getuid()", ["assert f() != 0"], timeout_s=5, isolation="none",
                  allow_unisolated=True, python="/usr/bin/python3")
    assert r["isolation"] == "none" and r["passed"] == 1 and r["clean"], r

USERNS_CHILD = textwrap.dedent('''
    import json, sys
    from grpo_nb.sandbox import Limits, run_tests, resolve_isolation
    mode = resolve_isolation("auto")
    progs = json.loads(sys.stdin.read())
    out = {"mode": mode, "results": {k: run_tests(v, ["assert solve() == 1"], timeout_s=2, limits=Limits(memory_mb=256, nproc=8))
                                     for k, v in progs.items()}}
    out["good"] = run_tests("def solve(): return 1", ["assert solve() == 1"], timeout_s=5)
    # no memory cgroup in a user namespace: init adds up the sandbox's resident memory (5 x 200 MiB > 512 MiB)
    hog = ("import os, time\\nfor _ in range(5):\\n    if os.fork() == 0:\\n        x = bytearray(200 << 20)\\n"
           "        for i in range(0, len(x), 4096): x[i] = 1\\n        time.sleep(30)\\ntime.sleep(30)\\ndef solve(): return 1\\n")
    out["total"] = run_tests(hog, ["assert solve() == 1"], timeout_s=5, limits=Limits(memory_mb=300, total_memory_mb=512, nproc=8))
    print(json.dumps(out))
''')

def test_userns_mode_as_an_unprivileged_user(listener, secret_file):
    """On a SLURM head node the service runs as a user: the sandbox must isolate through a user namespace.
    Simulated here: a child drops to uid 65534 (in its own mount namespace where the interpreter stays visible)."""
    if os.geteuid() != 0: pytest.skip("needs root to create the unprivileged caller")
    port, hits = listener
    names = ["01_fork_bomb", "09_write_outside", "13_socket_loopback", "14_socket_outside", "15_kill_parent",
             "11_read_secrets", "27_become_root", "20_raise_limits", "31_sysv_shm", "32_unix_socket_var_tmp", "33_nested_userns",
             "34_read_home_token", "35_read_checkout"]
    home = Path(tempfile.mkdtemp(prefix="grpo-home-", dir="/var/tmp"))   # the unprivileged caller's home, with a private token
    (home / "private").mkdir(mode=0o700); (home / "private" / "token").write_text("HOME-TOKEN-" + secrets.token_hex(8))
    for q in (home, home / "private", home / "private" / "token"): os.chown(q, 65534, 65534)
    progs = {n: prepare(Path(__file__).parent / "hostile" / f"{n}.py", port, secret_file, "x") for n in names}
    boot = textwrap.dedent(f'''
        import os, sys
        from grpo_nb.sandbox import _unshare, _mount, _expose, _CLONE_NEWNS, _MS_REC, _MS_PRIVATE
        _unshare(_CLONE_NEWNS); _mount(None, "/", None, _MS_REC | _MS_PRIVATE); _expose([sys.base_prefix, sys.prefix])
        os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
        os.execve(sys.executable, [sys.executable, "-c", {USERNS_CHILD!r}], {{"PATH": "/usr/bin:/bin", "HOME": {str(home)!r}}})
    ''')
    def count_nobody():
        n = 0
        for d in os.listdir("/proc"):
            try: n += d.isdigit() and os.stat(f"/proc/{d}").st_uid == 65534
            except OSError: pass
        return n
    seen, stop = [], threading.Event()
    def watch():
        while not stop.is_set(): seen.append(count_nobody()); time.sleep(0.05)
    t = threading.Thread(target=watch); t.start()
    try: p = subprocess.run([sys.executable, "-c", boot], input=json.dumps(progs), capture_output=True, text=True, timeout=120, cwd=REPO)
    finally:
        stop.set(); t.join()
        import shutil; shutil.rmtree(home, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-2000:]
    # caller + fork server + the supervisor (it unshares the user namespace, so it stays outside it), plus at most
    # nproc=8 inside the namespace (init, programs) during the fork bomb, plus the judge's supervisor, init and
    # process; an escaped fork bomb would show hundreds
    assert max(seen) <= 3 + 8 + 3, max(seen)
    out = json.loads(p.stdout)
    assert out["mode"] == "userns", out["mode"]
    for name, r in out["results"].items():
        assert r["passed"] == 0 and r["results"][0]["status"] != "sandbox_error" and r["clean"], (name, r)
    assert out["good"]["passed"] == 1, out["good"]
    assert out["results"]["01_fork_bomb"]["results"][0]["status"] == "timeout"
    assert out["total"]["results"][0]["status"] == "memory", out["total"]
    assert not hits and not Path(REPO, "grpo_sbx_escape_marker").exists()

def test_load_128_requests_at_concurrency_16(service):
    "128 /run requests, 16 at a time, each with its own answer: none lost, none duplicated, none mixed up."
    import httpx
    # The claim is about correctness under concurrency, not throughput: 16 clients keep 16 requests in flight against the
    # service's 4 workers, so from the first round on requests queue and every worker interleaves several clients' programs.
    # With eight requests per client (128 in all) nearly every request waits in the queue beside others and is answered while
    # other clients' programs run; 500 requests checked the same thing four times longer.
    n = 128
    def one(i):
        job = {"id": f"req-{i}", "program": f"print('token-{i}')\ndef f():\n    return {i}\n",
               "tests": [f"assert f() == {i}"], "timeout_s": 5}
        with httpx.Client(timeout=120) as c:
            for attempt in range(5):
                r = c.post(service["url"] + "/run", json=job)
                if r.status_code == 200: return i, r.json()
                time.sleep(0.2 * 2 ** attempt)
        raise AssertionError(f"request {i}: {r.status_code} {r.text}")
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(16) as ex: answers = list(ex.map(one, range(n)))
    elapsed = time.monotonic() - t0
    print(f"{n} requests at concurrency 16: {elapsed:.1f} s, {n / elapsed:.1f} programs/s")
    ids = [a["id"] for _, a in answers]
    assert len(set(ids)) == n and sorted(ids) == sorted(f"req-{i}" for i in range(n))
    for i, a in answers:
        assert a["id"] == f"req-{i}" and a["passed"] == 1 and f"token-{i}\n" == a["stdout"], a
    h = httpx.get(service["url"] + "/health").json()
    assert h["status"] == "ok" and h["errors"] == 0 and h["running"] == 0 and h["queued"] == 0, h

def test_code_rewards_through_the_service(service):
    comps = ["```python\ndef sq(x):\n    return x * x\n```", "```python\ndef sq(x):\n    return x + x\n```",
             "```python\nimport os\nos._exit(0)\n```"]
    tests = [["assert sq(2) == 4", "assert sq(3) == 9"]] * 3
    b = compute_rewards(comps, tests, {"code": 1.0, "code_all": 1.0}, RewardContext(code_service_url=service["url"]))
    assert b.per_function == {"code": [1.0, 0.5, 0.0], "code_all": [1.0, 0.0, 0.0]}

def test_client_retries_then_names_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]  # nothing listens here
    with CodeClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.05) as c:
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="failed after 3 attempts"): c.run_tests("x = 1", ["assert x == 1"])
        assert time.monotonic() - t0 < 10

def test_service_rejects_bad_jobs(service):
    import httpx
    r = httpx.post(service["url"] + "/run", json={"program": 3, "tests": []})
    assert r.status_code == 400 and "program" in r.json()["error"]
    r = httpx.post(service["url"] + "/run_batch", json={"jobs": "nope"})
    assert r.status_code == 400
    with CodeClient(service["url"]) as c:
        with pytest.raises(ValueError, match="refused"): c.run_batch([{"program": "x", "tests": "not a list"}])

def test_serve_refuses_without_isolation_and_explains():
    p = subprocess.run([sys.executable, "-m", "grpo_nb.rewards", "serve", "--isolation", "none", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "allow_unisolated=True" in p.stderr, p.stderr

def test_only_allowed_packages_are_importable(tmp_path, monkeypatch):
    "A package is visible only when allowed by name, also from under /tmp (a CI checkout's venv); the rest of its directory is not."
    pkg = tmp_path / "site" / "grpo_allowed_pkg"; pkg.mkdir(parents=True); (pkg / "__init__.py").write_text("VALUE = 42\n")
    (tmp_path / "site" / "grpo_other_pkg").mkdir(); (tmp_path / "site" / "grpo_other_pkg" / "__init__.py").write_text("")
    for p in (tmp_path, tmp_path / "site", pkg): p.chmod(0o755)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    prog = "import os\ndef f():\n    import grpo_allowed_pkg\n    return grpo_allowed_pkg.VALUE\ndef g(): return os.path.exists(%r)\n" % str(tmp_path / "site" / "grpo_other_pkg")
    r = run_tests(prog, ["assert f() == 42", "assert g() == False"], timeout_s=5, packages=("grpo_allowed_pkg",))
    assert r["passed"] == 2, r["results"]
    r = run_tests(prog, ["assert f() == 42"], timeout_s=5)
    assert r["results"][0]["status"] == "error" and "ModuleNotFoundError" in r["results"][0]["detail"], r["results"]
    with pytest.raises(SandboxError, match="not installed"): run_tests(prog, ["assert f() == 42"], packages=("grpo_no_such_pkg",))

def test_a_report_index_that_is_not_ascii_digits_is_ignored():
    "`'²'.isdigit()` is true but `int('²')` fails: such an index once made the whole run a sandbox_error."
    from grpo_nb.sandbox import sandbox_exec
    prog = "import os\nn = os.read(3, 64).decode()\nos.write(4, (n + '\\t\u00b2\\tpassed\\tx\\n' + n + '\\t1\\tpassed\\ty\\n').encode())\n"
    r = sandbox_exec({"p.py": prog}, [{"argv": [sys.executable, "p.py"]}], 5)
    assert r["ok"] and r["runs"][0]["reports"] == [{"i": 1, "s": "passed", "d": "y"}], r
