#!/usr/bin/env bash
# Developer helper: execute notebooks in place (so the site shows their outputs), then clean them.
#   tools/nbrun.sh nbs/00_config.ipynb [more.ipynb ...]
# Cells flagged with a tst_flag (gpu, slurm, slow) are not executed here either: nbdev_test decides that in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 DS_BUILD_OPS=0 TOKENIZERS_PARALLELISM=false \
       PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 WANDB_MODE=offline TQDM_DISABLE=1 PATH="$PWD/.venv/bin:$PATH"
for nb in "$@"; do
  .venv/bin/python tools/exec_nb.py "$nb"
  .venv/bin/nbdev_clean --fname "$nb"
done
