#!/usr/bin/env bash
# `make test` after the sync check: notebooks, the site and its browser test, then pytest on two workers.
# The real-SLURM tests (tests/test_slurm_cluster.py, `make pytest-slurm`) spend most of their minutes waiting for the
# scheduler's 30-second time-limit checks, so they run in the background from the start, beside the notebooks, the
# site and the other tests, instead of holding one of pytest's two workers idle. Their fixture installs Debian's SLURM
# and munge first when they are missing (as root, as in CI; without root they are skipped). Their output follows the
# other tests' and both results count.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
make --no-print-directory bytecode   # once, before the SLURM tests and the notebooks start side by side (each make target checks it again)
slurm_log=$(mktemp)
make --no-print-directory pytest-slurm > "$slurm_log" 2>&1 & slurm_pid=$!
trap '{ pkill -TERM -P "$slurm_pid"; kill "$slurm_pid"; } 2>/dev/null || true' EXIT   # a failure before the end leaves no pytest running (and the trap never fails the script)
make --no-print-directory nbtest
make --no-print-directory docs-test
echo "ci_test: notebooks and site done after $((SECONDS - t0)) s"
rc=0
# tests/test_site.py's four Chromium and KaTeX tests ran in docs-test (tools/browser_test.sh) just now: not a second time
site_done=(--deselect=tests/test_site.py::test_check_site_reports_every_failure_kind --deselect=tests/test_site.py::test_render_tiny_project
           --deselect=tests/test_site.py::test_render_reports_broken_notebook_links --deselect=tests/test_site.py::test_render_reports_a_stale_processed_copy)
make --no-print-directory pytest PYTEST_ARGS="--ignore=tests/test_slurm_cluster.py ${site_done[*]} ${PYTEST_ARGS:-}" || rc=$?
echo "ci_test: the other tests done after $((SECONDS - t0)) s"
src=0; wait "$slurm_pid" || src=$?
echo "ci_test: the SLURM tests, run beside the rest:"; cat "$slurm_log"
[ "$src" = 0 ] || rc=$src
echo "ci_test: done in $((SECONDS - t0)) s"
exit $rc
