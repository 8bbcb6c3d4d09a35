#!/usr/bin/env bash
# Placeholder until the offline site renderer lands: process notebooks so the docs step runs.
set -euo pipefail
cd "$(dirname "$0")/.."
nbdev_proc_nbs >/dev/null
