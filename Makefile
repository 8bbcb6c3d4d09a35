# grpo-nb: two commands on a fresh machine.
#   make demo   installs the CPU profile into .venv and runs the main job on its embedded default
#   make test   installs, then checks notebooks <-> library sync, runs the notebooks, pytest and the site build
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
# Environment every run here needs (see nbs/guides): Ray without auth tokens on loopback,
# vLLM's CPU engine on loopback with a small KV cache, DeepSpeed without prebuilt ops.
export RAY_AUTH_MODE := disabled
export VLLM_HOST_IP := 127.0.0.1
export VLLM_CPU_KVCACHE_SPACE := 1
export DS_BUILD_OPS := 0
export TOKENIZERS_PARALLELISM := false
export PYTHONUNBUFFERED := 1
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export WANDB_MODE := offline
# Bytecode is written where it is first needed: the venv is installed without compiling its 30,000 modules (most never
# imported; bench/results/logs/ci/venv_bytecode.log times both on two cores), and the first process to import a module leaves its .pyc for
# every later one (Ray actors, CLI calls, notebook kernels). With PYTHONDONTWRITEBYTECODE set, as on some CI machines,
# every process compiled Ray, vLLM and torch from source again (`import ray` 4 s instead of 0.7 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test venv bytecode export sync-check nbtest pytest pytest-slurm docs docs-test lock clean-site

# The test runs: one OpenMP thread per process. The tiny models gain nothing from a second intra-op thread, and on CI's two
# cores every process's second thread only spins against the other pytest worker's processes (Ray actors already get one
# thread each: Ray sets OMP_NUM_THREADS to their num_cpus). tests/test_self_correction.py took 82 CPU-seconds with it
# and 104 without.
nbtest pytest pytest-slurm: export OMP_NUM_THREADS := 1

venv:
	@bash tools/setup_venv.sh

# grpo_nb compiled once here (after `sync-check`, whose nbdev_export may rewrite the files), before the SLURM tests and
# the notebooks start side by side: they read its bytecode instead of each compiling it at the same moment.
bytecode: venv
	@PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q grpo_nb

demo: venv
	$(BIN)/grpo_nb demo

export: venv
	$(BIN)/nbdev_export && $(BIN)/nbdev_clean && $(BIN)/python tools/render_scripts.py

sync-check: venv
	tools/check_unchanged.sh $(BIN)/nbdev_export
	tools/check_unchanged.sh $(BIN)/nbdev_clean
	tools/check_unchanged.sh $(BIN)/python tools/render_scripts.py
	PATH=$(abspath $(BIN)):$$PATH tools/check_unchanged.sh $(BIN)/python tools/site/render.py --readme-only
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python tools/check_outputs.py nbs/index.ipynb nbs/13_cli.ipynb nbs/guides/config_reference.ipynb
	$(BIN)/python tools/check_cells.py nbs

nbtest: bytecode
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/nbdev_test --n_workers 2 --timing

pytest: bytecode
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -q --durations=40 -n 2 --dist loadfile --no-loadscope-reorder tests $(PYTEST_ARGS)

pytest-slurm: bytecode
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -q --durations=10 -p no:cacheprovider tests/test_slurm_cluster.py $(PYTEST_ARGS)

docs: bytecode
	PATH=$(abspath $(BIN)):$$PATH bash tools/build_site.sh

docs-test: docs
	PATH=$(abspath $(BIN)):$$PATH bash tools/browser_test.sh

test: venv sync-check
	PATH=$(abspath $(BIN)):$$PATH bash tools/ci_test.sh

lock:
	$(BIN)/uv pip compile --python-version 3.11 --find-links /opt/wheels requirements/cpu.in -o requirements/cpu.lock --no-header --quiet
