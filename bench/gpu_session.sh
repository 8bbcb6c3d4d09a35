#!/bin/bash
# bench/gpu_session.sh: every GPU benchmark of grpo-nb in one call of a lent 4× H200 machine (lanes run in parallel).
#
#   bash bench/gpu_session.sh OUT_DIR [LANE ...]      # lanes: gpu0 gpu1 pair23 (default: all three)
#
# Each lane runs its benchmarks one after another on its own GPUs (CUDA_VISIBLE_DEVICES), each under `timeout`, and
# writes JSON results and a log per benchmark into OUT_DIR; copy the JSON into bench/results/ and commit it.
# Ray and DeepSpeed come from the wheels in .whl/ (../shared/gpu/make_wheels.sh --with-trl), installed into /tmp/site.
set -u
OUT=${1:?usage: gpu_session.sh OUT_DIR [LANE ...]}; shift
LANES=${*:?name the lanes}
mkdir -p "$OUT/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/logs/pip.log" 2>&1 || { echo "wheel install failed"; tail "$OUT/logs/pip.log"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled TORCH_CUDA_ARCH_LIST=9.0 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/logs/gpus.csv" 2>&1

run() {  # run NAME SECONDS GPUS CMD...: one benchmark on the given GPUs, its log in OUT/logs/NAME.log
  local name=$1 secs=$2 gpus=$3; shift 3
  local t0=$SECONDS
  echo "[$(date +%T)] start $name on GPUs $gpus (limit ${secs}s)" | tee -a "$OUT/logs/session.log"
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "$secs" "$@" > "$OUT/logs/$name.log" 2>&1
  echo "[$(date +%T)] end $name rc=$? after $((SECONDS - t0))s" | tee -a "$OUT/logs/session.log"
}

# lanes of a 2-GPU machine (call 4)
lane_pair01d() {
  run e2e_vs_trl_B 330 0,1 python3 bench/e2e_vs_trl.py --part B --timeout 300 --out "$OUT/e2e_vs_trl_B.json"
  run weight_sync 150 0,1 python3 bench/weight_sync.py --budget-s 90 --out "$OUT/weight_sync.json"
}
# lanes of a 4-GPU machine (call 3)
lane_pair01c() {
  run weight_sync 170 0,1 python3 bench/weight_sync.py --budget-s 100 --out "$OUT/weight_sync.json"
  run learner_mfu_2gpu 320 0,1 python3 bench/learner_mfu.py --part 2gpu --budget-s 250 --out bench/results/learner_mfu.json
  cp bench/results/learner_mfu.json "$OUT/learner_mfu.json"
}
lane_gpu2c() {
  run reward_model_memory 420 2 python3 bench/reward_model_memory.py --out "$OUT/reward_model_memory.json"
}
lane_gpu3c() {
  run e2e_vs_trl_A 500 3 python3 bench/e2e_vs_trl.py --part A --timeout 440 --out "$OUT/e2e_vs_trl.json"
}
# lanes of a 4-GPU machine (call 2)
lane_gpu0b() {
  run learner_mfu_1gpu 450 0 python3 bench/learner_mfu.py --part 1gpu --budget-s 380 --out "$OUT/learner_mfu.json"
}
lane_pair12b() {
  run weight_sync 170 1,2 python3 bench/weight_sync.py --budget-s 100 --out "$OUT/weight_sync.json"
  run ddp_speedup 360 1,2 python3 bench/ddp_speedup.py --out "$OUT/ddp_speedup.json"
}
# lanes of a 2-GPU machine (call 1)
lane_pair01a() {
  run memory_accuracy 230 0,1 python3 bench/memory_accuracy.py --budget-s 170 --out "$OUT/memory_accuracy.json"
  run ddp_speedup 180 0,1 python3 bench/ddp_speedup.py --out "$OUT/ddp_speedup.json"
  run weight_sync 150 0,1 python3 bench/weight_sync.py --budget-s 90 --out "$OUT/weight_sync.json"
}

for l in $LANES; do "lane_$l" & done
wait
ls -la "$OUT" >> "$OUT/logs/session.log"
