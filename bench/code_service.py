"""Requests per second of the code-execution service, before and after the two-sandbox judge.

    .venv/bin/python bench/code_service.py [--before a820096] [--n 120] [--concurrency 4] [--workers 2]

Starts `python -m grpo_nb.rewards serve` (what the sbatch script starts) twice: from this checkout, and from the
library as it was at `--before` (extracted with `git archive` into a temporary directory, imported first on
PYTHONPATH), and sends each the same two loads, one `POST /run` per program, `--concurrency` at a time:

- MBPP-style: a correct function from data/mbpp_tiny.jsonl and its three asserts (one sandbox before; a
  program sandbox and a judge sandbox now);
- APPS-style: a stdin/stdout program with three cases (three runs in one sandbox, in both versions).

Each version serves `--rounds` rounds of `--n` requests per load, interleaved with the other version's.

Every request's latency is recorded; the JSON gives mean, median and p90 latency and the throughput (requests/s),
for each version and load, and goes to bench/results/code_service.json.
"""
import argparse, json, os, platform, statistics, subprocess, sys, tarfile, tempfile, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def mbpp_jobs() -> list[dict]:
    rows = [json.loads(l) for l in (ROOT / "data" / "mbpp_tiny.jsonl").read_text().splitlines()]
    return [{"program": r["prompt"] + r["solution"], "tests": r["answer"], "timeout_s": 10} for r in rows]

def apps_jobs() -> list[dict]:
    prog = "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs), max(xs))\n"
    return [{"program": prog, "timeout_s": 10, "tests": [{"input": f"3\n{i} {i + 1} {i + 2}\n", "output": f"{3 * i + 3} {i + 2}\n"}
                                                         for i in range(k, k + 3)]} for k in range(32)]

def start(src:Path, workers:int) -> tuple[str, subprocess.Popen]:
    "The service as users start it, importing grpo_nb from `src`."
    ready = Path(tempfile.mkdtemp()) / "ready.json"
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_nb.rewards", "serve", "--port", "0", "--workers", str(workers),
                             "--max-queue", "4096", "--ready-file", str(ready)], env=env, cwd=src, stdout=subprocess.DEVNULL)
    for _ in range(1200):
        if ready.exists(): return json.loads(ready.read_text())["url"], proc
        if proc.poll() is not None: break
        time.sleep(0.05)
    proc.kill(); raise RuntimeError(f"the service from {src} did not start")

def post(url:str, job:dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "/run", json.dumps(job).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r: out = json.loads(r.read())
    return time.perf_counter() - t0, out

def load(url:str, jobs:list[dict], n:int, concurrency:int) -> tuple[float, list[float], int]:
    "n requests, `concurrency` at a time: (wall seconds, latencies in ms, programs that passed every test)."
    for j in jobs[:4]: post(url, j)   # warm: fork server started, isolation probed
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex: res = list(ex.map(lambda i: post(url, jobs[i % len(jobs)]), range(n)))
    return time.perf_counter() - t0, [r[0] * 1000 for r in res], sum(r[1]["passed"] == r[1]["total"] for r in res)

def summary(rounds:list[tuple]) -> dict:
    "Throughput over all rounds (and per round), latency mean/median/p90 over every request."
    lat = sorted(x for _, ls, _ in rounds for x in ls)
    return {"requests": len(lat), "requests_per_s": round(len(lat) / sum(w for w, _, _ in rounds), 2),
            "requests_per_s_per_round": [round(len(ls) / w, 2) for w, ls, _ in rounds], "all_passed": sum(p for _, _, p in rounds),
            "latency_ms": {"mean": round(statistics.mean(lat), 1), "median": round(statistics.median(lat), 1),
                           "p90": round(lat[int(0.9 * (len(lat) - 1))], 1)}}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="a820096"); ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4); ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "code_service.json"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tar = Path(d) / "before.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(tar), a.before, "grpo_nb"], check=True)
        with tarfile.open(tar) as t: t.extractall(d)
        versions = {"before": Path(d), "after": ROOT}
        out = {"before_commit": a.before, "rounds": a.rounds, "n_per_round": a.n, "after_commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
               capture_output=True, text=True).stdout.strip(), "workers": a.workers, "concurrency": a.concurrency,
               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)", "loads": {}}
        for name, jobs in [("mbpp", mbpp_jobs()), ("apps", apps_jobs())]:
            got = {label: [] for label in versions}
            for k in range(a.rounds):   # interleaved, alternating which goes first: a shared machine's load hits both alike
                for label in (list(versions) if k % 2 == 0 else list(versions)[::-1]):
                    url, proc = start(versions[label], a.workers)
                    try: got[label].append(load(url, jobs, a.n, a.concurrency))
                    finally: proc.terminate(); proc.wait(15)
            out["loads"][name] = {label: summary(r) for label, r in got.items()}
            for label, r in out["loads"][name].items():
                print(f"{name:5s} {label:6s} {r['requests_per_s']:6.2f} req/s  latency mean {r['latency_ms']['mean']:7.1f} ms  "
                      f"median {r['latency_ms']['median']:7.1f}  p90 {r['latency_ms']['p90']:7.1f}  all tests passed: {r['all_passed']}/{r['requests']}", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
