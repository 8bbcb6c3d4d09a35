# %%
#| default_exp slurm

# %% [markdown]
# # SLURM
# > sbatch scripts generated from this notebook: a Ray cluster over the job's nodes, the trainer on the first node, a checkpoint before the walltime and the next job of the chain

# %% [markdown]
# A GRPO run on a cluster is one Ray cluster spread over the nodes of a SLURM job: learners and vLLM
# engines are Ray actors, and the trainer is a Ray driver that places them. SLURM does not know about
# Ray, so a batch script has to build the Ray cluster inside the allocation, run the trainer, and, because
# a run outlives the walltime of one job, save a checkpoint before SLURM kills the job and submit the job
# that resumes from it. This notebook writes that script, its per-node helper and a ladder of debug
# variants into `sbatch/`, and the commands `grpo_nb sbatch` (a script for your cluster) and
# `grpo_nb preflight` (checks before you queue). CI submits the generated script, unchanged, to a real
# SLURM on one machine (two emulated nodes with four fake GPUs each) and checks that a three-job chain
# neither repeats nor skips a training step (`tests/test_slurm_cluster.py`).
#
# What one job does:
#
# ```
# sbatch grpo.sbatch CONFIG                      batch shell on the first node; traps SIGUSR1 at once
# ├─ srun -w node1 ray_node_setup.sh head        background step: ray start --head --block
# ├─ srun -w node2 ray_node_setup.sh worker      background step: joins, then waits for the head to leave
# ├─ wait until every node and GPU has joined    (timeout: fails naming the missing nodes)
# ├─ TRAIN_CMD CONFIG ... --resume auto &        the trainer, in the background behind `wait`
# │     ... SIGUSR1 `signal_s` before the walltime → forwarded → checkpoint, exit 0
# ├─ sbatch --dependency=afterany:$SLURM_JOB_ID  the next job of the chain resumes from the checkpoint
# └─ stop the head; the workers see it go and exit 0
# ```
#
# **Where this departs from the seeds' scripts**, and why (each is a trap seen on a real SLURM, see
# `FIELD_NOTES.md`):
#
# | seeds | here | because |
# |---|---|---|
# | `sleep 30` after starting Ray | poll until every node and GPU is in the cluster | 30 s is too short on a busy cluster and wasted on an idle one; a missing node is named |
# | `SLURM_JOB_CHAIN_COUNT` as the counter | `GRPO_CHAIN_INDEX` | `sbatch --export=ALL,SLURM_X=n` inside a job keeps the job's own `SLURM_X`: the counter never grows and the chain runs away |
# | the cap reads the counter | the cap also counts the jobs in a ledger file of the run | a counter that does not propagate cannot stop the chain |
# | resubmit at the end of every job | resubmit only after the walltime signal, a clean exit and a new checkpoint | a job that fails before its first checkpoint would otherwise resubmit itself until the cap |
# | trainer in the foreground | trainer in the background behind `wait`, the trap forwards the signal | bash runs a trap only between commands; `--signal=B:` reaches the batch shell only |
# | `srun ... &` | `srun --overlap --nodes=1 --ntasks=1 -w host` | steps inherit the job's task count; a background step without `--overlap` blocks every later step |
# | script directory from `$0` | `Command=` of `scontrol show job` | `$0` is slurmd's spooled copy; nothing sits next to it |

# %%
#| export
from __future__ import annotations
import argparse, json, os, re, shlex, shutil, subprocess, sys, tempfile, time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal
from grpo_nb.config import TrainConfig, ConfigError, load_config, derive

# %%
#| hide
from fastcore.test import test_eq, test_fail
from IPython.display import Markdown

# %% [markdown]
# ## From a launcher to SLURM
#
# The seeds moved open-instruct from AI2's Beaker launcher to SLURM. The training code never reads the
# launcher's variables; only the bootstrap does. The table below is what each Beaker variable becomes in
# the generated scripts (the third column says where).

# %%
#| export
LAUNCHER_TO_SLURM:list[tuple[str, str, str]] = [
    ("BEAKER_REPLICA_RANK", "index of the host in `scontrol show hostnames \"$SLURM_JOB_NODELIST\"` (0 = head)",
     "grpo.sbatch passes it to ray_node_setup.sh as RANK; not SLURM_NODEID, which is 0 inside a one-node step"),
    ("BEAKER_LEADER_REPLICA_HOSTNAME", "first line of `scontrol show hostnames \"$SLURM_JOB_NODELIST\"`", "HEAD in grpo.sbatch"),
    ("BEAKER_LEADER_REPLICA_IP", "`srun --overlap --nodes=1 --ntasks=1 -w $HEAD hostname --ip-address`",
     "HEAD_IP; asked on the node itself because node names need not resolve elsewhere (NODE_IP_CMD changes the command)"),
    ("BEAKER_REPLICA_COUNT", "SLURM_JOB_NUM_NODES", "checked against cluster.nodes before Ray starts"),
    ("BEAKER_JOB_ID", "SLURM_JOB_ID", "names the Ray temp dirs and logs; the chain's dependency"),
    ("GPUs per replica", "SLURM_GPUS_ON_NODE (from --gpus-per-node)", "ray start --num-gpus on every node"),
    ("CPUs per replica", "SLURM_CPUS_ON_NODE", "ray start --num-cpus and srun --cpus-per-task of the Ray steps"),
    ("RAY_NODE_PORT (open-instruct)", "RAY_PORT=6379, node ports from RAY_NODE_PORT_BASE", "explicit on every node (firewalls, shared hosts)"),
    ("Beaker preemption / retries", "--signal=B:USR1@S, then sbatch --dependency=afterany:$SLURM_JOB_ID", "the chain; --resume auto"),
    ("is_beaker_job() branches", "nothing: grpo_nb never reads launcher variables", "the trainer joins Ray with ray.init(address=\"auto\")"),
]

def markdown_table(header:list[str], rows:list) -> str:
    "Rows as a Markdown table (for notebook output and the guide)."
    esc = lambda s: str(s).replace("|", "\\|")
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
                     ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])

# %%
Markdown(markdown_table(["launcher (Beaker)", "SLURM", "in the generated scripts"], LAUNCHER_TO_SLURM))

# %% [markdown]
# ## What a script needs that the run config does not say
#
# The run's `TrainConfig` knows nodes, GPUs per node and where checkpoints go. The site knows the rest:
# partition, account, walltime, modules, the virtual environment, the interconnect. `SlurmSpec` holds
# those values; every rendered line below comes from one of its fields (or from the config through
# `spec_from_config`).

# %%
#| export
Network = Literal["ethernet", "infiniband", "slingshot"]

@dataclass
class SlurmSpec:
    "The site, queue and bootstrap values of an sbatch script (the run itself is the CONFIG it is given)."
    job_name:str="grpo" # --job-name (`%x` in log file names)
    nodes:int=2 # --nodes (a submission's own --nodes wins and chained jobs keep it)
    gpus_per_node:int=4 # --gpus-per-node
    cpus_per_node:int=0 # --cpus-per-task of the one task a node (0: leave the line out; --exclusive gives all CPUs)
    mem:str="0" # --mem per node ("0": all of it; "": leave the line out)
    exclusive:bool=True # --exclusive: whole nodes, nobody else's processes next to Ray, vLLM and NCCL
    time:str="24:00:00" # --time: walltime of one job of the chain
    partition:str="" # --partition ("": the cluster's default)
    account:str="" # --account ("": your default account)
    qos:str="" # --qos ("": none)
    signal_s:int=600 # --signal=B:USR1@signal_s: seconds before the walltime the trainer is told to checkpoint and stop
    max_job_chains:int=10 # MAX_JOB_CHAINS: jobs one submission may grow into, the first one included
    log_dir:str="logs" # directory of --output (it must exist when you submit; preflight checks it)
    modules:list[str]=field(default_factory=list) # `module load` arguments, e.g. ["cuda/12.6"] (empty: no module command)
    setup:list[str]=field(default_factory=list) # more shell lines run before the venv (conda, exports, ...)
    venv:str=".venv" # virtual environment activated in the job, relative to the submission directory ("": none)
    network:Network="ethernet" # NCCL variable preset for the interconnect (see NETWORK_ENV)
    nccl_debug:str="WARN" # NCCL_DEBUG (the debug ladder uses INFO)
    env:dict[str,str]=field(default_factory=dict) # more exported variables; they win over the presets
    train_cmd:str="grpo_nb train" # the trainer: TRAIN_CMD CONFIG [overrides] --cluster.ray_address=auto --resume auto
    config:str="" # CONFIG used when the submission gives none ("": the first argument is required)
    overrides:list[str]=field(default_factory=list) # config overrides placed before the submission's own
    ray_port:int=6379 # GCS port of the Ray head
    ray_node_port_base:int=20000 # first of the 128 explicit ports Ray uses on each node
    ray_wait_s:int=600 # seconds to wait for every node and GPU to join before the job fails
    code_server_port:int=8765 # port of the code-execution reward service on the head node
    code_server_cmd:str="python -m grpo_nb.rewards serve --host 0.0.0.0 --port $CODE_SERVER_PORT" # starts that service (grpo_nb.rewards)
    extra_sbatch:list[str]=field(default_factory=list) # more #SBATCH options, e.g. ["--constraint=h100"]
    description:str="GRPO on SLURM: a Ray cluster over the job's nodes, the trainer on the first node, chained jobs." # first comment line

# %%
SlurmSpec().signal_s, SlurmSpec(nodes=16).nodes

# %% [markdown]
# `spec_from_config` takes the shape of the job (nodes, GPUs and CPUs per node) from a run's config, so
# that `grpo_nb sbatch run.yaml` asks SLURM for what the config will place.

# %%
#| export
def spec_from_config(cfg:TrainConfig, **kw) -> SlurmSpec:
    "A `SlurmSpec` whose job shape follows `cfg.cluster`; keyword arguments set any other field."
    C = cfg.cluster
    shape = dict(nodes=C.nodes, gpus_per_node=C.gpus_per_node if C.device != "cpu" else 0, cpus_per_node=C.cpus_per_node)
    return SlurmSpec(**{**shape, **kw})

# %%
s = spec_from_config(load_config(None, ["--cluster.nodes=2", "--cluster.learners_per_node=[4,4]"]), partition="gpu")
test_eq((s.nodes, s.gpus_per_node, s.partition), (2, 8, "gpu"))

# %% [markdown]
# ## Rendering
#
# The scripts are text with `{{name}}` holes (bash itself uses `${...}` everywhere, so Python's format
# braces would need escaping on every line). `fill` refuses to leave a hole open.

# %%
#| export
def fill(template:str, **values) -> str:
    "Replace every `{{name}}` in `template` with `values[name]`; raise if a hole is left."
    out = re.sub(r"\{\{(\w+)\}\}", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)
    left = sorted(set(re.findall(r"\{\{(\w+)\}\}", out)))
    if left: raise KeyError(f"template holes without a value: {left}")
    return out

# %%
test_eq(fill("ray start --port={{port}} # ${HOME}", port=6379), "ray start --port=6379 # ${HOME}")
test_fail(lambda: fill("{{nope}}"), contains="nope")

# %% [markdown]
# ### The header
#
# `#SBATCH` lines are read by `sbatch` before the script runs. One task per node: the task is Ray's node
# daemon, and Ray (not SLURM) hands GPUs to learners and engines. `--signal=B:USR1@S` asks SLURM to send
# `SIGUSR1` to the batch shell (`B:`) `S` seconds before the walltime; the controller checks every 30 s,
# so it can come up to 30 s early. Options that are empty are left out rather than written empty
# (`#SBATCH --partition=` is an error). The log directory of `--output` must exist before submission:
# SLURM cannot create it and the job then fails with no log at all.

# %%
#| export
def sbatch_header(spec:SlurmSpec) -> list[str]:
    "The `#SBATCH` lines of `spec`."
    opts = [f"--job-name={spec.job_name}", f"--nodes={spec.nodes}", "--ntasks-per-node=1"]
    if spec.gpus_per_node: opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.cpus_per_node: opts.append(f"--cpus-per-task={spec.cpus_per_node}")
    if spec.mem: opts.append(f"--mem={spec.mem}")
    if spec.exclusive: opts.append("--exclusive")
    opts.append(f"--time={spec.time}")
    opts += [f"--{k}={v}" for k, v in [("partition", spec.partition), ("account", spec.account), ("qos", spec.qos)] if v]
    opts += [f"--signal=B:USR1@{spec.signal_s}", f"--output={spec.log_dir}/%x-%j.out", *spec.extra_sbatch]
    return [f"#SBATCH {o}" for o in opts]

# %%
print("\n".join(sbatch_header(SlurmSpec(partition="gpu", account="a5k"))))

# %%
test_eq(sbatch_header(SlurmSpec(gpus_per_node=0, mem="", exclusive=False))[3:5], ["#SBATCH --time=24:00:00", "#SBATCH --signal=B:USR1@600"])

# %% [markdown]
# ### The network and engine variables
#
# NCCL picks its transport and interface by itself and is often wrong on a new cluster; these presets are
# the variables the seeds' clusters needed. `NCCL_CUMEM_ENABLE=0` is needed by vLLM weight broadcasts over
# NCCL (open-instruct sets it; without it the sync hangs). `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` turns a dead
# peer into an error instead of a hang that burns the walltime. The Slingshot preset is what HPE's
# `aws-ofi-nccl` plugin needs (the seeds' Isambard GH200 nodes); the others are the safe defaults for TCP
# and InfiniBand. `spec.env` wins over all of them.
#
# vLLM needs one variable per node, not per job: `VLLM_HOST_IP`, the address its multi-node paths
# advertise, which `ray_node_setup.sh` sets to each node's own address before `ray start` (Ray workers
# inherit it). The seeds also exported `VLLM_USE_V1=1` and `VLLM_ATTENTION_BACKEND=FLASH_ATTN` (from
# open-instruct's launcher); the vLLM versions grpo-nb pins have only the V1 engine and choose the
# attention backend themselves, so the scripts leave both out (add them with `--env` for an older vLLM).

# %%
#| export
NETWORK_ENV:dict[str, dict[str, tuple[str, str]]] = {
    "common": {
        "NCCL_CUMEM_ENABLE": ("0", "vLLM weight broadcast over NCCL hangs without it (open-instruct sets it too)"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "a dead peer raises an error instead of hanging until the walltime"),
        "RAY_AUTH_MODE": ("disabled", "one setting for head, workers and driver (else joining fails with InvalidAuthToken)"),
        "RAY_USAGE_STATS_ENABLED": ("0", "compute nodes usually have no internet"),
        "HF_HUB_OFFLINE": ("1", "models and datasets come from local paths or the cache, never the network"),
        "TOKENIZERS_PARALLELISM": ("false", "no tokenizer thread pools forked into Ray workers"),
    },
    "ethernet": {
        "NCCL_IB_DISABLE": ("1", "no InfiniBand: NCCL uses TCP sockets"),
        "NCCL_SOCKET_IFNAME": ("^lo,docker", "any interface but loopback and docker bridges (name yours, e.g. eth0, if NCCL picks a slow one)"),
    },
    "infiniband": {
        "NCCL_IB_HCA": ("mlx5", "InfiniBand adapters NCCL may use (`ibstat` lists yours)"),
        "NCCL_SOCKET_IFNAME": ("^lo,docker", "interface of NCCL's bootstrap connections"),
    },
    "slingshot": {
        "NCCL_NET": ("AWS Libfabric", "NCCL's network plugin: aws-ofi-nccl over libfabric (load its module)"),
        "FI_PROVIDER": ("cxi", "libfabric provider of the Slingshot NICs"),
        "NCCL_SOCKET_IFNAME": ("hsn", "Slingshot high-speed interfaces hsn0, hsn1, ..."),
        "NCCL_CROSS_NIC": ("1", "rings may leave through a different NIC than they enter"),
        "NCCL_NET_GDR_LEVEL": ("PHB", "GPUDirect RDMA when GPU and NIC share a PCIe host bridge"),
        "FI_CXI_DISABLE_HOST_REGISTER": ("1", "avoids cxi memory-registration failures with CUDA buffers"),
        "FI_MR_CACHE_MONITOR": ("userfaultfd", "libfabric registration cache monitor that works with CUDA memory"),
    },
}

def env_vars(spec:SlurmSpec) -> dict[str, tuple[str, str]]:
    "Variable -> (value, why) exported by the script: common presets, the network's, NCCL_DEBUG, then `spec.env`."
    out = {**NETWORK_ENV["common"], **NETWORK_ENV[spec.network]}
    out["NCCL_DEBUG"] = (spec.nccl_debug, "WARN in production; INFO shows the transport and interface NCCL chose")
    out.update({k: (v, "set by this script's SlurmSpec.env") for k, v in spec.env.items()})
    return out

# %%
Markdown(markdown_table(["variable", "value", "why"], [(k, v, why) for k, (v, why) in env_vars(SlurmSpec(network="slingshot")).items()]))

# %% [markdown]
# The environment block loads modules, runs the site's setup lines, activates the virtual environment and
# exports the variables. `srun` steps inherit the batch shell's environment, so every node's Ray, and
# every Ray worker process, sees the same values.

# %%
#| export
def env_block(spec:SlurmSpec) -> list[str]:
    "Shell lines that load the software environment and export the variables."
    out = ["# ---- 2. Software and variables (srun steps and Ray workers inherit them) ----"]
    if spec.modules: out += ["module purge"] + [f"module load {m}" for m in spec.modules]
    else: out.append("# module load cuda/12.6   # your site's modules: grpo_nb sbatch --module cuda/12.6 ...")
    out += list(spec.setup)
    if spec.venv:
        v = shlex.quote(spec.venv + "/bin/activate")
        out += [f"[ -f {v} ] || {{ log \"no virtual environment at {spec.venv} (relative to $PWD): grpo_nb sbatch --venv PATH\"; exit 2; }}",
                f"source {v}"]
    lines = [(f"export {k}={shlex.quote(v)}", why) for k, (v, why) in env_vars(spec).items()]
    w = max(len(l) for l, _ in lines)
    out += [f"{l:<{w}}  # {why}" for l, why in lines]
    return out

# %%
print("\n".join(env_block(SlurmSpec(modules=["cuda/12.6", "brics/aws-ofi-nccl/1.8.1"], network="slingshot"))))

# %% [markdown]
# ### Knobs
#
# Values a user may change at submission without editing the script: `sbatch --export=ALL,NAME=value` or
# just `NAME=value sbatch ...` (the default `--export=ALL` carries the environment into the job and on
# into every chained job). `TRAIN_CMD` is the one place the trainer is named. The chain counter is
# `GRPO_CHAIN_INDEX`, deliberately not `SLURM_*`-named.

# %%
#| export
def knobs_block(spec:SlurmSpec) -> list[str]:
    "Variables with defaults that a submission's environment can override."
    knobs = [
        ("TRAIN_CMD", spec.train_cmd, "the trainer (contract in nbs/09_slurm.ipynb)"),
        ("MAX_JOB_CHAINS", spec.max_job_chains, "jobs this submission may grow into, itself included"),
        ("GRPO_CHAIN_INDEX", 0, "this job's place in the chain, 0 = submitted by hand (never name it SLURM_*)"),
        ("RAY_PORT", spec.ray_port, "GCS port of the head"),
        ("RAY_NODE_PORT_BASE", spec.ray_node_port_base, "first of the 128 ports Ray uses on each node"),
        ("RAY_WAIT_S", spec.ray_wait_s, "seconds for every node and GPU to join Ray"),
        ("RAY_STOP_S", 60, "seconds for the Ray steps to stop at the end"),
        ("RAY_TMPDIR_BASE", "/tmp", "node-local directory for Ray's sockets and logs (short path)"),
        ("NODE_IP_CMD", "hostname --ip-address", "prints a node's address (first word used)"),
        ("CODE_SERVER_PORT", spec.code_server_port, "code-execution reward service on the head node"),
    ]
    lines = [(f"{k}=${{{k}:-{shlex.quote(str(v))}}}", why) for k, v, why in knobs]
    w = max(len(l) for l, _ in lines)
    out = ["# ---- 3. Knobs: override at submission, e.g. RAY_WAIT_S=1200 sbatch ... (--export=ALL carries them on) ----"]
    out += [f"{l:<{w}}  # {why}" for l, why in lines]
    out.append("export RAY_PORT RAY_NODE_PORT_BASE RAY_WAIT_S RAY_TMPDIR_BASE NODE_IP_CMD   # read by ray_node_setup.sh")
    return out

# %%
print("\n".join(knobs_block(SlurmSpec())))

# %% [markdown]
# ### Functions
#
# The script's logic lives in a few shell functions defined before anything runs, so that the signal
# trap exists from the first line and the tests can source the block on its own (between the `>>>` and
# `<<<` markers) and drive `chain_next` with a stub `sbatch`.
#
# - `job_field NAME` reads a field of `scontrol show job -o $SLURM_JOB_ID`: `Command=` is the path that was
#   submitted (`$0` is slurmd's spooled copy, with no `ray_node_setup.sh` beside it), `StdOut=` gives the
#   log directory, `TimeLimit=` the walltime a chained job must ask for again.
# - `latest_step` reads the trainer's `latest` file (the trainer contract, below): the number at the end
#   of its text is the step of the newest complete checkpoint, -1 when there is none. A DeepSpeed-style
#   `global_step120` works as well as a bare `120`.
# - `on_stop` is the trap: it records that the walltime is near and forwards `SIGUSR1` to the trainer.

# %%
#| export
FUNCTIONS_HEAD = r'''log() { echo "[grpo.sbatch $(date +%T)] $*"; }
job_field() {  # job_field NAME: one field of `scontrol show job -o $SLURM_JOB_ID` (read once into JOB_INFO)
  sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" <<<"$JOB_INFO"
}
latest_step() {  # step of the newest complete checkpoint: the number ending $CKPT_DIR/latest, or -1
  local s; s=$(grep -o '[0-9][0-9]*[[:space:]]*$' "$CKPT_DIR/latest" 2>/dev/null | tr -d '[:space:]')
  echo "${s:--1}"
}
on_stop() {  # the trap: SIGUSR1 (walltime near) or SIGTERM (scancel, walltime): checkpoint and stop
  STOP_REQUESTED=1
  log "got SIG$1: asking the trainer${TRAIN_PID:+ (pid $TRAIN_PID)} to checkpoint and exit"
  if [ -n "$TRAIN_PID" ]; then kill -USR1 "$TRAIN_PID" 2>/dev/null; fi
  return 0
}'''

# %% [markdown]
# **The chain.** `chain_ledger_start` appends this job to `OUTPUT_DIR/slurm_chain.log`. A job whose id
# is the last `submitted` line there was submitted by the chain; any other job starts a new ledger. The
# number of `started` lines is the chain's length, counted from files instead of from the environment, so
# the cap holds even if the counter does not propagate.
#
# `chain_next RC START END` submits the next job only when all of these hold, and says which one failed
# otherwise:
#
# 1. the walltime signal came (without it the trainer ended on its own: finished or crashed);
# 2. the trainer exited 0 (it checkpointed);
# 3. this job checkpointed a step beyond the one it started from (no progress: a next job fails alike);
# 4. the run is not finished (`END < total_steps`);
# 5. the counter is below `MAX_JOB_CHAINS - 1`, and 6. so is the ledger.
#
# The next job asks for the same nodes, walltime, partition, account and name as this one (a
# submission's command-line options are not in the script, so they would otherwise be lost), waits for
# this job to end (`afterany`), and gets the same CONFIG and arguments. Options that `scontrol` does not
# show (`--signal`, the `--output` pattern) come from the `#SBATCH` lines or from `SBATCH_SIGNAL`/
# `SBATCH_OUTPUT` in the environment, which `--export=ALL` carries along.

# %%
#| export
FUNCTIONS_CHAIN = r'''chain_ledger_start() {  # record this job in $LEDGER; JOBS_IN_CHAIN = jobs of this chain so far
  if ! { [ -f "$LEDGER" ] && [ "$(tail -n 1 "$LEDGER")" = "submitted $SLURM_JOB_ID" ]; }; then
    if [ -f "$LEDGER" ]; then mv "$LEDGER" "$LEDGER.prev"; fi  # submitted by hand: a new chain
  fi
  echo "started $SLURM_JOB_ID index=$GRPO_CHAIN_INDEX $(date +%FT%T)" >> "$LEDGER"
  JOBS_IN_CHAIN=$(grep -c '^started ' "$LEDGER")
}
chain_next() {  # chain_next TRAIN_RC START_STEP END_STEP: submit the job that resumes, or say why not
  local rc=$1 start=$2 end=$3 next=$((GRPO_CHAIN_INDEX + 1)) id
  if [ "$STOP_REQUESTED" != 1 ]; then log "chain: stop: the trainer ended before the walltime signal (exit $rc)"; return 0; fi
  if [ "$rc" != 0 ]; then log "chain: stop: the trainer failed (exit $rc); resubmit by hand once fixed (it resumes from step $end)"; return 0; fi
  if [ "$end" -le "$start" ]; then log "chain: stop: no new checkpoint in this job (step $start -> $end); the next job would fail alike"; return 0; fi
  if [ "$end" -ge "$TOTAL_STEPS" ]; then log "chain: stop: the run is complete (step $end of $TOTAL_STEPS)"; return 0; fi
  if [ "$next" -ge "$MAX_JOB_CHAINS" ]; then log "chain: stop: GRPO_CHAIN_INDEX=$GRPO_CHAIN_INDEX is the last of MAX_JOB_CHAINS=$MAX_JOB_CHAINS"; return 0; fi
  if [ "$JOBS_IN_CHAIN" -ge "$MAX_JOB_CHAINS" ]; then log "chain: stop: $LEDGER lists $JOBS_IN_CHAIN jobs = MAX_JOB_CHAINS (the counter says $GRPO_CHAIN_INDEX)"; return 0; fi
  if ! id=$(sbatch --parsable --dependency="afterany:$SLURM_JOB_ID" --nodes="$SLURM_JOB_NUM_NODES" --time="$TIME_LIMIT" \
      --job-name="$SLURM_JOB_NAME" ${SLURM_JOB_PARTITION:+--partition="$SLURM_JOB_PARTITION"} \
      ${SLURM_JOB_ACCOUNT:+--account="$SLURM_JOB_ACCOUNT"} \
      --export="ALL,GRPO_CHAIN_INDEX=$next,MAX_JOB_CHAINS=$MAX_JOB_CHAINS" "$SCRIPT" "${ARGS[@]}"); then
    log "chain: sbatch failed (its message is above)"; return 1
  fi
  id=${id%%;*}
  echo "submitted $id" >> "$LEDGER"
  log "chain: submitted job $id (GRPO_CHAIN_INDEX=$next); it starts when job $SLURM_JOB_ID ends and resumes from step $end"
}'''

# %% [markdown]
# **Stopping Ray.** The head leaves first: `stop_ray` sends `SIGTERM` to the head's `ray_node_setup.sh`
# (its PID file is on this node, which is the head), which stops `ray start --block` cleanly. Each worker
# notices that the head's port is closed, stops its own Ray and exits 0, so its `srun` step ends
# `COMPLETED`. Killing an `srun` instead would make SLURM `SIGKILL` the step ("forcing job termination").

# %%
#| export
FUNCTIONS_STOP = r'''stop_ray() {  # the head leaves first; every worker sees it go, stops its Ray and exits 0
  if [ -n "${CODE_PID:-}" ]; then kill -TERM "$CODE_PID" 2>/dev/null; fi
  [ "${#RAY_PIDS[@]}" -gt 0 ] || return 0
  local pidfile="$RAY_TMPDIR_BASE/ray-$SLURM_JOB_ID-0.pid" t p alive i rc
  if [ -f "$pidfile" ]; then kill -TERM "$(cat "$pidfile")" 2>/dev/null; else kill -TERM "${RAY_PIDS[0]}" 2>/dev/null; fi
  for ((t = 0; t < 4 * RAY_STOP_S; t++)); do
    alive=0; for p in "${RAY_PIDS[@]}"; do if kill -0 "$p" 2>/dev/null; then alive=1; fi; done
    [ "$alive" = 0 ] && break; sleep 0.25
  done
  for i in "${!RAY_PIDS[@]}"; do
    if kill -0 "${RAY_PIDS[$i]}" 2>/dev/null; then log "Ray on ${HOSTS[$i]} still running after ${RAY_STOP_S}s: killing its step"; kill -TERM "${RAY_PIDS[$i]}"; fi
    wait "${RAY_PIDS[$i]}"; rc=$?
    log "Ray on ${HOSTS[$i]} ($([ "$i" = 0 ] && echo head || echo worker)) exited with $rc"
  done
  RAY_PIDS=()
}'''

# %% [markdown]
# ### The job, part by part
#
# **1. Where am I.** The trap is set before anything else runs (the default action of `SIGUSR1` is to
# kill the shell). Then the script reads its own job record once.

# %%
#| export
BLOCK_START = r'''STOP_REQUESTED=0 TRAIN_PID= RAY_PIDS=() HOSTS=() CODE_PID=
trap 'on_stop USR1' USR1
trap 'on_stop TERM' TERM

# ---- 1. This job: the submitted script's real path, its arguments, its log directory ----
JOB_INFO=$(scontrol show job -o "$SLURM_JOB_ID")
SCRIPT=$(job_field Command)          # $0 is slurmd's spooled copy: nothing sits next to it
SCRIPT_DIR=$(cd "$(dirname "$SCRIPT")" && pwd)
LOG_DIR=$(dirname "$(job_field StdOut)")
TIME_LIMIT=$(job_field TimeLimit)
ARGS=("$@")                          # CONFIG [--section.field=value ...], passed on to chained jobs
CONFIG=${1:-{{default_config}}}
[ -n "$CONFIG" ] || { log "usage: sbatch $(basename "$SCRIPT") CONFIG [--section.field=value ...]"; exit 2; }
[ $# -gt 0 ] && shift
OVERRIDES=({{default_overrides}}"$@")
[ -f "$SCRIPT_DIR/ray_node_setup.sh" ] || { log "no ray_node_setup.sh next to $SCRIPT: keep the two files together"; exit 2; }
log "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: $SCRIPT $CONFIG ${OVERRIDES[*]}"'''

# %% [markdown]
# **4. The run.** `grpo_nb` itself reads CONFIG (with the same overrides the trainer gets) and prints the
# values the script needs as shell assignments: output and checkpoint directories (absolute), total steps,
# and whether a reward function needs the code-execution service. It also refuses a job whose node or GPU
# count differs from what the config will place, before a minute of Ray start-up is spent.

# %%
#| export
BLOCK_RUN = r'''# ---- 4. The run, as grpo_nb reads CONFIG: OUTPUT_DIR CKPT_DIR TOTAL_STEPS CODE_REWARDS ----
RUN_ENV=$(python -c 'import sys; from grpo_nb.slurm import job_env_cli; sys.exit(job_env_cli())' "$CONFIG" "${OVERRIDES[@]}") \
  || { log "cannot run CONFIG=$CONFIG with this job (message above)"; exit 2; }
eval "$RUN_ENV"
mkdir -p "$OUTPUT_DIR" "$CKPT_DIR"
LEDGER=$OUTPUT_DIR/slurm_chain.log
chain_ledger_start
log "chain: job $((GRPO_CHAIN_INDEX + 1)) (ledger: $JOBS_IN_CHAIN) of at most MAX_JOB_CHAINS=$MAX_JOB_CHAINS; checkpoints in $CKPT_DIR"'''

# %% [markdown]
# **5. Ray.** The head is the first host of the allocation, the node this shell runs on. Its address is
# asked on the node itself (`srun -w $HEAD hostname --ip-address`): node names need not resolve anywhere
# else (on CI's emulated nodes they resolve nowhere). A head address on loopback is fine only when every
# "node" is the same host. Each node's Ray runs in its own background step, `--overlap` (or every later
# step would wait for it to end) with `--nodes=1 --ntasks=1` (or it inherits the job's task count and runs
# once per node) and `--cpus-per-task` (since SLURM 22.05 `srun` no longer inherits the job's CPUs per task).
# The head starts first; the workers start once its `ray_node_setup.sh` has written the `.up` file on this
# node. Then `wait_ray` (below) polls until every host has joined with its GPUs, while the shell watches
# the Ray steps: a node whose step has ended will never join, so the job fails at once, naming it. `RAY_ADDRESS` tells the
# trainer's `ray.init(address="auto")` where the cluster is, so it never picks up another cluster from
# `/tmp/ray` on a shared node.

# %%
#| export
BLOCK_RAY = r'''# ---- 5. Ray: the head on this node (the first of the job), then a worker on every other node ----
mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD=${HOSTS[0]}
[ "$HEAD" = "${SLURMD_NODENAME:-$HEAD}" ] || log "warning: this shell runs on $SLURMD_NODENAME, not on the first host $HEAD"
HEAD_IP=$(srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" $NODE_IP_CMD | awk '{print $1; exit}')
[ -n "$HEAD_IP" ] || { log "no address for $HEAD from: srun -w $HEAD $NODE_IP_CMD"; exit 1; }
case $HEAD_IP in 127.*) [ "${#HOSTS[@]}" -gt 1 ] && log "warning: $HEAD says its address is $HEAD_IP (loopback): other hosts cannot reach it; set NODE_IP_CMD unless all nodes are one host";; esac
export RAY_ADDRESS=$HEAD_IP:$RAY_PORT        # the trainer's ray.init(address="auto") joins this cluster
GPUS=${SLURM_GPUS_ON_NODE:-0} CPUS=${SLURM_CPUS_ON_NODE:-1}
start_node() {  # start_node RANK: one node's Ray as a background step
  local role=worker; [ "$1" = 0 ] && role=head
  srun --overlap --nodes=1 --ntasks=1 --cpus-per-task="$CPUS" -w "${HOSTS[$1]}" \
    bash "$SCRIPT_DIR/ray_node_setup.sh" "$role" "$1" "${HOSTS[$1]}" "$HEAD_IP" "$GPUS" "$CPUS" \
    > "$LOG_DIR/ray-$SLURM_JOB_ID-${HOSTS[$1]}.log" 2>&1 &
  RAY_PIDS+=($!)
}
log "Ray: head $HEAD at $RAY_ADDRESS, ${#HOSTS[@]} node(s) x $GPUS GPU(s); logs in $LOG_DIR/ray-$SLURM_JOB_ID-<node>.log"
start_node 0
HEAD_UP=$RAY_TMPDIR_BASE/ray-$SLURM_JOB_ID-0.up   # written by the head's ray_node_setup.sh on this node
for ((t = 0; t < 2 * RAY_WAIT_S; t++)); do [ -f "$HEAD_UP" ] || ! kill -0 "${RAY_PIDS[0]}" 2>/dev/null && break; sleep 0.5; done
[ -f "$HEAD_UP" ] || { log "the Ray head did not start (see $LOG_DIR/ray-$SLURM_JOB_ID-$HEAD.log): stopping (no chain)"; stop_ray; exit 1; }
for ((i = 1; i < ${#HOSTS[@]}; i++)); do start_node "$i"; done
python -c 'import sys; from grpo_nb.slurm import wait_ray_cli; sys.exit(wait_ray_cli())' \
    --address "$RAY_ADDRESS" --gpus-per-node "$GPUS" --timeout "$RAY_WAIT_S" --log-dir "$LOG_DIR" "${HOSTS[@]}" &
WAIT_PID=$!
while kill -0 "$WAIT_PID" 2>/dev/null; do   # a node whose Ray step has ended will not join: fail now, naming it
  for i in "${!RAY_PIDS[@]}"; do
    if ! kill -0 "${RAY_PIDS[$i]}" 2>/dev/null; then
      log "Ray on ${HOSTS[$i]} ended before the cluster formed: see $LOG_DIR/ray-$SLURM_JOB_ID-${HOSTS[$i]}.log"
      kill "$WAIT_PID" 2>/dev/null; break 2
    fi
  done
  sleep 1
done
wait "$WAIT_PID" || { log "the Ray cluster did not form: stopping (no chain)"; stop_ray; exit 1; }'''

# %% [markdown]
# **6. The code-execution service** runs on the head node when a reward function runs code (the
# rewards notebook builds it); the trainer gets its URL as an override.

# %%
#| export
BLOCK_CODE = r'''# ---- 6. The code-execution reward service on the head node, when a reward function runs code ----
CODE_URL=
if [ "$CODE_REWARDS" = 1 ]; then
  CODE_URL=http://$HEAD_IP:$CODE_SERVER_PORT
  # LEAD: the serve entry point of grpo_nb.rewards (issue 8); finalise its options (workers, isolation) here.
  CODE_SERVER_CMD=${CODE_SERVER_CMD:-{{code_server_cmd}}}
  srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" $CODE_SERVER_CMD > "$LOG_DIR/code-server-$SLURM_JOB_ID.log" 2>&1 &
  CODE_PID=$!
  for ((t = 0; t < 120; t++)); do (exec 3<>"/dev/tcp/$HEAD_IP/$CODE_SERVER_PORT") 2>/dev/null && break; kill -0 "$CODE_PID" 2>/dev/null || break; sleep 0.5; done
  (exec 3<>"/dev/tcp/$HEAD_IP/$CODE_SERVER_PORT") 2>/dev/null \
    || { log "the code-execution service did not start (see $LOG_DIR/code-server-$SLURM_JOB_ID.log): stopping (no chain)"; stop_ray; exit 1; }
  log "code-execution service at $CODE_URL (log: $LOG_DIR/code-server-$SLURM_JOB_ID.log)"
fi'''

# %% [markdown]
# **7. Training.** `TRAIN_CMD` runs on this node in the background and the shell waits for it: a trap
# interrupts `wait` (exit status > 128), so the script waits again until the trainer has really exited,
# then asks bash for its real exit status. A signal that came before the trainer started means the
# walltime is nearly over: the script does not start it (no progress, so no chain). The progress of the
# job is the checkpoint step before and after.

# %%
#| export
BLOCK_TRAIN = r'''# ---- 7. Train here, in the background behind `wait`, so that the trap can forward the signal ----
EXTRA=(--cluster.ray_address=auto ${CODE_URL:+--reward.code_service_url=$CODE_URL})
START_STEP=$(latest_step) TRAIN_RC=0
if [ "$STOP_REQUESTED" = 1 ]; then
  log "the walltime signal came before training started: not starting the trainer"
else
  log "training from step $START_STEP: $TRAIN_CMD $CONFIG ${OVERRIDES[*]} ${EXTRA[*]} --resume auto"
  $TRAIN_CMD "$CONFIG" "${OVERRIDES[@]}" "${EXTRA[@]}" --resume auto &
  TRAIN_PID=$!
  if [ "$STOP_REQUESTED" = 1 ]; then kill -USR1 "$TRAIN_PID"; fi   # the signal came while it started
  wait "$TRAIN_PID"
  while kill -0 "$TRAIN_PID" 2>/dev/null; do wait "$TRAIN_PID"; done   # a trap ends `wait` early: wait again
  wait "$TRAIN_PID"; TRAIN_RC=$?                                         # the trainer's own exit status
fi
END_STEP=$(latest_step)
log "trainer exit $TRAIN_RC; checkpoint step $START_STEP -> $END_STEP"'''

# %% [markdown]
# **8. The end.** Chain first (a slow Ray shutdown must not eat the time left to submit), then stop Ray,
# then exit with the trainer's status.

# %%
#| export
BLOCK_END = r'''# ---- 8. The next job of the chain, then Ray down; exit with the trainer's status ----
chain_next "$TRAIN_RC" "$START_STEP" "$END_STEP"
stop_ray
log "done"
exit "$TRAIN_RC"'''

# %% [markdown]
# `render_sbatch` puts the parts together. `spec.config` and `spec.overrides` become the defaults of the
# script's arguments (`grpo_nb sbatch` bakes a run into its script that way).

# %%
#| export
def render_sbatch(spec:SlurmSpec, name:str="grpo.sbatch") -> str:
    "The batch script of `spec`, as text."
    intro = [f"#!/bin/bash", f"# {name}: {spec.description}",
             "# Generated by grpo_nb.slurm (nbs/09_slurm.ipynb): change the notebook or run `grpo_nb sbatch`; do not edit by hand.",
             "#", f"#   sbatch [--nodes=N] [--time=T] {name} {'[CONFIG]' if spec.config else 'CONFIG'} [--section.field=value ...]",
             "#", "# Needs ray_node_setup.sh in the same directory, on a file system every node sees."]
    ov = "".join(shlex.quote(o) + " " for o in spec.overrides)
    body = [BLOCK_START, "\n".join(env_block(spec)), "\n".join(knobs_block(spec)), BLOCK_RUN, BLOCK_RAY,
            BLOCK_CODE, BLOCK_TRAIN, BLOCK_END]
    text = "\n".join(intro + sbatch_header(spec) + ["set -uo pipefail", "",
                     "# >>> functions (tests source this block alone)", FUNCTIONS_HEAD, FUNCTIONS_CHAIN, FUNCTIONS_STOP,
                     "# <<< functions", ""]) + "\n" + "\n\n".join(body) + "\n"
    return fill(text, default_config=shlex.quote(spec.config) if spec.config else "",
                default_overrides=ov, code_server_cmd=spec.code_server_cmd)

# %%
script = render_sbatch(SlurmSpec())
print(f"{len(script.splitlines())} lines; the first 24:"); print("\n".join(script.splitlines()[:24]))

# %% [markdown]
# Every script is checked with `bash -n` (syntax) here and in the tests:

# %%
#| export
def bash_syntax_errors(text:str) -> str:
    "What `bash -n` says about a script ('' when the syntax is fine)."
    p = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    return p.stderr.strip()

# %%
test_eq(bash_syntax_errors(script), "")
assert "bash: line 1" in bash_syntax_errors("if then fi")

# %% [markdown]
# ## `ray_node_setup.sh`: one node's Ray
#
# `grpo.sbatch` starts this once per node as `ray_node_setup.sh ROLE RANK HOST HEAD_IP GPUS CPUS`. Both
# roles run `ray start --block` in the background and watch it:
#
# - **head**: writes its PID where `grpo.sbatch` finds it, and on `SIGTERM` stops Ray and exits 0;
# - **worker**: joins, then checks the head every `RAY_HEAD_POLL_S` seconds (a TCP connect, no Ray
#   call); when the head is gone it stops its Ray and exits 0. `srun` expects its task to live as long as
#   the step, and a worker that exits early takes its Ray down with it.
# - both: the node is *up* once `ray start` prints "Ray runtime started." (its raylet registered); the
#   script then writes `<temp dir>.up`. Ray's raylet gives its Python dashboard agent 15 s to start and
#   aborts otherwise, which happens on a busy host or a slow shared file system: a start that fails
#   before the node is up is retried (`RAY_START_TRIES`, default 3). `grpo.sbatch` starts the workers
#   only once the head is up (it runs on the head's node and watches that file), so that a retried head
#   does not strand them, and so that two nodes' Python agents do not compete for the same cores.
#
# Every port is explicit and the same on every node (firewall rules, two jobs on one host), and checked
# before `ray start`: a port that answers belongs to someone else (another job's Ray on a shared node),
# and Ray itself would only notice after a 30 s start-up timeout. Nodes that
# share the head's address (the emulated nodes of CI) shift theirs by 128 × RANK. On `SIGTERM` Ray 2.60
# first "drains" the node for up to 30 s, which a worker whose head is gone cannot finish; a GRPO job has
# nothing to drain at its end, so the script turns it off (`RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0`). Each node announces
# itself to Ray with a custom resource `slurm_node_<host>`, so the wait below can name missing hosts
# (and actors can be pinned to a SLURM node). `VLLM_HOST_IP` is the node's own address, which vLLM's
# multi-node paths advertise.

# %%
#| export
NODE_SETUP = r'''#!/bin/bash
# ray_node_setup.sh: Ray on one node of a SLURM job, kept alive until the job is done with it.
# Generated by grpo_nb.slurm (nbs/09_slurm.ipynb); do not edit by hand.
# grpo.sbatch starts it once per node:
#   srun --overlap --nodes=1 --ntasks=1 -w HOST ray_node_setup.sh ROLE RANK HOST HEAD_IP GPUS CPUS
#   ROLE: head|worker; RANK: the host's index in `scontrol show hostnames` (0 = head)
set -uo pipefail
ROLE=$1 RANK=$2 HOST=$3 HEAD_IP=$4 GPUS=$5 CPUS=$6
RAY_PORT=${RAY_PORT:-{{ray_port}}} BASE=${RAY_NODE_PORT_BASE:-{{ray_node_port_base}}} TRIES=${RAY_START_TRIES:-3}
say() { echo "[ray_node_setup $HOST $(date +%T)] $*"; }
head_alive() { timeout 5 bash -c "exec 3<>/dev/tcp/$HEAD_IP/$RAY_PORT" 2>/dev/null; }

NODE_IP=$HEAD_IP
if [ "$ROLE" = worker ]; then NODE_IP=$(${NODE_IP_CMD:-hostname --ip-address} | awk '{print $1; exit}'); fi
# Ports: explicit and the same on every node; nodes sharing the head's address (emulated nodes) shift by 128 x RANK.
SHIFT=0; if [ "$ROLE" = worker ] && [ "$NODE_IP" = "$HEAD_IP" ]; then SHIFT=$((128 * RANK)); fi
P=$((BASE + SHIFT))
TMP=${RAY_TMPDIR_BASE:-/tmp}/ray-${SLURM_JOB_ID}-$RANK   # node-local; Unix socket paths must stay short
export VLLM_HOST_IP=$NODE_IP                              # the address vLLM advertises from this node
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}  # nothing to drain at the end of a job
ARGS=(--node-ip-address="$NODE_IP" --num-gpus="$GPUS" --num-cpus="$CPUS" --resources="{\"slurm_node_$HOST\": 1}"
      --node-manager-port=$P --object-manager-port=$((P + 1)) --runtime-env-agent-port=$((P + 2))
      --dashboard-agent-grpc-port=$((P + 3)) --dashboard-agent-listen-port=$((P + 4)) --metrics-export-port=$((P + 5))
      --min-worker-port=$((P + 16)) --max-worker-port=$((P + 127)) --temp-dir="$TMP" --disable-usage-stats --block)
if [ -n "${RAY_OBJECT_STORE_MEMORY:-}" ]; then ARGS+=(--object-store-memory="$RAY_OBJECT_STORE_MEMORY"); fi
if [ "$ROLE" = head ]; then
  ARGS=(--head --port="$RAY_PORT" --ray-client-server-port=$((P + 6)) --include-dashboard="${RAY_INCLUDE_DASHBOARD:-false}" "${ARGS[@]}")
else
  ARGS=(--address="$HEAD_IP:$RAY_PORT" "${ARGS[@]}")
  head_alive || { say "nothing listens at the head, $HEAD_IP:$RAY_PORT"; exit 1; }
fi

for port in $P $((P + 1)) $((P + 2)) $((P + 3)) $((P + 4)) $((P + 5)) $([ "$ROLE" = head ] && echo "$RAY_PORT $((P + 6))"); do
  if timeout 2 bash -c "exec 3<>/dev/tcp/$NODE_IP/$port" 2>/dev/null; then
    say "port $port on $NODE_IP is taken (another job's Ray on this node?): set RAY_NODE_PORT_BASE (and RAY_PORT) to free ones"; exit 1
  fi
done

RAY_PID=
stop() { say "$1: stopping Ray here"; if [ -n "$RAY_PID" ]; then kill -TERM "$RAY_PID" 2>/dev/null; wait "$RAY_PID"; fi; rm -f "$TMP.pid" "$TMP.up"; exit 0; }
trap 'stop "asked to stop"' TERM
echo $$ > "$TMP.pid"                                       # grpo.sbatch sends SIGTERM here to stop the head
for ((try = 1; ; try++)); do
  say "$ROLE $RANK: ray start at $NODE_IP (node ports $P-$((P + 127))), $GPUS GPU(s), $CPUS CPU(s), try $try of $TRIES"
  : > "$TMP.out"
  ray start "${ARGS[@]}" > >(tee -a "$TMP.out") 2>&1 &
  RAY_PID=$! UP=0
  while kill -0 "$RAY_PID" 2>/dev/null; do
    if [ "$UP" = 0 ] && grep -q "Ray runtime started" "$TMP.out"; then UP=1; touch "$TMP.up"; say "Ray is up"; fi
    if [ "$ROLE" = worker ] && ! head_alive; then stop "the head is gone"; fi
    if [ "$UP" = 1 ]; then sleep "${RAY_HEAD_POLL_S:-5}" & else sleep 0.5 & fi
    wait $!
  done
  wait "$RAY_PID"; rc=$?; RAY_PID=
  if [ "$ROLE" = worker ] && ! head_alive; then say "Ray stopped after the head left: exiting 0"; exit 0; fi
  if [ "$UP" = 0 ] && [ "$try" -lt "$TRIES" ]; then say "ray start failed (exit $rc) before Ray was up; retrying (logs: $TMP/session_latest/logs)"; sleep 2; continue; fi
  say "Ray exited with $rc (logs: $TMP/session_latest/logs)"; exit "$rc"
done
'''

def render_node_setup(spec:SlurmSpec) -> str:
    "The per-node Ray bootstrap script, as text."
    return fill(NODE_SETUP, ray_port=spec.ray_port, ray_node_port_base=spec.ray_node_port_base)

# %%
node_setup = render_node_setup(SlurmSpec())
test_eq(bash_syntax_errors(node_setup), "")
print("\n".join(l for l in node_setup.splitlines() if "ray start" in l and "say" not in l))

# %% [markdown]
# ## The scripts in `sbatch/`: production and a debug ladder
#
# A new cluster breaks in a new way at every scale, so the scripts come as a ladder; each rung adds one
# thing that can fail, and a rung is worth a queue slot only once the one below works:
#
# 1. `debug_tiny.sbatch`: the tiny built-in model (`demo`) on the smallest GPU job there is, two GPUs
#    (grpo-nb never puts a learner and an engine on one GPU: NCCL stops with "Duplicate GPU detected"):
#    modules, venv, CUDA, vLLM and the trainer start at all; no chain.
# 2. `debug_1node.sbatch`: one whole node and your config: several GPUs, NCCL inside a node, placement;
#    `NCCL_DEBUG=INFO` shows which transport NCCL chose.
# 3. `debug_2nodes.sbatch`: two nodes: Ray across nodes, NCCL over the network, and a short walltime with
#    two chained jobs, so the signal, checkpoint and resume path runs before you trust it with a week.
# 4. `grpo.sbatch`: production.

# %%
#| export
LADDER:dict[str, SlurmSpec] = {
    "grpo.sbatch": SlurmSpec(),
    "debug_tiny.sbatch": SlurmSpec(
        job_name="grpo-debug-tiny", nodes=1, gpus_per_node=2, cpus_per_node=8, mem="64G", exclusive=False,
        time="00:30:00", signal_s=120, max_job_chains=1, nccl_debug="INFO", config="demo",
        overrides=["--cluster.device=cuda", "--cluster.nodes=1", "--cluster.gpus_per_node=2", "--cluster.learners_per_node=[1]"],
        description="debug rung 1: the tiny built-in model on two GPUs (a learner, an engine); modules, venv, CUDA, vLLM, the trainer."),
    "debug_1node.sbatch": SlurmSpec(
        job_name="grpo-debug-1node", nodes=1, time="01:00:00", signal_s=300, max_job_chains=1, nccl_debug="INFO",
        overrides=["--cluster.nodes=1"],
        description="debug rung 2: one whole node with your config; NCCL inside a node, placement of learners and engines."),
    "debug_2nodes.sbatch": SlurmSpec(
        job_name="grpo-debug-2nodes", nodes=2, time="00:20:00", signal_s=300, max_job_chains=2, nccl_debug="INFO",
        overrides=["--cluster.nodes=2"],
        description="debug rung 3: two nodes, Ray and NCCL across them, and one chained job (signal, checkpoint, resume)."),
}

def render_scripts(out_dir:str|Path="sbatch") -> list[Path]:
    "Write the ladder's scripts and `ray_node_setup.sh` into `out_dir`; return their paths."
    out = Path(out_dir); out.mkdir(parents=True, exist_ok=True)
    texts = {name: render_sbatch(spec, name) for name, spec in LADDER.items()}
    texts["ray_node_setup.sh"] = render_node_setup(LADDER["grpo.sbatch"])
    paths = []
    for name, text in texts.items():
        p = out / name
        if not p.exists() or p.read_text() != text: p.write_text(text)
        p.chmod(0o755); paths.append(p)
    return paths

# %%
with tempfile.TemporaryDirectory() as d:
    paths = render_scripts(d)
    rows = [(p.name, len(p.read_text().splitlines()), bash_syntax_errors(p.read_text()) or "ok") for p in paths]
Markdown(markdown_table(["script", "lines", "bash -n"], rows))

# %%
test_eq({r[2] for r in rows}, {"ok"})

# %% [markdown]
# The first rung brings its own config (the `demo` preset, moved to GPUs by its overrides); the job it
# asks for must hold what that config places, learners plus engines:

# %%
for name, spec in LADDER.items():
    if spec.config:
        c = load_config(spec.config, spec.overrides)
        test_eq((c.cluster.nodes, c.cluster.gpus_per_node, derive(c).gpus_needed <= spec.nodes * spec.gpus_per_node), (spec.nodes, spec.gpus_per_node, True))

# %% [markdown]
# `tools/render_scripts.py` (run by `make export`, checked by `make test`) writes them into `sbatch/` of
# the repository; the [guide](guides/slurm_migration.ipynb) shows them whole.
#
# ## The run's values for the script
#
# `job_env` is what `grpo.sbatch` asks `grpo_nb` at step 4: a config and the job's SLURM variables in,
# shell assignments out, or a `ConfigError` that names the fix when the job cannot run this config.

# %%
#| export
def uses_code_rewards(cfg:TrainConfig) -> bool:
    "Whether a reward function of `cfg` runs code (needs the code-execution service; names containing 'code')."
    return any("code" in name for name, w in cfg.reward.functions.items() if w) and not cfg.reward.code_service_url

def job_env(cfg:TrainConfig, environ:dict) -> dict[str, str]:
    "Shell variables of a run inside a SLURM job (`environ`: the job's environment); raises `ConfigError` on a mismatch."
    C, d = cfg.cluster, derive(cfg)
    nodes = environ.get("SLURM_JOB_NUM_NODES")
    if nodes and int(nodes) != C.nodes:
        raise ConfigError("cluster.nodes", f"the config places work on {C.nodes} node(s) but job {environ.get('SLURM_JOB_ID', '?')} has {nodes}.",
                          f"sbatch --nodes={C.nodes} ..., or pass --cluster.nodes={nodes} (and learners_per_node to match)")
    gpus = environ.get("SLURM_GPUS_ON_NODE")
    if C.device != "cpu" and gpus is not None and int(gpus) < C.gpus_per_node:
        raise ConfigError("cluster.gpus_per_node", f"the config expects {C.gpus_per_node} GPUs a node but the job has {gpus}.",
                          f"sbatch --gpus-per-node={C.gpus_per_node} ..., or --cluster.gpus_per_node={gpus}")
    return {"OUTPUT_DIR": str(Path(cfg.logging.output_dir).resolve()), "CKPT_DIR": str(Path(d.checkpoint_dir).resolve()),
            "TOTAL_STEPS": str(cfg.total_steps), "CODE_REWARDS": "1" if uses_code_rewards(cfg) else "0"}

# %%
cfg = load_config("demo")
job_env(cfg, {"SLURM_JOB_NUM_NODES": "1"})

# %%
test_fail(lambda: job_env(cfg, {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "7"}), contains="sbatch --nodes=1")
test_eq(job_env(load_config("demo", ["--reward.functions={code: 1.0}"]), {})["CODE_REWARDS"], "1")

# %% [markdown]
# `job_env_cli` is the command-line face: `python -c '... job_env_cli()' CONFIG [overrides]` prints
# `NAME=value` lines for `eval`, or the error (exit 2).

# %%
#| export
def job_env_cli(argv:list[str]|None=None) -> int:
    "Print `job_env` of CONFIG [overrides] in this job's environment as shell assignments; exit 2 with the fix on a mismatch."
    argv = sys.argv[1:] if argv is None else argv
    if not argv: print("usage: job_env_cli CONFIG [--section.field=value ...]", file=sys.stderr); return 2
    try: env = job_env(load_config(argv[0], argv[1:]), dict(os.environ))
    except ConfigError as e: print(f"grpo_nb: {e}", file=sys.stderr); return 2
    print("\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    return 0

# %%
test_eq(job_env_cli(["demo", "--total_steps=3"]), 0)

# %% [markdown]
# ## Waiting for the Ray cluster
#
# The seeds' script slept 30 s and hoped. Here the script polls the cluster until every host of the
# allocation has a live Ray node with its GPUs, and otherwise fails after `RAY_WAIT_S` naming the hosts
# that are missing or short of GPUs, with the log file to read. `ray_hosts` and `missing_hosts` are pure
# functions of what `ray.nodes()` returns, tested here without a cluster.

# %%
#| export
def ray_hosts(nodes:list[dict]) -> dict[str, float]:
    "SLURM host -> GPUs, for the live nodes of `ray.nodes()` that carry a `slurm_node_<host>` resource."
    out = {}
    for n in nodes:
        if not n.get("Alive"): continue
        res = n.get("Resources", {})
        for k in res:
            if k.startswith("slurm_node_"): out[k[len("slurm_node_"):]] = res.get("GPU", 0.0)
    return out

def missing_hosts(expected:list[str], seen:dict[str, float], gpus_per_node:int) -> list[str]:
    "Problems that keep the cluster incomplete, one string per host ([] when it is complete)."
    out = [f"{h} (no Ray node)" for h in expected if h not in seen]
    return out + [f"{h} ({seen[h]:g} of {gpus_per_node} GPUs)" for h in expected if h in seen and seen[h] < gpus_per_node]

# %%
fake = [{"Alive": True, "Resources": {"GPU": 4.0, "slurm_node_n1": 1.0}}, {"Alive": False, "Resources": {"slurm_node_n2": 1.0}}]
test_eq(missing_hosts(["n1", "n2"], ray_hosts(fake), 4), ["n2 (no Ray node)"])
test_eq(missing_hosts(["n1"], {"n1": 2.0}, 4), ["n1 (2 of 4 GPUs)"])

# %%
#| export
def _port_open(address:str, timeout:float=2.0) -> bool:
    import socket
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout): return True
    except OSError: return False

def wait_for_ray(address:str, hosts:list[str], gpus_per_node:int, timeout:float=600, every:float=1.0, log_dir:str="") -> str:
    "Poll the Ray cluster at `address` until every host has joined with its GPUs; '' on success, else the failure message."
    t0, say = time.time(), lambda m: print(f"[wait_ray {time.strftime('%H:%M:%S')}] {m}", flush=True)
    while not _port_open(address) and time.time() - t0 < timeout: time.sleep(every)
    if not _port_open(address): return f"nothing listens at {address} after {timeout:g} s: the head did not start (see its log)."
    import ray
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        last = 0.0
        while True:
            seen, total = ray_hosts(ray.nodes()), ray.cluster_resources()
            problems = missing_hosts(hosts, seen, gpus_per_node)
            if not problems:
                say(f"Ray cluster ready in {time.time() - t0:.1f} s: {len(seen)} node(s) ({', '.join(sorted(seen))}), "
                    f"{total.get('GPU', 0):g} GPU(s), {total.get('CPU', 0):g} CPU(s)")
                return ""
            if time.time() - t0 > timeout: break
            if time.time() - last >= 10: say(f"{len(seen)}/{len(hosts)} node(s) joined; waiting for {', '.join(problems)}"); last = time.time()
            time.sleep(every)
    finally: ray.shutdown()
    logs = f" Read {log_dir}/ray-<job>-<host>.log of those hosts." if log_dir else ""
    return (f"the Ray cluster is incomplete after {timeout:g} s: {', '.join(problems)}.{logs} Usual causes: a worker cannot "
            f"reach {address} (firewall, or the head's address is on the wrong interface: set NODE_IP_CMD), RAY_AUTH_MODE "
            f"differs between nodes, or a node's Ray ports are taken (change RAY_NODE_PORT_BASE).")

# %%
#| export
def wait_ray_cli(argv:list[str]|None=None) -> int:
    "`wait_ray_cli --address A --gpus-per-node G --timeout S HOST...`: 0 once every host joined, 1 with the missing hosts."
    p = argparse.ArgumentParser(prog="wait_ray", description=wait_ray_cli.__doc__)
    p.add_argument("hosts", nargs="+", help="SLURM hosts that must join (scontrol show hostnames)")
    p.add_argument("--address", required=True, help="head GCS address host:port")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs each host must bring")
    p.add_argument("--timeout", type=float, default=600, help="seconds before giving up")
    p.add_argument("--log-dir", default="", help="where the per-node Ray logs are (named in the failure)")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    msg = wait_for_ray(a.address, a.hosts, a.gpus_per_node, a.timeout, log_dir=a.log_dir)
    if msg: print(f"[wait_ray] FAILED: {msg}", flush=True); return 1
    return 0

# %%
print(wait_for_ray("127.0.0.1:9", ["n1"], 0, timeout=0.2))

# %% [markdown]
# ## The chain, run with a stub `sbatch`
#
# The CPU sibling of the real-SLURM test: source the functions block of the generated script, put a fake
# `sbatch` first on `PATH` that records its arguments, and drive `chain_next` through each case. The
# "stuck counter" case is the `SLURM_*` trap (the counter stays 0 in every job): the ledger stops it.

# %%
#| export
def functions_block(script:str) -> str:
    "The shell functions of a generated batch script (between its `>>> functions` and `<<< functions` lines)."
    m = re.search(r"^# >>> functions.*?\n(.*?)^# <<< functions", script, re.M | re.S)
    if not m: raise ValueError("no functions block in this script")
    return m.group(1)

def run_chain_case(script:str, rc:int, start:int, end:int, stop:int=1, index:int=0, ledger_jobs:int=1,
                   max_chains:int=3, total:int=100) -> tuple[str, str]:
    "Run `chain_next` of `script` (its functions block) once in a scratch directory; return (its log line, the stub sbatch's argv)."
    funcs = functions_block(script)
    with tempfile.TemporaryDirectory() as d:
        stub = Path(d) / "sbatch"
        stub.write_text('#!/bin/bash\necho "$@" > "$(dirname "$0")/argv"\necho 4242\n'); stub.chmod(0o755)
        (Path(d) / "ledger").write_text("".join(f"started {i}\n" for i in range(ledger_jobs)))
        driver = (funcs + f'\nSTOP_REQUESTED={stop} GRPO_CHAIN_INDEX={index} MAX_JOB_CHAINS={max_chains} TOTAL_STEPS={total}\n'
                  f'LEDGER={d}/ledger JOBS_IN_CHAIN=$(grep -c "^started " "$LEDGER") SCRIPT=/x/grpo.sbatch ARGS=(cfg.yaml --a.b=1)\n'
                  'SLURM_JOB_ID=41 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NAME=grpo TIME_LIMIT=01:00:00 SLURM_JOB_PARTITION=gpu\n'
                  f'chain_next {rc} {start} {end}\n')
        p = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, env={**os.environ, "PATH": f"{d}:{os.environ['PATH']}"})
        argv = (Path(d) / "argv").read_text().strip() if (Path(d) / "argv").exists() else ""
        return (p.stdout + p.stderr).strip().split("] ", 1)[-1], argv

# %%
CASES = {  # name: (kwargs, expect a submission)
    "walltime signal, progress": (dict(rc=0, start=4, end=9), True),
    "finished before the signal": (dict(rc=0, start=4, end=9, stop=0), False),
    "trainer crashed": (dict(rc=1, start=4, end=9), False),
    "failed before its first checkpoint": (dict(rc=0, start=-1, end=-1), False),
    "run complete": (dict(rc=0, start=90, end=100), False),
    "counter at the cap": (dict(rc=0, start=4, end=9, index=2, ledger_jobs=3), False),
    "counter stuck at 0 (SLURM_* trap), ledger full": (dict(rc=0, start=4, end=9, index=0, ledger_jobs=3), False),
}
results = {name: run_chain_case(script, **kw) for name, (kw, _) in CASES.items()}
Markdown(markdown_table(["case", "chain_next says"], [(n, r[0]) for n, r in results.items()]))

# %%
for name, (kw, submits) in CASES.items(): test_eq(bool(results[name][1]), submits)
print(results["walltime signal, progress"][1])
assert "--dependency=afterany:41 --nodes=2 --time=01:00:00" in results["walltime signal, progress"][1]
assert "GRPO_CHAIN_INDEX=1" in results["walltime signal, progress"][1] and results["walltime signal, progress"][1].endswith("/x/grpo.sbatch cfg.yaml --a.b=1")

# %% [markdown]
# ## The trainer contract
#
# The script names the trainer once (`TRAIN_CMD`, default `grpo_nb train`) and relies on this contract;
# CI runs a stand-in that honours it (`tests/slurm_standin_trainer.py`) until the real trainer exists.

# %%
#| export
TRAINER_CONTRACT:list[tuple[str, str]] = [
    ("command", "TRAIN_CMD CONFIG [--section.field=value ...] --cluster.ray_address=auto [--reward.code_service_url=URL] --resume auto"),
    ("Ray", "ray.init(address=\"auto\") joins the cluster at $RAY_ADDRESS (set by grpo.sbatch); every node carries a slurm_node_<host> resource"),
    ("checkpoints", "complete checkpoints under derive(cfg).checkpoint_dir; after each one, the file `latest` there is replaced atomically (write, then rename) by text ending in the step number (`12`, `step_12`, `global_step12`)"),
    ("--resume auto", "start from the newest complete checkpoint if there is one, else from scratch; a resumed run neither repeats nor skips a step"),
    ("SIGUSR1, SIGTERM", "finish or abandon the current step, write a checkpoint, exit 0 (SIGUSR1 comes signal_s before the walltime; at SIGTERM the other nodes' Ray is being killed too, so SIGUSR1 is the one to rely on)"),
    ("exit status", "0: finished or stopped on a signal after checkpointing; anything else: failed (the chain stops)"),
    ("files it must leave alone", "OUTPUT_DIR/slurm_chain.log (the chain's ledger)"),
]

# %%
Markdown(markdown_table(["what", "the trainer must"], TRAINER_CONTRACT))

# %% [markdown]
# ## `grpo_nb sbatch`: a script for your cluster
#
# `grpo_nb sbatch CONFIG [options] [--section.field=value ...]` writes a batch script whose shape follows
# the config (nodes, GPUs per node), with your site's partition, account, modules and venv, and with the
# config (absolute path) and overrides baked in as defaults, plus `ray_node_setup.sh` beside it. It also
# creates the log directory, which SLURM will not.

# %%
#| export
_SBATCH_OPTIONS = ["nodes", "gpus_per_node", "cpus_per_node", "time", "partition", "account", "qos", "signal_s",
                   "max_job_chains", "log_dir", "venv", "job_name", "mem", "train_cmd", "network", "nccl_debug"]

def _sbatch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo_nb sbatch", description="Write an sbatch script (and ray_node_setup.sh beside it) for CONFIG.",
                                epilog="Other --section.field=value arguments are config overrides, baked into the script.")
    p.add_argument("config", help="YAML config or preset name")
    p.add_argument("-o", "--output", default="grpo.sbatch", help="script path (ray_node_setup.sh goes next to it)")
    doc = {f.name: f for f in fields(SlurmSpec)}
    try:
        from fastcore.docments import docments
        helps = docments(SlurmSpec)
    except Exception: helps = {}  # a class defined in a notebook kernel has no source to read
    for name in _SBATCH_OPTIONS:
        kw = dict(type=int) if doc[name].type in ("int", int) else {}
        if name == "network": kw = dict(choices=["ethernet", "infiniband", "slingshot"])
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=(helps.get(name) or "").replace("%", "%%"), **kw)
    p.add_argument("--module", action="append", default=[], help="module to load (repeat)")
    p.add_argument("--setup", action="append", default=[], help="shell line run before the venv (repeat)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="variable to export (repeat)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION", help="extra #SBATCH option, e.g. --constraint=h100 (repeat)")
    p.add_argument("--no-exclusive", action="store_true", help="share nodes (leave --exclusive out)")
    return p

def sbatch_cli(argv:list[str]|None=None) -> int:
    "`grpo_nb sbatch CONFIG [options] [overrides]`: write an sbatch script for your cluster."
    a, overrides = _sbatch_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try: cfg = load_config(a.config, overrides)
    except ConfigError as e: print(f"grpo_nb sbatch: error: {e}", file=sys.stderr); return 2
    bad = [e for e in a.env if "=" not in e]
    if bad: print(f"grpo_nb sbatch: error: --env wants NAME=VALUE (got {bad[0]!r}).", file=sys.stderr); return 2
    config = str(Path(a.config).resolve()) if Path(a.config).exists() else a.config
    given = {k: v for k, v in vars(a).items() if k in _SBATCH_OPTIONS and v is not None}
    spec = spec_from_config(cfg, **given, config=config, overrides=overrides, modules=a.module, setup=a.setup,
                            env=dict(e.split("=", 1) for e in a.env), extra_sbatch=a.sbatch, exclusive=not a.no_exclusive)
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_sbatch(spec, out.name)); out.chmod(0o755)
    setup = out.parent / "ray_node_setup.sh"
    setup.write_text(render_node_setup(spec)); setup.chmod(0o755)
    Path(spec.log_dir).mkdir(parents=True, exist_ok=True)
    print(f"wrote {out} and {setup} ({spec.nodes} node(s) x {spec.gpus_per_node} GPU(s), --time={spec.time}, "
          f"chain of at most {spec.max_job_chains} jobs)\ncheck:  grpo_nb preflight {a.config} {' '.join(overrides)}\nsubmit: sbatch {out}")
    return 0

# %%
with tempfile.TemporaryDirectory() as d:
    y = Path(d) / "run.yaml"; y.write_text("cluster: {nodes: 2, gpus_per_node: 4, learners_per_node: [2, 2]}\n")
    test_eq(sbatch_cli([str(y), "-o", f"{d}/out/run.sbatch", "--partition", "gpu", "--module", "cuda/12.6",
                        "--time", "12:00:00", "--log-dir", f"{d}/logs", "--learner.learning_rate=2e-6"]), 0)
    text = (Path(d) / "out/run.sbatch").read_text()
    assert "#SBATCH --partition=gpu" in text and "module load cuda/12.6" in text and "#SBATCH --gpus-per-node=4" in text
    assert f"CONFIG=${{1:-{y}}}" in text and "OVERRIDES=(--learner.learning_rate=2e-6 " in text
    test_eq(bash_syntax_errors(text), ""); assert (Path(d) / "out/ray_node_setup.sh").exists()

# %% [markdown]
# ## `grpo_nb preflight`: what the seeds' checklist did by hand
#
# Each check is a small function returning `(status, detail)` with status `PASS`, `WARN`, `FAIL` or
# `SKIP`. Checks that need another notebook's module (the memory planner, the placement) import it when
# they run and say so when it is not there. The command prints a table and exits 1 if anything failed.

# %%
#| export
Check = tuple[str, str]  # (PASS | WARN | FAIL | SKIP, detail)

def check_model(name_or_path:str, hf_home:str|None=None) -> Check:
    "The policy's weights: a local directory with config.json and weights, a built-in model, or a cached hub id."
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file(): return "FAIL", f"{p} has no config.json: point model.name_or_path at the HF model directory"
        weights = [w for pat in ("*.safetensors", "*.bin", "*.pt") for w in p.glob(pat)]
        if not weights: return "FAIL", f"{p} has no weight files (*.safetensors, *.bin)"
        unreadable = [w.name for w in weights if not os.access(w, os.R_OK)]
        if unreadable: return "FAIL", f"cannot read {unreadable[:3]} in {p}: fix the permissions"
        return "PASS", f"{p}: config.json and {len(weights)} weight file(s), {sum(w.stat().st_size for w in weights) / 2**30:.2f} GiB"
    try:
        import grpo_nb.tiny as tiny
        if name_or_path in getattr(tiny, "TINY_MODELS", {}): return "PASS", f"built-in model {name_or_path!r} (grpo_nb.tiny)"
    except ImportError: pass
    if name_or_path == TrainConfig().model.name_or_path: return "PASS", f"built-in model {name_or_path!r}"
    if "/" in name_or_path and not name_or_path.startswith(("/", ".")):
        hub = Path(hf_home or os.environ.get("HF_HOME", Path.home() / ".cache/huggingface")) / "hub" / ("models--" + name_or_path.replace("/", "--"))
        if (hub / "snapshots").is_dir(): return "PASS", f"hub id {name_or_path} cached in {hub}"
        return "FAIL", (f"{name_or_path} is neither a directory nor in the cache {hub.parent}; compute nodes are usually offline: "
                        f"`huggingface-cli download {name_or_path}` on a login node, or point model.name_or_path at a directory")
    return "FAIL", f"no model at {p}: set model.name_or_path to a HF model directory"

# %%
with tempfile.TemporaryDirectory() as d:
    test_eq(check_model(d)[0], "FAIL")
    (Path(d) / "config.json").write_text("{}"); (Path(d) / "model.safetensors").write_bytes(b"0" * 1024)
    print(check_model(d))
    test_eq(check_model(d)[0], "PASS")
    test_eq(check_model("org/not-downloaded", hf_home=d)[0], "FAIL")

# %% [markdown]
# Output and checkpoint directories must exist (or be creatable) and writable from here, which on a
# cluster is normally the same shared file system the nodes see; so must the log directory of `--output`.

# %%
#| export
def check_writable(path:str, what:str) -> Check:
    "Whether `path` exists or can be created, and a file can be written in it."
    p = Path(path).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".grpo_preflight_{os.getpid()}"
        probe.write_text("ok"); probe.unlink()
        free = shutil.disk_usage(p).free / 2**30
        return ("PASS" if free > 1 else "WARN"), f"{what} {p} writable, {free:.0f} GiB free"
    except OSError as e: return "FAIL", f"{what} {p}: {e.strerror or e}; choose a directory you can write"

# %%
test_eq(check_writable(tempfile.gettempdir(), "tmp")[0], "PASS")
test_eq(check_writable("/proc/no/such", "x")[0], "FAIL")

# %% [markdown]
# `sinfo` says whether the partition has enough nodes with enough GPUs, and how many are free now
# (fewer free than needed is a warning: the job queues). `parse_sinfo` reads `sinfo -h -N -o '%N %G %t'`.

# %%
#| export
def parse_sinfo(text:str) -> dict[str, tuple[int, str]]:
    "`sinfo -h -N -o '%N %G %t'` lines -> {node: (GPUs, state)}."
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3: continue
        node, gres, state = parts[0], parts[1], parts[2]
        gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[\w.-]+)?:(\d+)", gres))
        out[node] = (gpus, state.rstrip("*~#!%$@^-"))
    return out

def check_nodes(nodes:int, gpus_per_node:int, partition:str="", sinfo:str|None=None) -> Check:
    "Whether the partition has `nodes` nodes with `gpus_per_node` GPUs, and how many are idle now."
    if sinfo is None:
        if not shutil.which("sinfo"): return "SKIP", "no sinfo here: run preflight on the cluster's login node"
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %G %t", *(["-p", partition] if partition else [])], capture_output=True, text=True, timeout=30)
        if r.returncode: return "WARN", f"sinfo failed, nodes not checked: {' '.join(r.stderr.split())[:160]}"
        sinfo = r.stdout
    info = parse_sinfo(sinfo)
    fit = {n: s for n, (g, s) in info.items() if g >= gpus_per_node and not s.startswith(("down", "drain", "fail", "inval"))}
    idle = [n for n, s in fit.items() if s == "idle"]
    where = f"partition {partition!r}" if partition else "the default partition"
    if len(fit) < nodes:
        return "FAIL", f"{where} has {len(fit)} usable node(s) with >= {gpus_per_node} GPUs, the job needs {nodes}: use another partition or fewer nodes"
    if len(idle) < nodes: return "WARN", f"{len(fit)} usable nodes, {len(idle)} idle now: the job will queue"
    return "PASS", f"{len(fit)} usable node(s) with >= {gpus_per_node} GPUs, {len(idle)} idle"

# %%
sample = "n1 gpu:h100:4(S:0-1) idle\nn2 gpu:4 mixed\nn3 gpu:4 drain*\nn4 (null) idle\n"
test_eq(parse_sinfo(sample)["n1"], (4, "idle"))
test_eq(check_nodes(2, 4, sinfo=sample)[0], "WARN")
test_eq(check_nodes(3, 4, sinfo=sample)[0], "FAIL")

# %% [markdown]
# The memory plan and the layout come from their own notebooks (`grpo_nb plan`, `grpo_nb layout`).
# Preflight calls their commands with the config's values and reads their JSON; if a module is not there
# (yet), the row says so instead of failing.

# %%
#| export
def _run_cli(module:str, func:str, argv:list[str]) -> tuple[int|None, str, str]:
    "Call `module.func(argv)` capturing its output; (None, '', why) when the module or function is absent."
    import contextlib, importlib, io
    try: fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e: return None, "", f"{module}.{func} is not available ({e.__class__.__name__})"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = fn(argv)
        except SystemExit as e: rc = e.code if isinstance(e.code, int) else 2
    return int(rc or 0), out.getvalue(), err.getvalue()

def check_memory(cfg:TrainConfig) -> Check:
    "Whether the memory plan of `cfg` fits the GPUs (`grpo_nb plan --json`)."
    if cfg.cluster.device == "cpu": return "SKIP", "cluster.device is cpu"
    if check_model(cfg.model.name_or_path)[1].startswith("built-in"): return "SKIP", "a tiny built-in model fits anywhere"
    L, R, d = cfg.learner, cfg.rollout, derive(cfg)
    seq = L.pack_length or cfg.data.max_prompt_tokens + R.max_new_tokens
    argv = ["--model", cfg.model.name_or_path, "--learner-gpus", str(d.learner_world_size), "--zero", str(L.zero_stage),
            "--offload", L.offload, "--micro-batch", str(L.micro_batch_size), "--seq-len", str(seq),
            "--grad-ckpt" if cfg.model.gradient_checkpointing else "--no-grad-ckpt", "--engine-tp", str(R.tensor_parallel_size),
            "--gpu-memory-utilization", str(R.gpu_memory_utilization), "--gpu-mem-gib", str(cfg.cluster.gpu_mem_gib), "--json"]
    rc, out, err = _run_cli("grpo_nb.memory", "plan_cli", argv)
    if rc is None: return "SKIP", f"{err}; check memory by hand (grpo_nb plan)"
    try: plan = json.loads(out)
    except ValueError: return "WARN", f"grpo_nb plan gave no JSON (exit {rc}): {(err or out).strip()[:200]}"
    peak = plan.get("learner", {}).get("peak_bytes")
    detail = f"learner peak {peak / 2**30:.1f} GiB of {cfg.cluster.gpu_mem_gib:g} GiB" if peak else "plan computed"
    if plan.get("fits"): return "PASS", detail
    advice = plan.get("advice") or "see grpo_nb plan"
    return "FAIL", f"{detail}; fixes: {'; '.join(advice) if isinstance(advice, list) else advice}"

def check_layout(cfg:TrainConfig) -> Check:
    "Whether learners and engines of `cfg` fit the nodes (`grpo_nb layout --json`)."
    if cfg.cluster.device == "cpu": return "SKIP", "cluster.device is cpu"
    C, R = cfg.cluster, cfg.rollout
    argv = ["--nodes", str(C.nodes), "--gpus-per-node", str(C.gpus_per_node), "--learners-per-node",
            *map(str, C.learners_per_node), "--engines", str(R.num_engines), "--tp", str(R.tensor_parallel_size), "--json"]
    rc, out, err = _run_cli("grpo_nb.placement", "layout_cli", argv)
    if rc is None: return "SKIP", f"{err}; check the layout by hand (grpo_nb layout)"
    if rc: return "FAIL", (err or out).strip()[:300]
    try: lay = json.loads(out)
    except ValueError: return "PASS", "layout feasible"
    return "PASS", f"learner world {lay.get('learner_world_size')}, sync world {lay.get('sync_world_size')}, idle GPUs {lay.get('idle_gpus')}"

# %%
check_memory(load_config("demo")), check_layout(load_config(None))

# %%
#| export
def preflight(cfg:TrainConfig, nodes:int|None=None, partition:str="", log_dir:str="logs", sinfo:str|None=None) -> list[tuple[str, str, str]]:
    "Every check of `cfg` before submission: rows (check, status, detail)."
    C, d = cfg.cluster, derive(cfg)
    gpus = C.gpus_per_node if C.device != "cpu" else 0
    rows = [("model", *check_model(cfg.model.name_or_path)), ("memory plan", *check_memory(cfg)), ("layout", *check_layout(cfg)),
            ("nodes (sinfo)", *check_nodes(nodes or C.nodes, gpus, partition, sinfo))]
    for what, path in [("output dir", cfg.logging.output_dir), ("checkpoint dir", d.checkpoint_dir), ("log dir", log_dir)]:
        rows.append((what, *check_writable(path, what)))
    return rows

def preflight_cli(argv:list[str]|None=None) -> int:
    "`grpo_nb preflight CONFIG [--nodes N] [--partition P] [--log-dir D] [overrides]`: check before you submit; exit 1 on a failure."
    p = argparse.ArgumentParser(prog="grpo_nb preflight", description=preflight_cli.__doc__)
    p.add_argument("config", help="YAML config or preset name")
    p.add_argument("--nodes", type=int, default=None, help="nodes you will ask for (default: cluster.nodes)")
    p.add_argument("--partition", default="", help="partition you will submit to")
    p.add_argument("--log-dir", default="logs", help="directory of the job's --output")
    a, overrides = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    try: cfg = load_config(a.config, overrides)
    except ConfigError as e:
        print(f"{'config':<16}FAIL  {e}"); return 2
    rows = [("config", "PASS", f"{a.config} is valid")] + preflight(cfg, a.nodes, a.partition, a.log_dir)
    for check, status, detail in rows: print(f"{check:<16}{status:<6}{detail}")
    failed = [r[0] for r in rows if r[1] == "FAIL"]
    print(f"\npreflight: {'FAILED: ' + ', '.join(failed) if failed else 'ok'}")
    return 1 if failed else 0

# %%
with tempfile.TemporaryDirectory() as d:
    rc = preflight_cli(["demo", f"--logging.output_dir={d}/run", f"--log-dir={d}/logs"])

# %%
with tempfile.TemporaryDirectory() as d:
    test_eq(preflight_cli(["demo", "--model.name_or_path=/no/such/model", f"--logging.output_dir={d}/run", f"--log-dir={d}/logs"]), 1)

# %% [markdown]
# ## On a real SLURM
#
# `tests/test_slurm_cluster.py` starts a real SLURM (Debian's `slurmctld`, two `slurmd` emulating nodes
# with four fake GPUs each, `munge`; `tests/slurm_harness.py`) inside a network namespace it creates,
# submits `sbatch/grpo.sbatch` unchanged with a tiny CPU config and the stand-in trainer, and checks:
#
# - a job whose allocation does not fit the config fails at once, before Ray, and chains nothing;
# - the script finds itself through `scontrol` (not `$0`), and the Ray cluster forms across both nodes,
#   with a task run on each;
# - with `--time=1` and `--signal=B:USR1@10`, the real walltime signal reaches the trainer in every job,
#   three chained jobs run and the third stops at `MAX_JOB_CHAINS` (counter and ledger agree);
# - the steps the jobs log are 1, 2, 3, ... with none repeated or skipped, each job resuming where the
#   last checkpoint left off; workers exit 0 after the head leaves;
# - a job whose second node cannot start Ray (its port is taken) fails at once naming that node, and
#   chains nothing;
# - teardown by PID leaves no process behind.
#
# The cell below runs it when `nbdev_test --flags slurm` asks (root; about two minutes with the install).

# %%
#| slurm
print(subprocess.run([sys.executable, "-m", "pytest", "-q", "../tests/test_slurm_cluster.py"], capture_output=True, text=True).stdout[-2000:])
