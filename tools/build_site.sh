#!/usr/bin/env bash
# The documentation site, offline (`make docs`):
#   1. nbdev_proc_nbs: nbdev's own processing of nbs/ into _proc/ (front matter, show_doc for exported names,
#      doc links), exactly what `nbdev_docs` hands to Quarto;
#   2. tools/site/render.py: reads nbs/_quarto.yml, nbdev.yml, sidebar.yml and _proc/, writes _site/ (KaTeX
#      rendered at build time, nothing loaded from the internet) and README.md from nbs/index.ipynb.
# Quarto cannot be installed on these machines; with Quarto, `nbdev_docs` still builds the site from nbs/_quarto.yml.
set -euo pipefail
cd "$(dirname "$0")/.."
KATEX_VERSION=0.16.22              # vendored into .site_deps/ (git-ignored) from the npm registry
PY=${PYTHON:-python}
command -v "$PY" >/dev/null || PY=.venv/bin/python
t0=$SECONDS

have=$(node -p "require('./.site_deps/node_modules/katex/package.json').version" 2>/dev/null || true)
if [ "$have" != "$KATEX_VERSION" ]; then
  command -v npm >/dev/null || { echo "build_site: npm is needed once to vendor KaTeX $KATEX_VERSION into .site_deps/. Fix: apt-get install -y npm" >&2; exit 1; }
  echo "build_site: vendoring KaTeX $KATEX_VERSION into .site_deps/"
  npm install --prefix .site_deps --no-save --no-audit --no-fund --no-package-lock --loglevel=error "katex@$KATEX_VERSION" >/dev/null
fi

# nbdev_proc_nbs minus its Quarto installer (which would sudo-download Quarto, then `pip install -e .[dev]`).
"$PY" tools/site/proc_nbs.py
t1=$SECONDS
"$PY" tools/site/render.py "$@"
echo "build_site: done in $((SECONDS - t0)) s (nbdev_proc_nbs $((t1 - t0)) s, render $((SECONDS - t1)) s); open _site/index.html"
