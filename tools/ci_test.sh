#!/usr/bin/env bash
# `make test` after the sync check: notebooks, the site and its browser test, then pytest on two workers.
# The real-SLURM tests need Debian's SLURM and munge; when they are missing (and we are root, as in CI) they are
# installed in the background while the notebooks run, so the download overlaps work instead of adding to it.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
prep_pid="" prep_log=$(mktemp)
if [ "$(id -u)" = 0 ] && ! command -v slurmctld >/dev/null 2>&1; then
  .venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); import slurm_harness as h; print(f'SLURM installed in {h.ensure_installed():.0f} s')" \
    > "$prep_log" 2>&1 & prep_pid=$!
fi
make --no-print-directory nbtest
make --no-print-directory docs-test
if [ -n "$prep_pid" ]; then
  wait "$prep_pid" && cat "$prep_log" || { echo "ci_test: installing SLURM failed (the SLURM tests will say why):"; cat "$prep_log"; }
fi
echo "ci_test: notebooks and site done after $((SECONDS - t0)) s"
make --no-print-directory pytest
echo "ci_test: done in $((SECONDS - t0)) s"
