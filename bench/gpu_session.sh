#!/bin/bash
# bench/gpu_session.sh: the GPU benchmarks of grpo-nb in lanes that run in parallel on a node with two GPUs.
#
#   bash bench/gpu_session.sh OUT_DIR LANE [LANE ...]      # lanes: coloc0 (or a shape a call: colocb colocl colocw, peer first: colocbr coloclr colocwr; trlcoloc) single1
#                                                        split01 (or its parts split01a/b/c, and split01w; one run a lane: split01ob/ow/ol, split01l),
#                                                        coloclong0 trlcoloclong1 trlhflong1 wsvllm01 wstf01 ipc0 mfu2 mfu2pack mfu2packw mfuprof2 mfu1p5 mfu3b mfumem0 lpmem0 sc2 rtcore0
#                                                        mfufew0 alloc0 head0 head1p5 head3b headckpt colocbsleep colocbspread colocs colocsr
#                                                        four GPUs, one lane a call: s7split s7coloc s7colocpack s7trlserver s7trlcoloc
#                                                        s7olmosplit s7olmocoloc s7olmotrlserver s7olmotrlcoloc mfu7b2 mfu7b2pack mfu7b4 mfuolmo2 tp2 mix4
#                                                        s7colocx s7olmocolocx (expandable segments) mfuolmo2pack mfu7b2packw
#                                                        mixb4 (VERL_S: verl's seconds) mixv4
#                                                        verl0 verl01 verl01b (verl needs its wheels in .whl/: bench/verl_peer.py lists them; verl01 also cupy)
#
# Each lane runs its benchmarks one after another on its own GPUs (CUDA_VISIBLE_DEVICES), each under `timeout`
# (benchmarks of two lanes that name one GPU take turns on it),
# writing JSON results and a log per benchmark under $GPUWORK (default /tmp/gpuwork, kept across calls). At the end
# OUT_DIR gets the merged JSON files and one archive of everything; copy the JSON into bench/results/ and commit it.
# What the node needs (torch with CUDA, ray, deepspeed, vllm, trl, datasets) and how to bring it to a node without
# network: the guide page "Measured on GPUs" (nbs/guides/gpu_results.ipynb). Wheels placed in .whl/ are installed
# into $SITE (default /tmp/site) on the first call; an installed environment needs none.
set -u
DEST=${1:?usage: gpu_session.sh OUT_DIR LANE [LANE ...]}; shift
LANES=${*:?name the lanes: coloc0 single1 split01}
OUT=${GPUWORK:-/tmp/gpuwork} SITE=${SITE:-/tmp/site}
mkdir -p "$OUT/logs" "$SITE"
T0=$SECONDS
STAGE=${STAGE:-/tmp/stage}   # vLLM brought in parts (vllm.tar.xz.part*, plus its own wheels), extracted once into $SITE
if ls "$STAGE"/vllm.tar.xz.part* > /dev/null 2>&1 && [ ! -d "$SITE/vllm" ]; then
  cat "$STAGE"/vllm.tar.xz.part* | xz -d -T0 | tar -x -C "$SITE" && \
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$STAGE"/*.whl >> "$OUT/logs/pip.log" 2>&1 \
    || { echo "installing vLLM from $STAGE failed"; tail "$OUT/logs/pip.log"; exit 1; }
fi
for w in .whl/*.whl; do   # each wheel once (a marker per wheel), so a later call with one more wheel installs only that
  [ -f "$w" ] && [ ! -f "$SITE/.$(basename "$w")" ] || continue
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$w" >> "$OUT/logs/pip.log" 2>&1 \
    && touch "$SITE/.$(basename "$w")" || { echo "installing $w failed"; tail "$OUT/logs/pip.log"; exit 1; }
done
python3 -m compileall -q -j 0 "$SITE" > /dev/null 2>&1   # the bytecode pip would have written (skipped where current): no run's start pays for it
echo "install: $((SECONDS - T0)) s" | tee -a "$OUT/logs/session.log"
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled TORCH_CUDA_ARCH_LIST=9.0 \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=offline VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/logs/gpus.csv" 2>&1
# requirements/gpu.txt lists liger-kernel: without it every learner here runs unfused kernels (model.kernels=auto falls back),
# slower and larger than what a user of that install runs, so the session stops unless told (NO_LIGER=1) that is the point.
if [ "${NO_LIGER:-0}" != 1 ] && ! python3 -c "import liger_kernel" > /dev/null 2>&1; then
  echo "liger-kernel is not installed: put its wheel in .whl/ (pip download liger-kernel --no-deps -d .whl), or NO_LIGER=1 to measure without it" \
    | tee -a "$OUT/logs/session.log"; exit 1
fi

run() {  # run NAME SECONDS GPUS CMD...: one benchmark on the given GPUs, its log in OUT/logs/NAME.log
  # Lanes run at once, each naming its GPUs; two lanes named on one node may share a GPU (colocb and colocwr on a one-GPU
  # node). A lock per GPU, taken in the lanes' ascending order, makes benchmarks on a shared GPU run one after the other
  # instead of side by side (where each would time the other's work); the wait is logged and not counted in the limit.
  local name=$1 secs=$2 gpus=$3; shift 3
  local t0=$SECONDS g fd fds=() rc
  for g in ${gpus//,/ }; do exec {fd}> "$OUT/.gpu$g.lock"; flock "$fd"; fds+=("$fd"); done
  local waited=$((SECONDS - t0)); t0=$SECONDS
  echo "[$(date +%T)] start $name on GPUs $gpus (limit ${secs}s)$([ "$waited" -gt 0 ] && echo ", after ${waited}s waiting for them")" | tee -a "$OUT/logs/session.log"
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "$secs" "$@" > "$OUT/logs/$name.log" 2>&1; rc=$?
  for fd in "${fds[@]}"; do exec {fd}>&-; done
  echo "[$(date +%T)] end $name rc=$rc after $((SECONDS - t0))s" | tee -a "$OUT/logs/session.log"
}
e2e() {  # e2e RUN SECONDS GPUS: one run of bench/e2e_vs_trl.py into OUT/e2e/ (a start-up of vLLM with CUDA graphs is ~60 s)
  run "e2e_${1//:/_}" "$2" "$3" python3 bench/e2e_vs_trl.py --runs "$1" --out-dir "$OUT/e2e" --timeout $(( $2 - 45 ))
}

# one GPU, one shape a call: ours colocated, then the peer's colocate mode
lane_colocb() { e2e ours:colocated:sync:bench 270 0; e2e trl:vllm-colocate:bench 200 0; }
lane_colocl() { e2e ours:colocated:sync:long 330 0; e2e trl:vllm-colocate:long 250 0; }
lane_colocw() { e2e ours:colocated:sync:wide 300 0; e2e trl:vllm-colocate:wide 250 0; }
# the same pairs with the peer first (a cold start's cost of being first on a fresh machine falls on the peer)
lane_colocbr() { e2e trl:vllm-colocate:bench 200 0; e2e ours:colocated:sync:bench 270 0; }
# the bench work timed for 40 steps instead of 10 (shape `steady`): each trainer's generation past its first steps and over stretches of slower ones (about 5 minutes a lane)
lane_colocs() { e2e ours:colocated:sync:steady 300 0; e2e trl:vllm-colocate:steady 280 0; }
lane_colocsr() { e2e trl:vllm-colocate:steady 280 0; e2e ours:colocated:sync:steady 300 0; }
lane_coloclr() { e2e trl:vllm-colocate:long 250 0; e2e ours:colocated:sync:long 330 0; }
lane_colocwr() { e2e trl:vllm-colocate:wide 250 0; e2e ours:colocated:sync:wide 300 0; }
# ours alone, colocated on one GPU (a peer's run of the same shape on the same GPU model pairs with it at the merge)
lane_ourscoloc() { e2e ours:colocated:sync:long 300 0; e2e ours:colocated:sync:wide 250 0; }
lane_ourscolocb() { e2e ours:colocated:sync:bench 250 0; }
# one GPU: how far vLLM's own generate call moves from one call to the next on this node, outside any trainer (20 calls of
# the bench shape's 64 sequences, every call's time in the record), then the colocated bench pair, whose run files carry
# every step's generation: a spread seen in both is the node's, one seen only in the trainers is theirs
lane_colocbspread() { run rollout_generation_spread 240 0 python3 bench/rollout_throughput.py --engines vllm-graphs --repeats 20 \
                        --budget-s 45 --out "$OUT/rollout_generation_spread.json"; lane_colocb; }
# ours on the bench shape with the engine asleep through every learner step (sleep_level=2), then with the default again
lane_colocbsleep() {
  run e2e_ours_colocated_sync_bench_sleep2 250 0 python3 bench/e2e_vs_trl.py --runs ours:colocated:sync:bench --out-dir "$OUT/e2e_sleep2" \
      --timeout 205 --ours-extra=--rollout.sleep_level=2
  e2e ours:colocated:sync:bench 250 0
}
# the peer's colocate mode alone, long and wide, each from empty compile caches (pairs with ours of the same GPU model)
lane_trlcoloc() { e2e trl:vllm-colocate:long 260 0; e2e trl:vllm-colocate:wide 240 0; }
# both GPUs, the bench shape, ours only (a cold start of the split layout takes about two minutes: 280 s a run)
lane_split01n() { e2e ours:split:sync:bench 280 0,1; e2e ours:split:one-step-off:bench 280 0,1; }
# both GPUs, the wide shape: TRL's server, then ours synchronous and one-step-off
lane_split01w() { e2e trl:vllm-server:wide 270 0,1; e2e ours:split:sync:wide 280 0,1; }
# both GPUs, one run of ours a lane (each fits one call beside another short one): one-step-off on each shape; then the
# long shape's pair, TRL's server first
lane_split01ob() { e2e ours:split:one-step-off:bench 250 0,1; }
lane_split01ow() { e2e ours:split:one-step-off:wide 280 0,1; }
lane_split01ol() { e2e ours:split:one-step-off:long 290 0,1; }
lane_split01l() { e2e trl:vllm-server:long 280 0,1; e2e ours:split:sync:long 290 0,1; }
lane_split01w2() { e2e ours:split:one-step-off:wide 280 0,1; e2e trl:vllm-server:long 280 0,1; }
# one GPU each; no Ray on GPU 1 (two local Ray clusters on one host are avoided)
lane_coloc0() {
  e2e ours:colocated:sync:bench 270 0
  e2e trl:vllm-colocate:bench 200 0
  e2e ours:colocated:sync:long 330 0
  e2e trl:vllm-colocate:long 250 0
}
# one GPU: vLLM's engine core in the caller's process (as the trainer's engine actors run it) against its own process, and the
# completions decoded at the end against vLLM detokenizing as it generates; same engine otherwise
lane_rtcore0() { run rollout_throughput_core 420 "${1:-0}" python3 bench/rollout_throughput.py --engines vllm-graphs,vllm-graphs-mp,vllm-graphs-detok --budget-s 60 \
                 --out "$OUT/rollout_engine_core.json"; }
lane_single1() {
  e2e trl:transformers:bench 200 1
  run rollout_throughput 600 1 python3 bench/rollout_throughput.py --budget-s 70 --out "$OUT/rollout_throughput.json"
}
# both GPUs; split01 = split01a + split01b (each fits in one 10-minute call after the install)
lane_split01a() {
  e2e ours:split:sync:bench 250 0,1
  e2e trl:vllm-server:bench 250 0,1
}
lane_split01b() {
  e2e ours:split:one-step-off:bench 250 0,1
  e2e ours:split:one-step-off:long 300 0,1
}
lane_split01c() {   # the long shape, ours in both modes (about three minutes each from a cold start; TRL's server: split01w2)
  e2e ours:split:sync:long 290 0,1
  e2e ours:split:one-step-off:long 290 0,1
}
lane_split01() { lane_split01a; lane_split01b; lane_split01c; }
# the long colocated shape on one GPU each (ours on GPU 0, the peer's colocate mode on GPU 1, at the same time)
lane_coloclong0() { e2e ours:colocated:sync:long 400 0; }   # start-up alone took about 3 minutes on an H100
lane_trlcoloclong1() { e2e trl:vllm-colocate:long 300 1; }
# TRL with HF generate on the long shape: about 54 s a step on an H100, so 10 steps (2 warm-up + 8 timed, the least a
# record needs) take about 9.5 minutes: the whole of one call, alone. A run cut by the limit keeps its steps (a partial record).
lane_trlhflong1() { e2e trl:transformers:long 590 1; }
# verl 0.9.1 (bench/verl_peer.py): its hybrid engine on one GPU (beside our colocated layout), then on both GPUs and its split
# mode (beside our split layout); Ray, FSDP and vLLM with CUDA graphs start in a few minutes, so one run a lane per call
lane_verl0() { e2e verl:hybrid:bench 560 0; }
lane_verl01() { e2e verl:separate-async:bench 560 0,1; }
lane_verl01b() { e2e verl:hybrid-2gpu:bench 560 0,1; }
# both GPUs: weight sync into a real vLLM engine through both load paths of its workers (rollout.weight_load: straight into the
# parameters, and vLLM's layer-wise reload); results merged into $OUT/weight_sync.json, which may hold the other receiver's
lane_wsvllm01() { run weight_sync_vllm 220 0,1 python3 bench/weight_sync.py --receiver vllm --weight-load direct,reload --buckets-mib 1024,0 \
                    --budget-s 170 --out "$OUT/weight_sync.json"; }
# one GPU: the colocated sync's transport alone (two shared buffers a sync against one share per bucket)
lane_ipc0() { run ipc_sync 120 0 python3 bench/ipc_sync.py --out "$OUT/ipc_sync.json"; }
lane_wstf01() { run weight_sync_transformers 150 "${1:-0,1}" python3 bench/weight_sync.py --buckets-mib 1024,0 --budget-s 100 --out "$OUT/weight_sync.json"; }
# both GPUs: ZeRO-3 learners with Liger kernels, DeepSpeed's default buckets and larger ones (1.5B and 3B)
lane_mfu2() { run learner_mfu_2gpu 330 0,1 python3 bench/learner_mfu.py --part 2gpu --models Qwen2.5-1.5B,Qwen2.5-3B --only liger \
                --budget-s 290 --variant-limit-s 140 --out "$OUT/learner_mfu.json"; }
# both GPUs: ZeRO-3 learners with one micro-batch a step, the longest the planner fits without checkpointing in 90% of an H200
# (1.5B: 49,152 tokens a GPU; 3B: 24,576), Liger and larger buckets, spawned ranks; against mfu2's four packs of 16,384 / 8,192
lane_mfu2pack() {
  local cmd=(python3 bench/learner_mfu.py --part 2gpu --budget-s 170 --variant-limit-s 165 --launcher mp --micro-batches 1 --steps 8
             --only 'liger large-buckets 1mb' --out "$OUT/learner_mfu_2gpu_1mb.json")
  run learner_mfu_2gpu_1p5b_1mb 175 0,1 "${cmd[@]}" --models Qwen2.5-1.5B --pack 49152
  run learner_mfu_2gpu_3b_1mb 175 0,1 "${cmd[@]}" --models Qwen2.5-3B --pack 24576
}
# the same 1.5B step after two untimed steps instead of one, ten timed (the first timed step after one has been the slowest): its own record
lane_mfu2packw() { run learner_mfu_2gpu_1p5b_1mb_w2 175 0,1 python3 bench/learner_mfu.py --part 2gpu --budget-s 170 --variant-limit-s 165 \
                     --launcher mp --micro-batches 1 --steps 10 --warmup 2 --only 'liger large-buckets 1mb' --models Qwen2.5-1.5B --pack 49152 \
                     --out "$OUT/learner_mfu_2gpu_1mb.json"; }
# both GPUs: a profiled ZeRO-3 rank (spawned processes: the launcher that can profile a rank; 1.5B, Liger, larger buckets)
lane_mfuprof2() { run learner_mfu_2gpu_prof 160 0,1 python3 bench/learner_mfu.py --part 2gpu --models Qwen2.5-1.5B --only 'liger large' \
                    --launcher mp --budget-s 140 --variant-limit-s 130 --out "$OUT/learner_mfu_2gpu.json"; }
# 1.5B on one GPU each, eager on GPU 0 and Liger on GPU 1 at the same time, same micro-batches, no log-prob check before timing
lane_mfu1p5() {
  run learner_mfu_1p5b_eager 200 0 python3 bench/learner_mfu.py --part 1gpu --models Qwen2.5-1.5B --only 'zero1$' --pack 12288 --skip-check \
      --budget-s 150 --variant-limit-s 150 --out "$OUT/learner_mfu_1p5b_eager.json" &
  run learner_mfu_1p5b_liger 200 1 python3 bench/learner_mfu.py --part 1gpu --models Qwen2.5-1.5B --only 'zero1 liger' --pack 12288 --skip-check \
      --budget-s 150 --variant-limit-s 150 --out "$OUT/learner_mfu_1p5b_liger.json" &
  wait
}
# one GPU, about a minute: the log-prob head's peak memory, naive against chunked, and the chunk-size sweep (bench/logprob_memory.py)
lane_lpmem0() { run logprob_memory 200 "${1:-0}" python3 bench/logprob_memory.py --out "$OUT/logprob_memory.json"; }
# one GPU: the checkpointed ZeRO-1 learner of the 0.5B shape (the benchmark checkpoints only the largest model it is given), with
# what is live at its step's peak
lane_mfumem0() { run learner_mfu_memory_peak 300 "${1:-0}" python3 bench/learner_mfu.py --part 1gpu --models Qwen2.5-0.5B --only 'ckpt$' \
                   --memory-peak --skip-check --budget-s 260 --variant-limit-s 130 --out "$OUT/learner_mfu_memory_peak.json"; }
# one GPU: the learner's step in fewer, longer micro-batches against the default 4-pack step, 8 timed steps each, one after
# another on the same GPU (1.5B: 2 packs of 32,768 tokens; 3B: 3 packs of 16,384), Liger's kernels on; the allocator check first
lane_mfufew0() {
  local g=${1:-0} few=(python3 bench/learner_mfu.py --part 1gpu --skip-check --steps 8 --budget-s 130 --variant-limit-s 125)
  lane_alloc0 "$g"
  run learner_mfu_1p5b_4mb 135 "$g" "${few[@]}" --models Qwen2.5-1.5B --only 'zero1 liger$' --out "$OUT/learner_mfu_few.json"
  run learner_mfu_1p5b_2mb 135 "$g" "${few[@]}" --models Qwen2.5-1.5B --only 'zero1 liger 2mb' --pack 32768 --micro-batches 2 --out "$OUT/learner_mfu_few.json"
  run learner_mfu_3b_3mb 135 "$g" "${few[@]}" --models Qwen2.5-3B --only 'zero1 liger 3mb' --pack 16384 --micro-batches 3 --out "$OUT/learner_mfu_few.json"
  run learner_mfu_3b_4mb 135 "$g" "${few[@]}" --models Qwen2.5-3B --only 'zero1 liger$' --out "$OUT/learner_mfu_few.json"
}
# one GPU: the log-prob head alone, the loop of torch ops against the fused Triton kernels (bench/logprob_head.py)
lane_head0() { run logprob_head 150 "${1:-0}" python3 bench/logprob_head.py --out "$OUT/logprob_head.json"; }
# one GPU, one model a lane: the learner's step with the loop head ('... torch-head') and with the default (the fused head), for
# the default step (four packs' worth) and for fewer, longer packs (1.5B: 2 of 32,768 tokens; 3B: 3 of 16,384), Liger's kernels
# on, 8 timed steps each, one after another on the same GPU; the default step's packs are pinned to what the loop head's planner
# picks (the fused head's smaller buffers would let the 3B shape take longer ones), so that each pair differs in the head only
head_steps() {   # head_steps MODEL NAME DEFAULT_PACK FEW PACK
  local g=0 n=$2 p4=$3 few=$4 pack=$5 cmd=(python3 bench/learner_mfu.py --part 1gpu --skip-check --steps 8 --budget-s 130 --variant-limit-s 125 --models "$1")
  run "learner_mfu_${n}_torchhead" 135 $g "${cmd[@]}" --only 'zero1 liger torch-head$' --pack "$p4" --logprob-kernel torch --out "$OUT/learner_mfu_head.json"
  run "learner_mfu_${n}" 135 $g "${cmd[@]}" --only 'zero1 liger$' --pack "$p4" --out "$OUT/learner_mfu_head.json"
  run "learner_mfu_${n}_${few}mb_torchhead" 135 $g "${cmd[@]}" --only "zero1 liger ${few}mb" --pack "$pack" --micro-batches "$few" \
      --logprob-kernel torch --out "$OUT/learner_mfu_head.json"
  run "learner_mfu_${n}_${few}mb" 135 $g "${cmd[@]}" --only "zero1 liger ${few}mb" --pack "$pack" --micro-batches "$few" --out "$OUT/learner_mfu_head.json"
}
# one GPU: the checkpointed 1.5B step (whose peak is the log-prob head's, so the planner's count of the head's buffers is what
# the record checks), with the loop head and with the fused one
lane_headckpt() {
  local cmd=(python3 bench/learner_mfu.py --part 1gpu --skip-check --steps 3 --budget-s 130 --variant-limit-s 125 --models Qwen2.5-1.5B --only 'zero1 ckpt')
  run learner_mfu_1p5b_ckpt_torchhead 135 0 "${cmd[@]}" --logprob-kernel torch --out "$OUT/learner_mfu_headckpt.json"
  run learner_mfu_1p5b_ckpt 135 0 "${cmd[@]}" --out "$OUT/learner_mfu_headckpt.json"
}
lane_head1p5() { head_steps Qwen2.5-1.5B 1p5b 16384 2 32768; }
lane_head3b() { head_steps Qwen2.5-3B 3b 12288 3 16384; }
# one GPU: does learner.allocator=expandable take effect with this torch (the allocator's own segment list)
lane_alloc0() { run allocator_check 60 "${1:-0}" python3 bench/allocator_check.py --out "$OUT/allocator_gpu.json"; }
# 3B on one GPU (an H200: without checkpointing it does not fit an H100 at useful row lengths), eager then Liger
lane_mfu3b() { run learner_mfu_3b 200 0 python3 bench/learner_mfu.py --part 1gpu --models Qwen2.5-3B --only 'zero1$,zero1 liger' --skip-check \
                 --budget-s 150 --variant-limit-s 110 --out "$OUT/learner_mfu_3b.json"; }
# both GPUs: the seed-004 2-GPU preset's placement with 3B policy and guidance (frozen models in CPU memory)
lane_sc2() { run sc_memory_gpu 440 0,1 python3 bench/sc_memory_gpu.py --only 2 --merge --limit-s 420 --out "$OUT/sc_memory_gpu.json"; }

# four GPUs: the 7B presets (bench/scale_4gpu.py), each alone in one 10-minute call; the random-init models are built once
# into $OUT/models (kept across calls), and results merge into $OUT/scale_4gpu.json (seeded from the committed file, so a
# TRL lane pairs with our run of an earlier call on the same GPUs, and records on other GPUs are kept)
scale() {
  [ -f "$OUT/scale_4gpu.json" ] || cp bench/results/scale_4gpu.json "$OUT/"
  local name=$1 secs=$2; shift 2
  run "scale_$name" "$secs" 0,1,2,3 python3 bench/scale_4gpu.py --models-dir "$OUT/models" --logs-dir "$OUT/logs/scale" --out "$OUT/scale_4gpu.json" "$@"
}
lane_s7split() { scale qwen_split 570 --models Qwen2.5-7B --layouts split --peers '' --timeout 520; }
lane_s7coloc() { scale qwen_coloc 570 --models Qwen2.5-7B --layouts colocated --peers '' --timeout 520; }
# the colocated preset with its earlier pack (7 micro-batches of 8,192 tokens a learner, against the preset's one), into its own file
lane_s7colocpack() { scale qwen_coloc_pack 570 --models Qwen2.5-7B --layouts colocated --peers '' --timeout 520 \
                     --set learner.pack_length=8192 --out "$OUT/scale_4gpu_overrides.json"; }
lane_s7trlserver() { scale qwen_trl_server 580 --models Qwen2.5-7B --layouts split --skip-ours --peers trl:vllm-server --trl-timeout 540; }
lane_s7trlcoloc() { scale qwen_trl_coloc 580 --models Qwen2.5-7B --layouts colocated --skip-ours --peers trl:vllm-colocate --trl-timeout 540; }
lane_s7olmosplit() { scale olmo_split 570 --models OLMo-2-7B --layouts split --peers '' --timeout 520; }
lane_s7olmocoloc() { scale olmo_coloc 570 --models OLMo-2-7B --layouts colocated --peers '' --timeout 520; }
# the colocated presets with expandable segments in the learners (learner.allocator=expandable), into their own file: the
# learners' reserved peak against the preset's records above (the planner's 10% on OLMo-2-7B)
lane_s7olmocolocx() { scale olmo_coloc_expandable 570 --models OLMo-2-7B --layouts colocated --peers '' --timeout 520 \
                      --set learner.allocator=expandable --out "$OUT/scale_4gpu_overrides.json"; }
lane_s7colocx() { scale qwen_coloc_expandable 570 --models Qwen2.5-7B --layouts colocated --peers '' --timeout 520 \
                  --set learner.allocator=expandable --out "$OUT/scale_4gpu_overrides.json"; }
lane_s7olmotrlserver() { scale olmo_trl_server 580 --models OLMo-2-7B --layouts split --skip-ours --peers trl:vllm-server --trl-timeout 540; }
lane_s7olmotrlcoloc() { scale olmo_trl_coloc 580 --models OLMo-2-7B --layouts colocated --skip-ours --peers trl:vllm-colocate --trl-timeout 540; }
# the ZeRO-3 learner alone at 7B: two GPUs (with gradient checkpointing, which the planner turns on there), and four
lane_mfu7b2() { run learner_mfu_7b_2gpu 330 0,1 python3 bench/learner_mfu.py --part 2gpu --models Qwen2.5-7B --budget-s 300 \
                  --variant-limit-s 200 --out "$OUT/learner_mfu_7b.json"; }
# the 7B learner on two GPUs with one micro-batch of 16,384 tokens a step (checkpointing on, as the planner needs), against mfu7b2's packs of 4,096;
# its own results file, its own processes (no Ray), and GPUs 2,3 when PAIR=2,3: beside mfuolmo2 (GPUs 0,1) in one call on a four-GPU node
lane_mfu7b2pack() { run learner_mfu_7b_2gpu_1mb 330 "${PAIR:-0,1}" python3 bench/learner_mfu.py --part 2gpu --models Qwen2.5-7B --budget-s 300 \
                    --variant-limit-s 150 --launcher mp --pack 16384 --micro-batches 1 --steps 8 --only 'liger 1mb,large-buckets 1mb' --out "$OUT/learner_mfu_7b_1mb.json"; }
# the same Qwen2.5-7B step after two untimed steps, ten timed (the first timed step after one has been the slowest): its own record
lane_mfu7b2packw() { run learner_mfu_7b_2gpu_1mb_w2 330 "${PAIR:-0,1}" python3 bench/learner_mfu.py --part 2gpu --models Qwen2.5-7B --budget-s 300 \
                     --variant-limit-s 250 --launcher mp --pack 16384 --micro-batches 1 --steps 10 --warmup 2 --only 'large-buckets 1mb' \
                     --out "$OUT/learner_mfu_7b_1mb.json"; }
# the OLMo-2-7B learner with one micro-batch of 16,384 tokens a step (its packs of 4,096 spend a third of the step in all-gathers)
lane_mfuolmo2pack() { run learner_mfu_olmo2_7b_2gpu_1mb 330 "${PAIR:-0,1}" python3 bench/learner_mfu.py --part 2gpu --models OLMo-2-7B --budget-s 300 \
                      --variant-limit-s 150 --launcher mp --pack 16384 --micro-batches 1 --steps 8 --only 'large-buckets 1mb' --out "$OUT/learner_mfu_olmo_1mb.json"; }
# the OLMo-2-7B learner alone on two GPUs (about half the Qwen shape's MFU with the same step); spawned ranks, so rank 0 is profiled
lane_mfuolmo2() { run learner_mfu_olmo2_7b_2gpu 330 0,1 python3 bench/learner_mfu.py --part 2gpu --models OLMo-2-7B --budget-s 300 \
                  --variant-limit-s 200 --launcher mp --out "$OUT/learner_mfu_7b.json"; }
lane_mfu7b4() { run learner_mfu_7b_4gpu 330 0,1,2,3 python3 bench/learner_mfu.py --part 4gpu --models Qwen2.5-7B --budget-s 300 \
                  --variant-limit-s 200 --out "$OUT/learner_mfu_7b.json"; }
# four GPUs, the short one- and two-GPU lanes side by side (about seven minutes): the log-prob head's memory then the
# checkpointed learners' peaks on GPU 0, the engine-core comparison on GPU 1, the in-place transformers receiver on GPUs 2,3
lane_mix4() { { lane_lpmem0 0; lane_mfumem0 0; } & lane_rtcore0 1 & lane_wstf01 2,3 & wait; }
# four GPUs, a cold start of each trainer at once on the bench shape: verl's hybrid engine (GPU 0), ours colocated (GPU 1),
# TRL's colocate mode (GPU 2); verl runs its own Ray instance (RAY_ADDRESS=local), ours its own cluster
lane_mixb4() { e2e verl:hybrid:bench "${VERL_S:-500}" 0 & e2e ours:colocated:sync:bench 260 1 & e2e trl:vllm-colocate:bench 220 2 & wait; }
# four GPUs: verl's hybrid engine on the bench shape (GPU 0, the only Ray user), the checkpointed 0.5B learner's peak (GPU 1),
# the 7B learner with one micro-batch a step (GPUs 2,3)
lane_mixv4() { lane_verl0 & lane_mfumem0 1 & PAIR=2,3 lane_mfu7b2pack & wait; }
# the 1.5B shape with one TP=2 engine beside two ZeRO-3 learners, every sync checked bit for bit (bench/tp2_gpu.py)
lane_tp2() { [ -f "$OUT/tp2_gpu.json" ] || cp bench/results/tp2_gpu.json "$OUT/"
             run tp2_gpu 450 0,1,2,3 python3 bench/tp2_gpu.py --layouts tp2 --out "$OUT/tp2_gpu.json"; }

for l in $LANES; do "lane_$l" & done
wait
[ -d "$OUT/e2e" ] && python3 bench/e2e_vs_trl.py --merge "$OUT/e2e" --out "$OUT/e2e_vs_trl.json" >> "$OUT/logs/session.log" 2>&1
ls -la "$OUT" "$OUT/e2e" >> "$OUT/logs/session.log" 2>&1
echo "session: $((SECONDS - T0)) s" | tee -a "$OUT/logs/session.log"
mkdir -p "$DEST"; tar -czf "$DEST/gpuwork.tgz" -C "$OUT" --exclude=./models . ; cp "$OUT"/*.json "$DEST"/ 2>/dev/null
for f in "$OUT"/e2e/run_*.json; do [ -f "$f" ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['run'], r.get('stats'), (r.get('error') or '')[-600:])" "$f"; done
