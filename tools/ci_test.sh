#!/usr/bin/env bash
# `make test` after the sync check: the notebooks beside the site and its browser test, then pytest on two workers.
# The real-SLURM tests (tests/test_slurm_cluster.py, tests/test_plugins_slurm.py) spend most of their minutes waiting
# for the scheduler's clock (its time-limit checks come every 30 s), so as root they run in the background from the
# start, beside the notebooks and the rest of pytest, and their output is printed at the end; Debian's SLURM and munge
# are installed first when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT   # a failure on the way leaves no background run behind
slurm_pid="" slurm_log=$(mktemp) rest=()
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null 2>&1; then
  ( if ! command -v slurmctld >/dev/null 2>&1; then
      .venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); import slurm_harness as h; print(f'SLURM installed in {h.ensure_installed():.0f} s')" \
        || echo "ci_test: installing SLURM failed (the SLURM tests say why)"
    fi
    .venv/bin/python -m pytest -q -p no:cacheprovider --durations=10 tests/test_slurm_cluster.py tests/test_plugins_slurm.py ) > "$slurm_log" 2>&1 & slurm_pid=$!
  rest=("PYTEST_ARGS=--ignore=tests/test_slurm_cluster.py --ignore=tests/test_plugins_slurm.py")
fi
# the site's build and browser test beside the notebooks' run (nbdev_test leaves two cores half idle behind its two
# longest notebooks); the site's output is printed after the notebooks'
docs_log=$(mktemp)
make --no-print-directory docs-test > "$docs_log" 2>&1 & docs_pid=$!
nb_rc=0; make --no-print-directory nbtest || nb_rc=$?
docs_rc=0; wait "$docs_pid" || docs_rc=$?
cat "$docs_log"
[ "$nb_rc" = 0 ] || { echo "ci_test: the notebooks failed (exit code $nb_rc)"; exit "$nb_rc"; }
[ "$docs_rc" = 0 ] || { echo "ci_test: the site's build or browser test failed (exit code $docs_rc)"; exit "$docs_rc"; }
echo "ci_test: notebooks and site done after $((SECONDS - t0)) s"
rc=0 main_log=$(mktemp)
make --no-print-directory pytest "${rest[@]}" 2>&1 | tee "$main_log" || rc=$?
if [ -n "$slurm_pid" ]; then
  slurm_rc=0; wait "$slurm_pid" || slurm_rc=$?
  echo "ci_test: the SLURM tests, run beside the rest from the start:"; cat "$slurm_log"
  echo "ci_test: SLURM tests: $(grep -E '(passed|failed|error)' "$slurm_log" | tail -1) (exit code $slurm_rc)"
  echo "ci_test: the other tests: $(grep -E '(passed|failed|error)' "$main_log" | tail -1) (exit code $rc)"
  [ "$slurm_rc" = 0 ] || rc=$slurm_rc
fi
echo "ci_test: done in $((SECONDS - t0)) s"
exit "$rc"
