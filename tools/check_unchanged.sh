#!/usr/bin/env bash
# Runs a command and fails if it changed any file git can see (tracked or untracked-not-ignored).
# Used by `make test` around nbdev_export / nbdev_clean: notebooks and library must already agree.
set -uo pipefail
snap() { git status --porcelain --untracked-files=all; git diff; git ls-files -o --exclude-standard -z | xargs -0 -r sha1sum; }
before=$(snap | sha1sum)
"$@" || { echo "check_unchanged: '$*' failed" >&2; exit 1; }
after=$(snap | sha1sum)
if [ "$before" != "$after" ]; then
  echo "check_unchanged: '$*' changed files. Notebooks and library/scripts are out of sync or notebooks are not clean." >&2
  echo "Fix: run 'make export' and commit the result. Changed:" >&2
  git status --porcelain --untracked-files=all >&2
  exit 1
fi
