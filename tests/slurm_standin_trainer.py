"""STAND-IN TRAINER for the SLURM tests: honours the trainer contract of nbs/09a_chain.ipynb, trains nothing.

`grpo_nb train` keeps the same contract; the fast tests of `tests/test_slurm_cluster.py` submit `sbatch/grpo.sbatch`
with `TRAIN_CMD="python tests/slurm_standin_trainer.py"` so that a chain of jobs takes minutes, and a slow test runs
`grpo_nb train` itself. The contract it honours:

    TRAIN_CMD CONFIG [--section.field=value ...] --cluster.ray_address=auto --resume auto

- joins the Ray cluster with `ray.init(address="auto")` (RAY_ADDRESS is set by grpo.sbatch), checks that
  it has `cluster.nodes` nodes carrying a `slurm_node_<host>` resource, and runs one task on each of them;
- "trains" one step every `--step-s` seconds; after each step it writes a checkpoint directory
  `step_<n>` and then replaces `<checkpoint_dir>/latest` atomically (write a temp file, rename);
- `--resume auto` starts after the step in `latest`;
- SIGUSR1 / SIGTERM: finish the current step (which checkpoints), exit 0;
- exit 0 when `total_steps` is reached.

It appends one line per step to `<output_dir>/steps.log` ("<step> <job id>"), which the tests read to
check that a chain of jobs neither repeats nor skips a step. Stand-in-only options come before CONFIG:
`--step-s S` and `--crash-at-step N` (exit 1 before checkpointing step N).
"""
import argparse, json, os, signal, sys, time
from pathlib import Path

from grpo_nb.config import load_config, derive
from grpo_nb.stop import settle

STOP = []


def on_signal(signum, frame):
    STOP.append(signal.Signals(signum).name)


def checkpoint(ckpt:Path, step:int, job:str, keep:int):
    "Write checkpoint `step` completely, then point `latest` at it atomically; keep the newest `keep`."
    d = ckpt / f"step_{step}"
    tmp = ckpt / f".step_{step}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "state.json").write_text(json.dumps({"step": step, "job": job}))
    os.replace(tmp, d)
    latest_tmp = ckpt / ".latest.tmp"
    latest_tmp.write_text(f"step_{step}\n")
    os.replace(latest_tmp, ckpt / "latest")
    for old in sorted(ckpt.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[:-keep]:
        for f in old.iterdir(): f.unlink()
        old.rmdir()


def join_ray(expected_nodes:int, probe:bool):
    "Connect to the cluster the sbatch script started; with `probe`, start one task on every SLURM node of it."
    import ray
    ray.init(address="auto", log_to_driver=False, logging_level="ERROR")
    hosts = sorted(k[len("slurm_node_"):] for n in ray.nodes() if n["Alive"] for k in n["Resources"] if k.startswith("slurm_node_"))
    if len(hosts) != expected_nodes:
        print(f"[standin] expected {expected_nodes} Ray nodes, found {hosts}", flush=True)
        ray.shutdown(); sys.exit(3)

    @ray.remote(num_cpus=0)
    def where():
        return os.environ.get("VLLM_HOST_IP", ""), ray.get_runtime_context().get_node_id()

    # a task per node starts a Ray worker process per node (seconds): only the first job of a chain probes,
    # and it collects the answers after training, off the path to the first step
    pending = [where.options(resources={f"slurm_node_{h}": 0.01}).remote() for h in hosts] if probe else []
    return hosts, pending


def report_ray(hosts:list, pending:list, out:Path, job:str):
    import ray
    ran = ray.get(pending, timeout=60) if pending else []
    gpus = ray.cluster_resources().get("GPU", 0)
    (out / f"standin_cluster_{job}.json").write_text(json.dumps({"hosts": hosts, "gpus": gpus, "tasks_ran_on": ran}))
    print(f"[standin] Ray cluster: {hosts}, {gpus:g} GPUs; tasks ran on {len(set(r[1] for r in ran))} node(s)", flush=True)
    ray.shutdown()


def main(argv=None):
    p = argparse.ArgumentParser(prog="slurm_standin_trainer")
    p.add_argument("--step-s", type=float, default=0.3, help="seconds one fake step takes")
    p.add_argument("--crash-at-step", type=int, default=0, help="exit 1 before checkpointing this step (0: never)")
    p.add_argument("--startup-s", type=float, default=0.0, help="seconds before the signal handlers exist (grpo_nb's imports)")
    p.add_argument("--resume", default="auto")
    p.add_argument("config")
    a, overrides = p.parse_known_args(argv)
    time.sleep(a.startup_s)
    for s in (signal.SIGUSR1, signal.SIGTERM): signal.signal(s, on_signal)
    if os.environ.get("GRPO_NB_READY_FILE"): Path(os.environ["GRPO_NB_READY_FILE"]).touch()   # as grpo_nb.stop.catch_early does
    cfg = load_config(a.config, overrides)
    job = os.environ.get("SLURM_JOB_ID", "local")
    out, ckpt = Path(cfg.logging.output_dir), Path(derive(cfg).checkpoint_dir)
    out.mkdir(parents=True, exist_ok=True); ckpt.mkdir(parents=True, exist_ok=True)
    step = 0
    if a.resume == "auto" and (ckpt / "latest").exists():
        step = int((ckpt / "latest").read_text().strip().rsplit("_", 1)[-1])
    ray_state = join_ray(cfg.cluster.nodes, probe=step == 0) if cfg.cluster.ray_address == "auto" else None
    print(f"[standin] job {job}: resuming after step {step} of {cfg.total_steps}", flush=True)
    while step < cfg.total_steps and not STOP:
        time.sleep(a.step_s)
        step += 1
        if step == a.crash_at_step:
            print(f"[standin] crashing at step {step} (--crash-at-step)", flush=True); return 1
        with open(out / "steps.log", "a") as f: f.write(f"{step} {job}\n")
        checkpoint(ckpt, step, job, cfg.checkpoint.keep_last)
    why = f"on {STOP[0]}" if STOP else "at total_steps"
    print(f"[standin] job {job}: stopped {why} after checkpointing step {step}", flush=True)
    if ray_state: report_ray(*ray_state, out, job)
    return 0


if __name__ == "__main__": sys.exit(settle(main()))   # as grpo_nb's entry points: a signal after the last checkpoint is a clean stop
