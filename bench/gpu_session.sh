#!/bin/bash
# bench/gpu_session.sh: the GPU benchmarks of grpo-nb, in lanes that run in parallel on a lent 2× H200 machine.
#
#   bash bench/gpu_session.sh OUT_DIR LANE [LANE ...]
#
# Each lane runs its benchmarks one after another on its own GPUs (CUDA_VISIBLE_DEVICES), each under `timeout`,
# writing JSON results and a log per benchmark under /tmp/gpuwork (kept across calls on one held machine). At the end
# OUT_DIR gets the merged JSON files and one archive of everything; copy the JSON into bench/results/ and commit it.
# Ray, DeepSpeed, TRL and Liger come from the wheels in .whl/ (make_wheels.sh --with-trl), real vLLM 0.26 from the
# staged archive in /tmp/stage (make_vllm_stages.sh), both installed into /tmp/site on the first call.
set -u
DEST=${1:?usage: gpu_session.sh OUT_DIR LANE [LANE ...]}; shift
OUT=/tmp/gpuwork
LANES=${*:?name the lanes}
mkdir -p "$OUT/logs"
T0=$SECONDS
if [ ! -f /tmp/site/.installed ]; then
  mkdir -p /tmp/site
  if ls /tmp/stage/vllm.tar.xz.part* >/dev/null 2>&1; then
    cat /tmp/stage/vllm.tar.xz.part* | xz -d -T0 | tar -x -C /tmp/site || { echo "vLLM unpack failed"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/stage/*.whl > "$OUT/logs/pip_vllm.log" 2>&1 \
      || { echo "vLLM deps install failed"; tail "$OUT/logs/pip_vllm.log"; exit 1; }
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/logs/pip.log" 2>&1 || { echo "wheel install failed"; tail "$OUT/logs/pip.log"; exit 1; }
  touch /tmp/site/.installed
fi
for w in .whl/fastcore-*.whl; do   # wheels added after the first install (pure python)
  [ -f "$w" ] && [ ! -f "/tmp/site/.$(basename "$w")" ] && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$w" >> "$OUT/logs/pip.log" 2>&1 && touch "/tmp/site/.$(basename "$w")"
done
echo "install: $((SECONDS - T0)) s" | tee -a "$OUT/logs/session.log"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled TORCH_CUDA_ARCH_LIST=9.0 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/logs/gpus.csv" 2>&1

run() {  # run NAME SECONDS GPUS CMD...: one benchmark on the given GPUs, its log in OUT/logs/NAME.log
  local name=$1 secs=$2 gpus=$3; shift 3
  local t0=$SECONDS
  echo "[$(date +%T)] start $name on GPUs $gpus (limit ${secs}s)" | tee -a "$OUT/logs/session.log"
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "$secs" "$@" > "$OUT/logs/$name.log" 2>&1
  echo "[$(date +%T)] end $name rc=$? after $((SECONDS - t0))s" | tee -a "$OUT/logs/session.log"
}
e2e() {  # e2e RUN SECONDS GPUS: one run of bench/e2e_vs_trl.py into OUT/e2e/
  run "e2e_${1//:/_}" "$2" "$3" python3 bench/e2e_vs_trl.py --runs "$1" --out-dir "$OUT/e2e" --timeout $(( $2 - 45 ))
}

# 1 GPU each, no Ray on GPU 1 (two local Ray clusters on one host are avoided)
lane_coloc0() {
  e2e ours:colocated:sync:bench 150 0
  e2e trl:vllm-colocate:bench 130 0
  e2e ours:colocated:sync:long 160 0
  e2e trl:vllm-colocate:long 150 0
}
lane_coloc0b() {   # the colocated runs again (call 4)
  e2e ours:colocated:sync:bench 150 0
  e2e ours:colocated:sync:long 170 0
  e2e trl:vllm-colocate:long 230 0
}
lane_coloc_final0() {
  e2e ours:colocated:sync:bench 250 0
  e2e ours:colocated:sync:long 280 0
}
lane_rt_hf1() {
  run rollout_throughput_hf 300 1 python3 bench/rollout_throughput.py --engines hf-static,hf-dynamic --budget-s 70 --out "$OUT/rollout_throughput_hf.json"
}
lane_c5a() { e2e ours:colocated:sync:bench 270 0; }
lane_c5b() { e2e ours:colocated:sync:long 270 1; }
lane_split_ob() { e2e ours:split:one-step-off:bench 230 0,1; }
lane_c6() { e2e trl:vllm-server:bench 230 0,1; }
lane_rollout1() {
  run rollout_throughput 330 1 python3 bench/rollout_throughput.py --budget-s 40 --out "$OUT/rollout_throughput.json"
}
lane_single1() {
  e2e trl:transformers:bench 150 1
  run rollout_throughput 330 1 python3 bench/rollout_throughput.py --budget-s 40 --out "$OUT/rollout_throughput.json"
}
# both GPUs
lane_split01() {
  e2e ours:split:sync:bench 140 0,1
  e2e ours:split:one-step-off:bench 140 0,1
  e2e trl:vllm-server:bench 160 0,1
  e2e ours:split:one-step-off:long 150 0,1
  e2e trl:vllm-server:long 170 0,1
}

for l in $LANES; do "lane_$l" & done
wait
[ -d "$OUT/e2e" ] && python3 bench/e2e_vs_trl.py --merge "$OUT/e2e" --out "$OUT/e2e_vs_trl.json" >> "$OUT/logs/session.log" 2>&1
ls -la "$OUT" "$OUT/e2e" >> "$OUT/logs/session.log" 2>&1
echo "session: $((SECONDS - T0)) s" | tee -a "$OUT/logs/session.log"
mkdir -p "$DEST"; tar -czf "$DEST/gpuwork.tgz" -C "$OUT" . ; cp "$OUT"/*.json "$DEST"/ 2>/dev/null
for f in "$OUT"/e2e/run_*.json; do [ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['run'], r.get('stats'), (r.get('error') or '')[-600:])" "$f"; done
