#!/usr/bin/env bash
# Headless-Chromium test of the built site (`make docs-test`, after `make docs`): serves _site/ on 127.0.0.1 and
# opens every page; fails on a broken internal link or #anchor, a request to any other host, a page or console
# error, unrendered math, a missing plot or a code block wider than the page, and first on what the notebooks show
# readers: build-machine output, making-of wording, tables printed as text, unlabelled axes, cut text
# (tools/site/check_site.py --notebooks). Then tests/test_site.py proves the check
# catches each of those on a deliberately broken site (it needs Chromium, which is certainly here now).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
command -v "$PY" >/dev/null || PY=.venv/bin/python
t0=$SECONDS

if [ ! -x /usr/bin/chromium ]; then
  echo "browser_test: installing Debian's chromium (once per machine, about a minute)"
  log=$(mktemp)
  if ! (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) >"$log" 2>&1; then
    cat "$log" >&2
    echo "browser_test: could not install chromium. Fix: as root, apt-get install -y --no-install-recommends chromium" >&2
    exit 1
  fi
  rm -f "$log"
fi
[ -f _site/index.html ] || { echo "browser_test: no _site/index.html. Fix: run 'make docs' first." >&2; exit 1; }

port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server --bind 127.0.0.1 --directory _site "$port" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

"$PY" tools/site/check_site.py _site --notebooks nbs --base-url "http://127.0.0.1:$port/"
# the tests that need Chromium or KaTeX (`make pytest` may run before either exists here; it runs the rest)
"$PY" -m pytest -q -p no:cacheprovider tests/test_site.py -k "every_failure_kind or render_"
echo "browser_test: done in $((SECONDS - t0)) s"
