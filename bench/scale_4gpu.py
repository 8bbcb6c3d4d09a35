"""A 7B policy on 4 GPUs, run by `grpo_nb train` from the presets in configs/, with every sync checked bit for bit.

    python bench/scale_4gpu.py --models Qwen2.5-7B,OLMo-2-7B --layouts split,colocated --out bench/results/scale_4gpu.json
    python bench/scale_4gpu.py --smoke --out /tmp/scale_smoke.json      # CPU, tiny model, split layout with TP=2 (here)

Each (model, layout) is one run of `grpo_nb train scale-7b-4gpu-<layout>` on a random-init model of the named shape
(built here from `grpo_nb.memory.ARCHS`: there is no model hub on the GPU machines), with a tokenizer over every id
and random 512-token prompts (512 digits, one token each: `common.save_bench_tokenizer`); the preset's work per step (16 prompts x G=8, 1,024 generated tokens) and
`rollout.verify_every=1`, so after every sync each engine worker's parameters are compared with the learner's, cut
and packed as the worker holds them. While it runs, `nvidia-smi` is polled for every GPU's memory in use; its peak
is recorded next to `grpo_nb plan`'s prediction for the same GPU. After the run, the NCCL broadcast floor for the
synced bytes is timed between the learner's GPU and the engines' GPUs.

Record keys: model, layout, gpus, tp, learners, engines, step_s_all, step_mean_s, step_median_s, step_p90_s (over the
steps after the first two; each step with its bit-exact check, `time/step` + `time/verify`, since the check runs after
every sync; step_mean_without_verify_s is the mean without it), mfu_per_learner_gpu, sync_s, sync_floor_s, exact_sync (true only when every sync of the
run was bit-identical on every TP worker), max_abs_logprob_diff, logprob_atol, peak_gib_measured, peak_gib_planned,
trl_backend, trl_step_mean_s, speedup_mean, device, rc, error (when it failed), time_split (mean seconds per phase), sync_split
(the sync's phases on its slowest rank, mean seconds: gather_s, send_s, recv_s, load_s, and colocated recv_wait_s and recv_copy_s,
the receivers' wait for their learner's message and their copy out of the shared buffer).

The peer on the same GPUs, same model and same work (`--peers`, both by default; each with its own time limit,
`--trl-timeout`), TRL's GRPOTrainer under `accelerate launch` with DeepSpeed ZeRO-3 (a config file this script writes):
  trl:vllm-server    beside the split layout: `trl vllm-serve --tensor-parallel-size 2` on GPUs 2-3, the trainer on
                     GPUs 0-1 (2 processes, `vllm_mode="server"`)
  trl:vllm-colocate  beside the colocated layout: the trainer on GPUs 0-3 (4 processes), each with its own vLLM
                     engine (`vllm_mode="colocate"`, TP=1, sleeping during the optimizer step, as our engines do)
Each rank runs this script with `--trl-child SPEC`; rank 0 writes every step's time (from one step's end to the next)
and TRL's phases (generation, weight sync) to a JSON file after each step. A TRL failure lands in `trl_error` (the
tail of its logs) and never loses our record. TRL keys: trl_backend, trl_step_s_all, trl_step_mean_s,
trl_step_median_s, trl_step_p90_s, trl_timed_steps, trl_peak_gib_measured, trl_split_s, trl_version, trl_args,
trl_commands, trl_error; speedup_mean = trl_step_mean_s / step_mean_s.

    python bench/scale_4gpu.py --layouts split,colocated --dry-run        # print every command and config, run nothing
    python bench/scale_4gpu.py --layouts split --skip-ours --peers trl:vllm-server   # add TRL to the records in --out

TRL, accelerate and DeepSpeed must be importable (and jmespath, for `trl vllm-serve`); `--smoke` runs ours only.
"""
from __future__ import annotations
import argparse, importlib.util, json, os, shlex, shutil, statistics, subprocess, sys, tempfile, time, traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
from common import MemoryPoller, digit_prompts, first_error, free_port, save_bench_tokenizer, step_stats as stats, stop_group, wait_gpus_free   # noqa: E402  (shared by the bench scripts)
from scale_report import plan_overrides   # noqa: E402  (plain Python: the pages' renderers, and how a record is planned again)
from e2e_vs_trl import SAFE_ENV, _SERVER_LOG, _tail, _wait_health, time_trl_phases, toy_reward, trl_split   # noqa: E402  (the TRL side of the 1-2 GPU bench)

LAYOUTS = {"split": dict(gpus=4, learners=2, engines=1, tp=2), "colocated": dict(gpus=4, learners=4, engines=4, tp=1)}
SHAPE = dict(prompts=16, prompt_len=512, G=8, gen=1024, steps=10, warmup=2)
NO_FLOOR = False   # --no-floor
SMOKE = dict(prompts=2, prompt_len=8, G=2, gen=8, steps=4, warmup=1)
PEERS = {"split": "trl:vllm-server", "colocated": "trl:vllm-colocate"}
"The TRL mode measured beside each of our layouts, on the same four GPUs."
TRL_ROLES = {"trl:vllm-server": dict(trainer_gpus="0,1", processes=2, server_gpus="2,3", server_tp=2),
             "trl:vllm-colocate": dict(trainer_gpus="0,1,2,3", processes=4, server_gpus=None, vllm_tp=1)}
"Which GPUs each TRL role gets: one GPU per trainer rank (TRL refuses two GPUs in one process), the server's TP=2 on GPUs 2-3."
TRL_MICRO = 8   # sequences per rank per forward/backward (--trl-micro-batch); gradient accumulation makes up the step


def preset_work(layout:str, steps:int, warmup:int) -> dict:
    "The work of one step of our preset for `layout` (prompts, G, prompt and generated tokens, the engines' memory share), plus the steps: what both sides run."
    import yaml
    p = yaml.safe_load((ROOT / "configs" / f"scale-7b-4gpu-{layout}.yaml").read_text())
    r = p["rollout"]
    return dict(prompts=r["prompts_per_step"], prompt_len=p["data"]["max_prompt_tokens"], G=r["num_samples_per_prompt"],
                gen=r["max_new_tokens"], steps=steps, warmup=warmup, gpu_memory_utilization=r["gpu_memory_utilization"])


def write_prompts(path:Path, vocab:int, sh:dict, smoke:bool=False) -> Path:
    "256 random prompts of `prompt_len` tokens (digits, one token each: `save_bench_tokenizer`) with a dummy answer; arithmetic prompts for the CPU smoke run."
    path.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in digit_prompts(256, sh["prompt_len"])) if not smoke else
                    "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10) for b in range(10)))
    return path


def ours_overrides(model_dir:Path, data:Path, tmp:Path, sh:dict, smoke:bool, device:str) -> list[str]:
    "The `grpo_nb train` overrides of our run: the model, the data and the work of `sh`, no checkpoints."
    over = [f"--model.name_or_path={model_dir}", f"--data.train_path={data}", f"--total_steps={sh['steps']}",
            f"--data.max_prompt_tokens={sh['prompt_len'] + 8}", f"--rollout.prompts_per_step={sh['prompts']}",
            f"--rollout.num_samples_per_prompt={sh['G']}", f"--rollout.max_new_tokens={sh['gen']}", "--reward.functions={arith: 1.0}",
            f"--logging.output_dir={tmp / 'run'}", "--logging.tensorboard=false", "--logging.progress_bar=false",
            "--checkpoint.every_steps=0", "--checkpoint.at_end=false", "--checkpoint.export_hf=false", "--checkpoint.resume=none"]
    if smoke:
        over += ["--cluster.device=cpu", "--cluster.gpus_per_node=0", "--cluster.gpu=", "--model.dtype=float32", "--model.gradient_checkpointing=false",
                 "--rollout.enforce_eager=true", "--rollout.kv_cache_mib=64", "--rollout.gpu_memory_utilization=0.5", "--learner.pack_length=0"]
    elif "H200" in device: over += ["--cluster.gpu=H200"]
    return over


def build_model(name:str, out:Path, smoke:bool=False) -> Path:
    "A random-init model of the named shape with a word-level tokenizer covering every id (`t<id>`); on a GPU machine it is built in a child process."
    if smoke or (out / "config.json").exists(): return _build_model_here(name, out, smoke)
    import torch
    if not torch.cuda.is_available(): return _build_model_here(name, out, smoke)
    # Built on GPU 0 for speed, but in its own process: the caching allocator of this script would otherwise keep the
    # model's ~15 GiB on GPU 0 for as long as the runs it then times, and the learner and engine there would be short of it.
    import multiprocessing as mp
    proc = mp.get_context("spawn").Process(target=_build_model_here, args=(name, out, smoke))
    proc.start(); proc.join()
    if proc.exitcode != 0 or not (out / "config.json").exists():
        raise RuntimeError(f"building the random-init {name} in {out} failed (exit {proc.exitcode}); its traceback is above")
    return out


def _build_model_here(name:str, out:Path, smoke:bool=False) -> Path:
    "`build_model` in this process (bf16 on a GPU when there is one)."
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from grpo_nb.memory import ARCHS, shape_to_hf
    if smoke:
        from grpo_nb.tiny import build_tiny_model
        return Path(build_tiny_model("tiny-untied", out, seed=0))
    if (out / "config.json").exists(): return out
    hf = shape_to_hf(ARCHS[name]) | {"max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    save_bench_tokenizer(hf["vocab_size"], out)   # prompts of digits: one token per digit
    cfg = AutoConfig.for_model(**hf)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        m = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    m.save_pretrained(out)
    return out


def plan_json(preset:str, over:list[str]) -> dict:
    "`grpo_nb plan --config PRESET --json` with the run's overrides: the planner's whole answer."
    r = subprocess.run([sys.executable, "-m", "grpo_nb.cli", "plan", "--config", preset, "--json", *over],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout)


def planned_gib(preset:str, over:list[str], layout:str, gpus:int, plan:dict|None=None) -> list[float]:
    "`grpo_nb plan --config` of the run: the predicted memory of each GPU (learner GPUs first, then engine GPUs)."
    p = plan or plan_json(preset, over)
    if layout == "colocated": return [p["colocated"]["peak_bytes"] / 2**30] * gpus
    L = LAYOUTS[layout]["learners"]
    return [p["learner"]["total_bytes"] / 2**30] * L + [p["engine"]["total_bytes"] / 2**30] * (gpus - L)


def replan(records:list[dict]) -> list[dict]:
    """Each record's `peak_gib_planned` from today's planner (`scale_report.plan_overrides`: the run's preset, overrides and pack,
    the model by its built-in shape); the value the run was given stays in `peak_gib_planned_at_run`."""
    for r in records:
        if r.get("smoke") or not str(r.get("command", "")).startswith("grpo_nb train ") or r.get("layout") not in LAYOUTS: continue
        r.setdefault("peak_gib_planned_at_run", r.get("peak_gib_planned"))
        r["peak_gib_planned"] = planned_gib(r["command"].split()[2], plan_overrides(r), r["layout"], LAYOUTS[r["layout"]]["gpus"])
    return records


def _floor_worker(rank:int, world:int, port:int, devs:list[int], nbytes:int, iters:int, q):
    import torch, torch.distributed as dist
    dev = torch.device("cuda", devs[rank])
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=dev)
    buf, tick, times = torch.empty(nbytes, dtype=torch.uint8, device=dev), torch.zeros(1, device=dev), []
    for i in range(iters + 1):
        dist.broadcast(tick, 0); torch.cuda.synchronize()   # lines the ranks up (a barrier would guess devices by rank)
        t0 = time.perf_counter(); dist.broadcast(buf, 0); torch.cuda.synchronize()
        if i: times.append(time.perf_counter() - t0)
    if rank == 0: q.put(statistics.median(times))
    dist.destroy_process_group()


def sync_floor(nbytes:int, devs:list[int], iters:int=5) -> float|None:
    "Median time of one NCCL broadcast of `nbytes` from `devs[0]` to the other GPUs: the floor of a sync of those bytes."
    import torch.multiprocessing as mp
    ctx, port = mp.get_context("spawn"), free_port()
    q = ctx.Queue()
    ps = [ctx.Process(target=_floor_worker, args=(r, len(devs), port, devs, nbytes, iters, q)) for r in range(len(devs))]
    for p in ps: p.start()
    for p in ps: p.join(120)
    for p in ps:
        if p.is_alive(): p.kill()
    return q.get(timeout=5) if not q.empty() else None


def step_fields(recs:list[dict], warmup:int) -> dict:
    "Step-time keys of a record from the trainer's metrics lines: each step with its bit-exact check (`time/step` + `time/verify`: the wall time a user waits per step with the check on), the statistics over the steps after `warmup`, and the same without the check."
    recs = [r for r in recs if "time/step" in r]
    full = [r["time/step"] + (r.get("time/verify") or 0.0) for r in recs]
    st, bare = stats(full[warmup:]), stats([r["time/step"] for r in recs][warmup:])
    return {"step_s_all": full, "step_includes": "time/step + time/verify", "timed_steps": len(full[warmup:]),
            "step_mean_s": st["mean"], "step_median_s": st["median"], "step_p90_s": st["p90"],
            "step_s_all_without_verify": [r["time/step"] for r in recs], "step_mean_without_verify_s": bare["mean"],
            "prompt_tokens_mean": statistics.fmean(r["prompt_len_mean"] for r in recs) if recs and all("prompt_len_mean" in r for r in recs) else None}


def run_one(model:str, layout:str, smoke:bool, tmp:Path, models_dir:Path, timeout:float, device:str, logs:Path|None=None, on_record=None,
            extra:list[str]=()) -> dict:
    L = LAYOUTS[layout]
    sh = SMOKE if smoke else preset_work(layout, SHAPE["steps"], SHAPE["warmup"])
    preset = f"scale-7b-4gpu-{layout}"
    model_dir = build_model(model, models_dir / model, smoke)
    V = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    data = write_prompts(tmp / "prompts.jsonl", V, sh, smoke)
    over = ours_overrides(model_dir, data, tmp, sh, smoke, device) + list(extra)   # `--set`: after the benchmark's own, so they win
    plan = plan_json(preset, over) if not smoke else {}
    planned = planned_gib(preset, over, layout, L["gpus"], plan) if not smoke else []
    mb = plan.get("micro_batches") or {}   # the learner's pack and how many micro-batches a step that makes
    cmd = [sys.executable, "-m", "grpo_nb.cli", "train", preset, *over]
    t0, log = time.perf_counter(), tmp / "train.log"
    with open(log, "w") as f, MemoryPoller() as mem:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **SAFE_ENV})
        try: rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc, 20); rc = "timeout"   # TERM first: the trainer stops Ray and frees the GPUs before the next run
    mpath = tmp / "run" / "metrics.jsonl"
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True); shutil.copy(log, logs / f"scale_{model}_{layout}.log")
        if mpath.exists(): shutil.copy(mpath, logs / f"scale_{model}_{layout}_metrics.jsonl")
        for e in sorted((tmp / "run" / "logs").glob("engine*_load.log")):   # vLLM's own log of each engine's start-up
            shutil.copy(e, logs / f"scale_{model}_{layout}_{e.name}")
    recs = [json.loads(l) for l in mpath.read_text().splitlines()] if mpath.exists() else []
    recs = [r for r in recs if "time/step" in r]
    timed = recs[sh["warmup"]:]
    mean = lambda k, rs=timed: statistics.fmean(r[k] for r in rs if r.get(k) is not None) if any(r.get(k) is not None for r in rs) else None
    checked = [r for r in recs if "sync/exact" in r]
    out = {"model": model, "layout": layout, "gpus": L["gpus"], "tp": L["tp"], "learners": L["learners"], "engines": L["engines"],
           "smoke": smoke, **step_fields(recs, sh["warmup"]),
           "mfu_per_learner_gpu": mean("mfu"), "sync_s": mean("time/sync"),
           "exact_sync": bool(checked) and len(checked) == len(recs) and all(r["sync/exact"] for r in checked),
           "syncs_checked": len(checked), "checksums_compared": max((r.get("sync/checksums_compared", 0) for r in checked), default=0),
           "max_abs_logprob_diff": max((r["sync/max_abs_logprob_diff"] for r in checked if "sync/max_abs_logprob_diff" in r), default=None),   # the checks that compared log-probs
           "logprob_checks": sum("sync/max_abs_logprob_diff" in r for r in checked),
           "logprob_atol": max((r.get("sync/logprob_atol") or 0 for r in checked), default=None), "logprob_atol_form": "4u*max|z|*sqrt(L)",
           "peak_gib_measured": [mem.peak[i] / 1024 for i in sorted(mem.peak)][:L["gpus"]] if not smoke else [],
           "peak_gib_planned": planned, "pack_length": mb.get("pack_length"), "micro_batches_per_step": mb.get("per_step"),
           "learner_peak_allocated_gib": max((r.get("peak_gpu_mem_gib", 0) for r in recs), default=None),
           "learner_peak_reserved_gib": max((r.get("peak_gpu_reserved_gib", 0) for r in recs), default=None),   # torch's cached blocks too: the rest of a GPU's peak is the engine's and the contexts'
           "time_split": {k: mean(k) for k in ("time/generation", "time/generation_total", "time/generation_engine", "time/wait_rollout", "time/reward", "time/learner", "time/sync",
                                                 "time/verify", "time/sleep", "time/wake", "time/wake_weights", "time/wake_kv", "time/release",
                                                 "verify/checksums_s", "verify/logprobs_s", "verify/release_s")},
           "sync_split": {k: mean(f"sync/{k}") for k in ("gather_s", "send_s", "recv_s", "recv_wait_s", "recv_copy_s", "load_s")},   # slowest rank's phases (colocated: recv_s = wait + copy)
           "released_ranks": {k: mean(f"colocate/released_{k}") for k in ("before_weights", "before_kv", "after_verify")},   # learner ranks giving their cache back, per step
           "startup_s": {k.removeprefix("startup/"): v for k, v in (recs[0] if recs else {}).items() if k.startswith("startup/")},   # Ray, learners, engine load and vLLM's phases of it
           "trl_backend": None, "trl_step_mean_s": None, "speedup_mean": None, "work": {k: v for k, v in sh.items() if k != "gpu_memory_utilization"},
           "rc": rc, "wall_s": time.perf_counter() - t0, "command": f"grpo_nb train {preset} " + " ".join(o for o in over if "/" not in o),
           **({"overrides": [o.removeprefix("--") for o in extra]} if extra else {})}   # what this run changed in the preset
    if rc != 0:
        out["error"] = f"grpo_nb train exited {rc}: " + "\n".join(l for l in log.read_text().splitlines() if "Warning" not in l)[-3000:]
    if on_record is not None: on_record(out)   # saved before the floor is timed
    if not smoke and recs and not NO_FLOOR:
        from grpo_nb.memory import ARCHS, param_counts
        nbytes = 2 * param_counts(ARCHS[model])["total"]
        devs = [0, 2, 3] if layout == "split" else [0, 1, 2, 3]
        try: out["sync_floor_s"] = sync_floor(nbytes, devs)
        except Exception as e: out["sync_floor_s"], out["floor_error"] = None, repr(e)[:500]
        out["sync_bytes"] = nbytes
    return out


# ---------------------------------------------------------------- the peer: TRL's GRPOTrainer on the same 4 GPUs
def trl_batch(sh:dict, processes:int, micro:int) -> dict:
    "TRL's batch settings for one step of `sh`: `micro` sequences per rank per pass, gradient accumulation for the rest, one generation per step."
    B = sh["prompts"] * sh["G"]   # completions a step, the same as ours
    if micro < 1 or B % (processes * micro):
        ok = [m for m in range(1, B // processes + 1) if B % (processes * m) == 0]
        raise ValueError(f"--trl-micro-batch {micro}: {B} completions a step over {processes} ranks need a micro-batch that divides "
                         f"{B // processes}; use one of {ok}")
    return dict(per_device_train_batch_size=micro, gradient_accumulation_steps=B // (processes * micro), num_generations=sh["G"],
                max_completion_length=sh["gen"], max_steps=sh["steps"])


def trl_grpo_args(peer:str, sh:dict, out_dir:Path, micro:int=TRL_MICRO, server_port:int|None=None, group_port:int|None=None) -> dict:
    "The GRPOConfig arguments of a TRL run of `sh`: ours' learning rate, no KL, bf16, gradient checkpointing, vLLM in `peer`'s mode."
    R = TRL_ROLES[peer]
    args = dict(output_dir=str(out_dir), **trl_batch(sh, R["processes"], micro), learning_rate=1e-6, beta=0.0, temperature=1.0, logging_steps=1,
                report_to=[], save_strategy="no", bf16=True, gradient_checkpointing=True, seed=0, shuffle_dataset=False, dataloader_num_workers=0,
                model_init_kwargs={"dtype": "bfloat16"}, use_vllm=True, vllm_max_model_length=sh["prompt_len"] + sh["gen"] + 64)
    if peer == "trl:vllm-colocate":
        args.update(vllm_mode="colocate", vllm_tensor_parallel_size=R["vllm_tp"], vllm_gpu_memory_utilization=sh["gpu_memory_utilization"],
                    vllm_enable_sleep_mode=True)
    else:
        args.update(vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_port=server_port, vllm_group_port=group_port, vllm_server_timeout=600)
    return args


def accelerate_config(processes:int) -> dict:
    "`accelerate launch`'s config: DeepSpeed ZeRO-3 (no offload) on `processes` local GPUs, bf16."
    return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_machines": 1, "machine_rank": 0,
            "num_processes": processes, "mixed_precision": "bf16", "downcast_bf16": "no", "rdzv_backend": "static", "same_network": True,
            "main_training_function": "main", "use_cpu": False,
            "deepspeed_config": {"zero_stage": 3, "zero3_init_flag": True, "zero3_save_16bit_model": False,
                                 "offload_optimizer_device": "none", "offload_param_device": "none", "deepspeed_multinode_launcher": "standard"}}


def trl_plan(peer:str, model_dir:Path, data:Path, sh:dict, tmp:Path, micro:int=TRL_MICRO, ports:dict|None=None) -> dict:
    "Everything a TRL run needs, built without running anything: the accelerate config, the child's spec, and the server and trainer commands with their GPUs."
    R, ports = TRL_ROLES[peer], ports or {"server": free_port(), "group": free_port(), "main": free_port()}
    spec = {"peer": peer, "model_dir": str(model_dir), "data": str(data), "out": str(tmp / "trl_steps.json"), "warmup": sh["warmup"],
            "grpo": trl_grpo_args(peer, sh, tmp / "trl", micro, ports["server"], ports["group"])}
    cfg_path, spec_path = tmp / "accelerate_zero3.yaml", tmp / "trl_spec.json"
    trainer = {"cmd": [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg_path), "--num_processes", str(R["processes"]),
                       "--main_process_port", str(ports["main"]), str(Path(__file__).resolve()), "--trl-child", str(spec_path)],
               "env": {"CUDA_VISIBLE_DEVICES": R["trainer_gpus"]}, "log": str(tmp / "trl_train.log")}
    server = None
    if R["server_gpus"]:
        server = {"cmd": [sys.executable, "-m", "trl.cli.main", "vllm-serve", "--model", str(model_dir), "--tensor-parallel-size", str(R["server_tp"]),
                          "--host", "127.0.0.1", "--port", str(ports["server"]), "--gpu-memory-utilization", str(sh["gpu_memory_utilization"]),
                          "--max-model-len", str(spec["grpo"]["vllm_max_model_length"]), "--enable-prefix-caching", "true"],
                  "env": {"CUDA_VISIBLE_DEVICES": R["server_gpus"]}, "log": str(tmp / "trl_server.log"), "port": ports["server"]}
    return {"peer": peer, "accelerate": accelerate_config(R["processes"]), "accelerate_path": str(cfg_path), "spec": spec,
            "spec_path": str(spec_path), "server": server, "trainer": trainer}


def shown(role:dict) -> str:
    "A role's command as a shell line, its GPUs in front."
    return " ".join(f"{k}={v}" for k, v in role["env"].items()) + " " + shlex.join(role["cmd"])


def trl_fields(peer:str, child:dict|None, warmup:int, peak_mib:dict, plan:dict, error:str|None=None) -> dict:
    "The record's TRL keys from the child's step file (`None` when it wrote none), the GPUs' peak memory and the error, if any."
    steps = (child or {}).get("steps") or []
    timed = steps[warmup:]
    st = stats([s["step"] for s in timed])
    if error is None and len(steps) < plan["spec"]["grpo"]["max_steps"]:
        error = f"TRL stopped after {len(steps)} of {plan['spec']['grpo']['max_steps']} steps"
    return {"trl_backend": peer, "trl_version": (child or {}).get("version"), "trl_step_s_all": [s["step"] for s in steps],
            "trl_timed_steps": len(timed), "trl_complete": len(steps) >= plan["spec"]["grpo"]["max_steps"], "trl_step_mean_s": st["mean"], "trl_step_median_s": st["median"], "trl_step_p90_s": st["p90"],
            "trl_split_s": trl_split(timed) if timed else None, "trl_peak_gib_measured": [peak_mib[i] / 1024 for i in sorted(peak_mib)][:4],
            "trl_rank0_peak_allocated_gib": (child or {}).get("rank0_peak_allocated_gib"), "trl_args_dropped": (child or {}).get("args_dropped"),
            "trl_args": {k: v for k, v in plan["spec"]["grpo"].items() if k not in ("output_dir", "vllm_server_port", "vllm_group_port")},
            "trl_commands": [shown(r) for r in (plan["server"], plan["trainer"]) if r], "trl_error": error}


def merge_trl(rec:dict, trl:dict) -> dict:
    "Our record with the TRL keys of `trl` (replacing any earlier ones) and the speed-up by mean step time (only where our run completed)."
    out = {k: v for k, v in rec.items() if not k.startswith("trl_")} | trl
    ours, theirs = out.get("step_mean_s") if out.get("rc") in (0, None) else None, trl.get("trl_step_mean_s")
    out["speedup_mean"] = theirs / ours if ours and theirs else None
    return out


def run_trl(layout:str, model_dir:Path, sh:dict, tmp:Path, timeout:float, logs:Path|None=None, micro:int=TRL_MICRO, model:str="") -> dict:
    "TRL's GRPOTrainer in the mode paired with `layout`, on the same GPUs, model and work; its own time limit. Returns the record's TRL keys."
    peer = PEERS[layout]
    wait_gpus_free()   # our run's processes gone, so that TRL's peaks are TRL's own
    V = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    plan = trl_plan(peer, model_dir, write_prompts(tmp / "trl_prompts.jsonl", V, sh), sh, tmp, micro)
    import yaml
    Path(plan["accelerate_path"]).write_text(yaml.safe_dump(plan["accelerate"], sort_keys=False))
    Path(plan["spec_path"]).write_text(json.dumps(plan["spec"], indent=1))
    deadline, error, note, server, trainer = time.monotonic() + timeout, None, None, None, None
    env = {**os.environ, **SAFE_ENV}
    with MemoryPoller() as mem:
        try:
            if plan["server"]:
                if importlib.util.find_spec("jmespath") is None: raise RuntimeError("`trl vllm-serve` needs jmespath: pip install jmespath")
                srv = plan["server"]
                server = subprocess.Popen(srv["cmd"], cwd=ROOT, env={**env, **srv["env"]}, stdout=open(srv["log"], "w"), stderr=subprocess.STDOUT,
                                          start_new_session=True)
                _SERVER_LOG[server.pid] = srv["log"]
                _wait_health(srv["port"], server, max(1.0, deadline - time.monotonic()))
            tr = plan["trainer"]
            trainer = subprocess.Popen(tr["cmd"], cwd=ROOT, env={**env, **tr["env"]}, stdout=open(tr["log"], "w"), stderr=subprocess.STDOUT,
                                       start_new_session=True)
            rc = wait_trl(trainer, Path(plan["spec"]["out"]), plan["spec"]["grpo"]["max_steps"], deadline)
            if rc == "done": note = f"TRL wrote all its steps and had not exited {TRL_EXIT_GRACE_S:.0f} s later; it was stopped"
            elif rc != 0:
                why = first_error(tr["log"])
                error = f"TRL trainer exited {rc} (limit {timeout:.0f} s)" + (f"; first error: {why}\n" if why else ": ") + _tail(tr["log"])
        except Exception as e:
            error = f"{type(e).__name__}: {e}"[-3000:]
        finally:
            stop_group(trainer, 10); stop_group(server)
    if error and server is not None and "server" not in error: error += "\n--- server log:\n" + _tail(plan["server"]["log"], 1500)
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        for role in ("server", "trainer"):
            if plan[role] and Path(plan[role]["log"]).exists(): shutil.copy(plan[role]["log"], logs / f"scale_{model}_{layout}_trl_{role}.log")
    out = Path(plan["spec"]["out"])
    child = json.loads(out.read_text()) if out.exists() else None
    wait_gpus_free()
    return trl_fields(peer, child, sh["warmup"], mem.peak, plan, error) | ({"trl_note": note} if note else {})


TRL_EXIT_GRACE_S = 60.0
"Seconds TRL's trainer gets to exit once it has written every step (its teardown can hang; the steps are what is measured)."


def wait_trl(proc:subprocess.Popen, # TRL's trainer (`accelerate launch`)
             out:Path, # the steps file its rank 0 rewrites after each step
             steps:int, # the steps it was asked for
             deadline:float, # `time.monotonic()` past which it is given up
             grace:float|None=None, # seconds to exit after its last step (default TRL_EXIT_GRACE_S)
             poll_s:float=1.0) -> int|str:
    "Wait for TRL's trainer: its exit code; 'timeout' at the deadline; 'done' once it wrote all `steps` and did not exit within `grace`."
    grace, done = TRL_EXIT_GRACE_S if grace is None else grace, None
    while (rc := proc.poll()) is None:
        now = time.monotonic()
        if now >= deadline: return "timeout"
        if done is None:
            try: done = now if len(json.loads(out.read_text()).get("steps", [])) >= steps else None
            except (OSError, ValueError): pass   # not written yet, or caught mid-write
        if done is not None and now - done >= grace: return "done"
        time.sleep(poll_s)
    return rc


def trl_child(spec_path:str):
    "One rank of the TRL run (started by `accelerate launch`): GRPOTrainer on the spec's model, prompts and arguments; rank 0 writes its steps after each one."
    import datasets, torch, trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    spec = json.loads(Path(spec_path).read_text())
    fields, want = set(GRPOConfig.__dataclass_fields__), spec["grpo"]
    args = GRPOConfig(**{k: v for k, v in want.items() if k in fields})
    rows = [json.loads(l) for l in Path(spec["data"]).read_text().splitlines()]
    ds = datasets.Dataset.from_list([{"prompt": r["prompt"]} for r in rows])
    rank0, gpu = int(os.environ.get("RANK", "0")) == 0, torch.cuda.is_available()
    steps, cur = [], {}
    time_trl_phases(GRPOTrainer, cur)
    def save():
        if not rank0: return
        rec = {"peer": spec["peer"], "version": trl.__version__, "steps": steps, "args_dropped": sorted(set(want) - fields),
               "rank0_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None}
        Path(spec["out"]).write_text(json.dumps(rec, indent=1))
    class Timer(TrainerCallback):   # a step: from the end of the one before (the first: its start) to its own end
        def on_step_begin(self, *a, **k):
            if "t" not in cur:
                if gpu: torch.cuda.synchronize()
                cur["t"] = time.perf_counter()
        def on_step_end(self, *a, **k):
            if gpu: torch.cuda.synchronize()
            t = time.perf_counter()
            steps.append({"step": t - cur.pop("t"), **{k: cur.pop(k) for k in ("generation", "sync") if k in cur}})
            cur["t"] = t
            save()
    trainer = GRPOTrainer(model=spec["model_dir"], reward_funcs=lambda completions, **kw: [toy_reward(c) for c in completions],
                          args=args, train_dataset=ds, callbacks=[Timer()])
    save()   # the version and dropped arguments, even if the first step fails
    trainer.train()
    save()


def parse_peers(text:str) -> list[str]:
    "The TRL modes of `--peers` (comma-separated; empty for none), each checked against the ones this script knows."
    peers = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in peers if p not in PEERS.values()]
    if bad: raise SystemExit(f"--peers: unknown {bad}; use a comma-separated subset of {sorted(PEERS.values())}, or '' for none")
    return peers


def gpus_here() -> str:
    "The GPUs of this machine as the records name them (`4x NVIDIA H100 80GB HBM3`), from `nvidia-smi`: this process opens no CUDA context; 'cpu' without GPUs."
    try: names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError): return "cpu"
    names = [n.strip() for n in names if n.strip()]
    return f"{len(names)}x {names[0]}" if names else "cpu"


def existing_records(records:list[dict], runs:list[tuple], skip_ours:bool, device:str) -> tuple[list[dict], dict]:
    "Split the records already in `--out` into those of other runs or other GPUs (kept as they are) and ours of `runs` on `device` (the base of `--skip-ours`); with `--skip-ours`, each run needs its record on these GPUs."
    mine = lambda r: (r.get("model"), r.get("layout")) in runs and r.get("device") == device
    keep = [r for r in records if not mine(r)]
    ours = {(r.get("model"), r.get("layout")): r for r in records if mine(r)}
    missing = [f"{m} {l}" for m, l in runs if (m, l) not in ours]
    if skip_ours and missing:
        elsewhere = sorted({r.get("device") for r in records if (r.get("model"), r.get("layout")) in runs and r.get("device") != device})
        raise SystemExit(f"--skip-ours adds TRL to our records in --out, and it has none on {device} for: {', '.join(missing)}"
                         + (f" (only on {', '.join(map(str, elsewhere))}: a speed-up needs both sides on the same GPUs)" if elsewhere else "")
                         + ". Run without --skip-ours (ours, then TRL), or point --out at the file that holds them.")
    return keep, ours


def dry_run(runs:list[tuple], peers:list[str], models_dir:Path, micro:int, extra:list[str]=()):
    "Print every command and config a run would use (ours, the TRL server, the accelerate launch, its DeepSpeed config), running none."
    import yaml
    for model, layout in runs:
        sh, tmp = preset_work(layout, SHAPE["steps"], SHAPE["warmup"]), Path(tempfile.gettempdir()) / f"scale-{layout}-XXXX"
        model_dir, data = models_dir / model, tmp / "prompts.jsonl"
        print(f"=== {model} {layout}: work {sh}")
        print(f"ours: grpo_nb train scale-7b-4gpu-{layout} " + shlex.join(ours_overrides(model_dir, data, tmp, sh, False, "") + list(extra)))
        if PEERS[layout] not in peers: continue
        plan = trl_plan(PEERS[layout], model_dir, tmp / "trl_prompts.jsonl", sh, tmp, micro, {"server": 8000, "group": 51216, "main": 29500})
        print(f"--- {PEERS[layout]}: {plan['accelerate_path']}\n" + yaml.safe_dump(plan["accelerate"], sort_keys=False).rstrip())
        print(f"--- {plan['spec_path']} (GRPOConfig arguments under 'grpo'; ports are picked free at run time)\n" + json.dumps(plan["spec"], indent=1))
        for role in ("server", "trainer"):
            if plan[role]: print(f"{role}: " + shown(plan[role]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="Qwen2.5-7B", help="comma-separated names of grpo_nb.memory.ARCHS")
    ap.add_argument("--layouts", default="split", help=f"comma-separated, of {list(LAYOUTS)}")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, split layout with TP=2 (ours only)")
    ap.add_argument("--out", default="bench/results/scale_4gpu.json")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per run of ours")
    ap.add_argument("--logs-dir", default=None, help="copy each run's train.log (and TRL's logs) here")
    ap.add_argument("--no-floor", action="store_true", help="skip timing the NCCL floor")
    ap.add_argument("--steps", type=int, default=SHAPE["steps"], help="training steps per run (the first --warmup are not timed)")
    ap.add_argument("--warmup", type=int, default=SHAPE["warmup"], help="steps left out of the statistics")
    ap.add_argument("--models-dir", default="/tmp/scale_models", help="where the random-init models are built (and reused)")
    ap.add_argument("--peers", default=",".join(PEERS.values()), help=f"TRL modes to measure beside their layout ({PEERS}); '' for none")
    ap.add_argument("--skip-ours", action="store_true", help="run only TRL and merge it into our records already in --out")
    ap.add_argument("--trl-timeout", type=float, default=540, help="seconds per TRL run (server start-up included)")
    ap.add_argument("--trl-micro-batch", type=int, default=TRL_MICRO, help="TRL sequences per rank per forward/backward")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a `grpo_nb train` override of ours on top of the preset (repeatable), e.g. learner.pack_length=49152; the record "
                         "lists them (overrides): write such runs to their own --out, beside the preset's records")
    ap.add_argument("--dry-run", action="store_true", help="print every command and config, run nothing")
    ap.add_argument("--replan", action="store_true", help="recompute peak_gib_planned of every record in --out with today's planner, run nothing")
    ap.add_argument("--trl-child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trl_child: trl_child(a.trl_child); return
    bad_set = [x for x in a.set if "=" not in x or x.startswith("-")]
    if bad_set: raise SystemExit(f"--set {bad_set[0]!r}: give KEY=VALUE as `grpo_nb train` takes it without its dashes, e.g. --set learner.pack_length=49152")
    extra = [f"--{x}" for x in a.set]
    if a.replan:
        res = json.loads(Path(a.out).read_text()); res["records"] = replan(res["records"])
        Path(a.out).write_text(json.dumps(res, indent=1)); return
    SHAPE.update(steps=a.steps, warmup=a.warmup)
    global NO_FLOOR
    NO_FLOOR = a.no_floor
    peers = [] if a.smoke else parse_peers(a.peers)
    runs = [("tiny-untied", "split")] if a.smoke else [(m, l) for m in a.models.split(",") for l in a.layouts.split(",")]
    bad = [l for _, l in runs if l not in LAYOUTS]
    if bad: raise SystemExit(f"--layouts: unknown {bad}; use a comma-separated subset of {list(LAYOUTS)}")
    for _, l in runs:   # a micro-batch that does not divide the step fails here, before any GPU work
        if PEERS[l] in peers: trl_batch(preset_work(l, a.steps, a.warmup), TRL_ROLES[PEERS[l]]["processes"], a.trl_micro_batch)
    if a.dry_run: dry_run(runs, peers, Path(a.models_dir), a.trl_micro_batch, extra); return
    out = Path(a.out)
    old = []
    if out.exists():   # keep the records of other runs
        try: old = json.loads(out.read_text()).get("records", [])
        except (json.JSONDecodeError, AttributeError): pass
    device = "cpu" if a.smoke else gpus_here()
    keep, ours = existing_records(old, runs, a.skip_ours, device)   # one record per model, layout and GPUs
    res = {"records": keep, "device": device}
    for model, layout in runs:
        def save(rec, keep=list(res["records"]), trl=False):
            if trl: rec["trl_device"], rec["trl_time"] = device, time.strftime("%Y-%m-%d %H:%M:%S")
            else: rec["device"], rec["time"] = device, time.strftime("%Y-%m-%d %H:%M:%S")
            res["records"] = keep + [rec]
            out.parent.mkdir(parents=True, exist_ok=True); out.write_text(json.dumps(res, indent=1))
        logs = a.logs_dir and Path(a.logs_dir)
        with tempfile.TemporaryDirectory(prefix=f"scale-{layout}-") as d:
            if a.skip_ours: rec = ours[(model, layout)]
            else:
                try: rec = run_one(model, layout, a.smoke, Path(d), Path(a.models_dir), a.timeout, device, logs, save, extra)
                except Exception: rec = {"model": model, "layout": layout, "error": traceback.format_exc()[-2000:]}
                before = ours.get((model, layout)) or {}
                if PEERS[layout] not in peers and before.get("trl_backend"):   # TRL's run of this model, layout and GPUs stays paired:
                    rec = merge_trl(rec, {k: v for k, v in before.items() if k.startswith("trl_")})   # its side does not depend on ours
                save(rec)
                print(model, layout, {k: rec.get(k) for k in ("step_mean_s", "mfu_per_learner_gpu", "sync_s", "sync_floor_s", "exact_sync",
                                                              "max_abs_logprob_diff", "logprob_atol", "peak_gib_measured", "peak_gib_planned", "rc")},
                      (rec.get("error") or "")[-1500:], flush=True)
            if PEERS[layout] not in peers: continue
            sh = preset_work(layout, SHAPE["steps"], SHAPE["warmup"])
            tmp = Path(d) / "trl"; tmp.mkdir()
            try: trl = run_trl(layout, build_model(model, Path(a.models_dir) / model), sh, tmp, a.trl_timeout, logs, a.trl_micro_batch, model)
            except Exception: trl = {"trl_backend": PEERS[layout], "trl_step_mean_s": None, "trl_error": traceback.format_exc()[-3000:]}
            rec = merge_trl(rec, trl)
            save(rec, trl=True)
            print(model, layout, {k: rec.get(k) for k in ("trl_backend", "trl_version", "trl_step_mean_s", "trl_step_median_s", "trl_peak_gib_measured",
                                                          "speedup_mean")}, (rec.get("trl_error") or "")[-1500:], flush=True)


if __name__ == "__main__":
    main()
