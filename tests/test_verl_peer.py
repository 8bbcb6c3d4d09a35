"""verl as the second peer of bench/e2e_vs_trl.py, on CPU: the command and files a GPU run would use, the parsing of
verl's step logs, the refusal up front when verl cannot run, and the merging of its runs beside ours and TRL's."""
import importlib.util, json, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import e2e_vs_trl as E   # noqa: E402
import verl_peer as V    # noqa: E402

BENCH = E.SHAPES["bench"]

# What verl 0.9.1 prints a step with `trainer.logger=[console,...]` (verl/utils/logger/aggregate_logger.py: `step:N`, then
# `key:pprint.pformat(value)` for every number, joined by " - "), as Ray forwards it from the TaskRunner actor; numpy
# scalars print as `np.float64(...)`. Around it: tqdm's bar, a warning, and a last line cut by the time limit.
CONSOLE = """\
(TaskRunnerV1 pid=48213) Training Progress:   0%|          | 0/12 [00:00<?, ?it/s]
(TaskRunnerV1 pid=48213) step:1 - actor/pg_loss:np.float64(-0.0031) - actor/grad_norm:np.float64(0.412) - actor/lr:1e-06 - critic/score/mean:np.float64(0.4993) - response_length/mean:np.float64(256.0) - timing_s/gen:4.812 - timing_s/old_log_prob:0.611 - timing_s/adv:0.004 - timing_s/update_actor:1.402 - timing_s/update_weights:0.512 - timing_s/step:7.431 - timing_per_token_ms/gen:0.29 - perf/throughput:3456.1 - training/global_step:1 - training/epoch:0
(TaskRunnerV1 pid=48213) WARNING 11-26 10:00:01 [scheduler.py:12] some warning with step: in it
(TaskRunnerV1 pid=48213) step:2 - actor/pg_loss:np.float64(0.0012) - timing_s/gen:1.25 - timing_s/old_log_prob:0.21 - timing_s/update_actor:0.62 - timing_s/update_weights:0.11 - timing_s/step:2.25 - training/global_step:2
step:3 - timing_s/gen:np.float64(1.0) - timing_s/update_weights:tensor(0.25, device='cuda:0') - timing_s/update_actor:0.5 - timing_s/step:2.0 - actor/kl:nan
(TaskRunnerV1 pid=48213) step:4 - timing_s/gen:1.5 - timing_s/update_w"""


def test_console_parser_reads_each_step():
    steps = V.parse_console(CONSOLE)
    assert [s["timing_s/step"] for s in steps] == [7.431, 2.25, 2.0]   # the cut line has no step time: not a step
    assert steps[0]["timing_s/update_weights"] == 0.512 and steps[0]["actor/pg_loss"] == -0.0031 and steps[0]["actor/lr"] == 1e-6
    assert steps[2]["timing_s/gen"] == 1.0 and steps[2]["timing_s/update_weights"] == 0.25   # np.float64(...) and tensor(...)
    split = V.verl_split(steps[1:])
    assert split == pytest.approx({"generation": 1.125, "sync": 0.18, "learner_and_rest": 2.125 - 1.125 - 0.18})


def test_file_logger_lines_come_first_and_skip_validation():
    text = "\n".join(json.dumps({"step": i, "data": {"timing_s/step": 2.0 + i, "timing_s/gen": 1.0, "timing_s/update_weights": 0.1}}) for i in (1, 2))
    text += "\n" + json.dumps({"step": 0, "data": {"val-core/acc": 0.5}}) + '\n{"step": 3, "data": {"timing_s/st'   # validation; a cut line
    steps = V.parse_jsonl(text)
    assert [s["timing_s/step"] for s in steps] == [3.0, 4.0]


def _plan(backend, tmp_path, shape=BENCH, flash_attn=True):
    return V.verl_plan(backend, shape, tmp_path / "model", tmp_path, E.prompts(E.MODEL, shape, 16), E.toy_reward, "0,1", flash_attn)


def _over(plan):
    return dict(o.lstrip("+").split("=", 1) for o in plan["cmd"][3:])


def test_overrides_name_the_bench_shape(tmp_path):
    P, G = BENCH["prompts"], BENCH["G"]
    for backend, (trainer_gpus, rollout_gpus) in {"hybrid": (1, 0), "hybrid-2gpu": (2, 0), "separate-async": (1, 1), "one-step-off": (1, 1)}.items():
        plan = _plan(backend, tmp_path)
        o = _over(plan)
        assert plan["cmd"][1:3] == ["-m", V.BACKENDS[backend]["module"]]
        assert (o["data.train_batch_size"], o["actor_rollout_ref.rollout.n"], o["actor_rollout_ref.actor.ppo_mini_batch_size"]) == (str(P), str(G), str(P))
        assert (o["data.max_prompt_length"], o["data.max_response_length"]) == (str(BENCH["prompt_len"] + 8), str(BENCH["gen"]))
        assert o["trainer.total_training_steps"] == str(BENCH["warmup"] + BENCH["steps"]) and o["trainer.n_gpus_per_node"] == str(trainer_gpus)
        assert o["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1" and o["actor_rollout_ref.rollout.name"] == "vllm"
        assert o["algorithm.adv_estimator"] == "grpo" and o["actor_rollout_ref.actor.use_kl_loss"] == "False" and o["algorithm.use_kl_in_reward"] == "False"
        assert o["reward.custom_reward_function.path"] == str(tmp_path / "verl_reward.py") and o["trainer.logger"] == "[console,file]"
        assert plan["env"]["CUDA_VISIBLE_DEVICES"] == ",".join("01"[:trainer_gpus + rollout_gpus])
        if rollout_gpus:   # the split modes: the actor's GPU and the rollout's, weights over NCCL
            assert o["actor_rollout_ref.hybrid_engine"] == "False" and o["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "nccl"
            gpus_key = "actor_rollout_ref.rollout.n_gpus_per_node" if backend == "separate-async" else "rollout.n_gpus_per_node"
            assert o[gpus_key] == "1" and o["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.85"
        else: assert "actor_rollout_ref.hybrid_engine" not in o and o["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.3"
    assert _over(_plan("separate-async", tmp_path))["trainer.v1.trainer_mode"] == "separate_async"
    assert _over(_plan("hybrid", tmp_path))["trainer.v1.trainer_mode"] == "sync"
    no_fa = _over(_plan("hybrid", tmp_path, flash_attn=False))
    assert no_fa["actor_rollout_ref.model.use_remove_padding"] == "False" and no_fa["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"


def test_files_hold_our_prompts_and_the_toy_reward(tmp_path):
    plan = _plan("hybrid", tmp_path)
    V.write_files(plan)
    import pyarrow.parquet as pq
    rows = pq.read_table(tmp_path / "verl_prompts.parquet").to_pylist()
    assert [r["prompt"][0]["content"] for r in rows] == E.prompts(E.MODEL, BENCH, 16)   # the same prompts as TRL's
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["reward_model"]["ground_truth"] == "0" and rows[0]["data_source"]
    spec = importlib.util.spec_from_file_location("verl_reward", tmp_path / "verl_reward.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    for text in ("t2 t4 t5", "t7", "", "t10 junk t12"):
        assert mod.compute_score("grpo_nb_bench", text, "0", {}) == E.toy_reward(text)


def test_trl_is_hidden_from_verls_processes(tmp_path):
    "verl 0.9.1 imports TRL's value-head class whenever TRL is importable; its run hides TRL (here: a stand-in `trl` package) from every process."
    (tmp_path / "pkgs" / "trl").mkdir(parents=True); (tmp_path / "pkgs" / "trl" / "__init__.py").write_text("")
    plan = V.verl_plan("hybrid", BENCH, tmp_path / "model", tmp_path, ["t1"], E.toy_reward, hide_trl=True, pythonpath=str(tmp_path / "pkgs"))
    V.write_files(plan)
    code = "import importlib.util\ntry: print(importlib.util.find_spec('trl'))\nexcept ModuleNotFoundError: print('hidden')\nimport json; print(json.__name__)"
    seen = lambda env: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout.split()
    assert seen({"PYTHONPATH": str(tmp_path / "pkgs")})[0] != "hidden"   # the stand-in is importable...
    assert seen({"PYTHONPATH": plan["env"]["PYTHONPATH"]}) == ["hidden", "json"]   # ...and hidden, everything else as it was
    assert plan["env"]["PYTHONPATH"].split(":")[1] == str(tmp_path / "pkgs")


def _script(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "e2e_vs_trl.py"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_dry_run_prints_the_command_and_files():
    r = _script("--peers", "verl:hybrid,verl:separate-async", "--shapes", "bench,long", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("-m verl.trainer.main_ppo") == 4 and r.stdout.count("def compute_score(") == 4
    assert "data.max_response_length=1024" in r.stdout and "trainer.v1.trainer_mode=separate_async" in r.stdout
    for flag in (f"data.train_batch_size={BENCH['prompts']}", f"actor_rollout_ref.rollout.n={BENCH['G']}", f"data.max_prompt_length={BENCH['prompt_len'] + 8}",
                 f"data.max_response_length={BENCH['gen']}", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                 "actor_rollout_ref.rollout.n_gpus_per_node=1", "algorithm.adv_estimator=grpo"):
        assert f" {flag} " in r.stdout, flag
    assert "CUDA_VISIBLE_DEVICES=0 VERL_FILE_LOGGER_PATH=" in r.stdout and '"ground_truth": "0"' in r.stdout and "class _HideTRL" in r.stdout
    r = _script("--peers", "verl:nope", "--dry-run")
    assert r.returncode != 0 and "verl:hybrid" in r.stderr and "unknown runs" in r.stderr


def test_a_run_that_cannot_start_says_why_and_starts_nothing(tmp_path):
    assert V.vllm_problem("0.26.0") is None and V.vllm_problem("0.18.0") is None
    assert "older than 0.18.0" in V.vllm_problem("0.17.1") and "not installed" in V.vllm_problem(None)
    if importlib.util.find_spec("verl") is not None: pytest.skip("verl is installed here")
    rec = V.run_verl("hybrid", BENCH, tmp_path / "model", tmp_path, ["t1 t2"], E.toy_reward, 60, E.MIN_TIMED, {"CUDA_VISIBLE_DEVICES": "0"})
    assert rec["error"].startswith("not started:") and "pip install" in rec["error"] and "verl==0.9.1" in rec["error"] and rec["step_s_all"] == []
    assert not list(tmp_path.iterdir())   # no files, no process
    rec = V.run_verl("separate-async", BENCH, tmp_path, tmp_path, ["t1"], E.toy_reward, 60, E.MIN_TIMED, {"CUDA_VISIBLE_DEVICES": "0"})
    assert "cupy-cuda13x" in rec["error"]


def test_record_keys_of_a_cut_and_a_failed_run(tmp_path):
    plan = _plan("hybrid", tmp_path)
    steps = [{"timing_s/step": 2.0, "timing_s/gen": 1.0, "timing_s/update_weights": 0.2}] * 11
    cut = V.verl_fields(steps, 2, 12, 8, {0: 4096, 1: 100}, plan, "timeout", 300.0, "tail")
    assert "after 11 of 12 steps" in cut["stopped"] and "error" not in cut and cut["peak_gib_per_gpu"] == [4.0] and cut["peak_gib"] == 4.0
    assert cut["split_s"] == pytest.approx({"generation": 1.0, "sync": 0.2, "learner_and_rest": 0.8}) and cut["timing_s"]["update_weights"] == 0.2
    failed = V.verl_fields(steps[:3], 2, 12, 8, {}, plan, 1, 90.0, "RuntimeError: boom")
    assert failed["error"].startswith("verl exited 1 after 3 of 12 steps") and failed["error"].endswith("RuntimeError: boom")
    assert "CUDA_VISIBLE_DEVICES=0" in failed["command"] and "-m verl.trainer.main_ppo" in failed["command"]


def _run(name, device, mean=None, error=None, **extra):
    side, *rest = name.split(":")
    r = {"run": name, "side": side, "shape": rest[-1], "device": device, "config": BENCH, "step_s_all": [mean or 1.0] * 10, **extra}
    if side != "ours": r["peer"] = side
    if error: r["error"] = error
    else: r["stats"] = {"mean": mean, "median": mean, "p90": mean}
    return r


def test_merge_pairs_each_peer_with_ours(tmp_path):
    H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    for r in (_run("ours:colocated:sync:bench", H200, 2.0, command="grpo_nb train default"), _run("trl:vllm-colocate:bench", H200, 3.0, version="1.16.0"),
              _run("verl:hybrid:bench", H200, 2.5, version="0.9.1", split_s={"generation": 1.5, "sync": 0.2, "learner_and_rest": 0.8}, timing_s={"gen": 1.5}),
              _run("ours:split:one-step-off:bench", H200, 1.5), _run("verl:separate-async:bench", H100, 1.0),
              _run("verl:one-step-off:bench", H200, error="verl exited 1 after 0 of 12 steps: ImportError: cupy")):
        (tmp_path / f"run_{r['run'].replace(':', '_')}.json").write_text(json.dumps(r))
    recs = E.merge(tmp_path)["records"]
    assert all(r["peer"] in ("trl", "verl") and r["shape"] in ("bench", "long", "wide") for r in recs)   # TRL's unmeasured GPU shapes are listed too
    verl = {(r["layout"], r["ours_mode"], r["verl_backend"]): r for r in recs if r["peer"] == "verl"}
    assert set(verl) == {("colocated", "sync", "hybrid"), ("split", "one-step-off", "separate-async"), ("split", "one-step-off", "one-step-off")}
    h = verl[("colocated", "sync", "hybrid")]
    assert h["speedup_mean"] == 1.25 and h["verl_version"] == "0.9.1" and h["verl_split_s"]["sync"] == 0.2 and h["target_speedup"] is None
    assert "target_met" not in h and h["ours_command"] == "grpo_nb train default" and "trl_step_mean_s" not in h
    other_gpu = verl[("split", "one-step-off", "separate-async")]   # verl on H100, ours on H200: no speed-up
    assert "speedup_mean" not in other_gpu and "no speed-up across GPU models" in other_gpu["note"] and other_gpu["ours_step_mean_s"] == 1.5
    failed = verl[("split", "one-step-off", "one-step-off")]   # verl failed: its error, our numbers kept
    assert "cupy" in failed["verl_error"] and failed["ours_step_mean_s"] == 1.5 and "speedup_mean" not in failed
    trl = next(r for r in recs if r["peer"] == "trl" and r["trl_backend"] == "vllm-colocate")
    assert trl["speedup_mean"] == 1.5 and trl["target_met"] and trl["trl_version"] == "1.16.0"


def test_committed_records_name_their_peer_and_shape():
    recs = json.loads((ROOT / "bench" / "results" / "e2e_vs_trl.json").read_text())["records"]
    assert recs and all(r["peer"] in ("trl", "verl") and r["shape"] in E.SHAPES and r.get(f"{r['peer']}_backend") for r in recs)


def test_verl_config_composes():
    "Where hydra and verl are installed: every override is a key of verl's own config (its hydra composition, on CPU)."
    spec = importlib.util.find_spec("verl")
    if spec is None or importlib.util.find_spec("hydra") is None: pytest.skip("verl and hydra-core are not installed here")
    from hydra import compose, initialize_config_dir
    pkg = Path(spec.submodule_search_locations[0])
    for backend in V.BACKENDS:
        over = _plan(backend, Path("/tmp/x"))["cmd"][3:]
        cdir, name = pkg / "trainer" / "config", "ppo_trainer"
        if backend == "one-step-off":   # composed here from its directory; the command names the package instead
            over = [o for o in over if not o.startswith("hydra.")] + [f"hydra.searchpath=[file://{cdir}]"]
            cdir, name = pkg / "experimental" / "one_step_off_policy" / "config", "one_step_off_ppo_trainer"
        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            cfg = compose(config_name=name, overrides=over)
        assert cfg.data.train_batch_size == BENCH["prompts"] and cfg.actor_rollout_ref.rollout.n == BENCH["G"]


def test_each_trainer_trains_a_step_in_one_micro_batch():
    for name, shape in E.SHAPES.items():
        need = shape["prompts"] * shape["G"] * (shape["prompt_len"] + 8 + shape["gen"])   # every sequence at its longest
        assert need <= E.step_tokens(shape) < need + 1024 and E.step_tokens(shape) % 1024 == 0
        over = E.ours_overrides("colocated", "sync", shape, Path("m"), Path("d.jsonl"), Path("t"), "cuda")
        assert f"--learner.pack_length={E.step_tokens(shape)}" in over   # TRL's side: per_device_train_batch_size = the step's sequences
        assert E.trl_args("vllm-colocate", shape, Path("t"), "cuda")["per_device_train_batch_size"] == shape["prompts"] * shape["G"]


def test_merge_names_older_prompts_and_cold_starts(tmp_path):
    H = "NVIDIA H100 80GB HBM3"
    runs = (_run("ours:colocated:sync:bench", H, 2.0, compile_caches="fresh", first_step_s=100.0),
            _run("trl:vllm-colocate:bench", H, 2.5, first_step_s=70.0),   # no key: it shared the caches of the runs before it
            _run("ours:split:sync:long", H, 5.0, prompt_note="words read as unknown pieces"), _run("trl:vllm-server:long", H, 6.0))
    for r in runs: (tmp_path / f"run_{r['run'].replace(':', '_')}.json").write_text(json.dumps(r))
    recs = {(r["layout"], r["shape"], r["ours_mode"], r.get("trl_backend")): r for r in E.merge(tmp_path)["records"]}
    c = recs[("colocated", "bench", "sync", "vllm-colocate")]
    assert (c["ours_cold_start"], c["trl_cold_start"], c["ours_first_step_s"], c["trl_first_step_s"]) == (True, False, 100.0, 70.0)
    assert (c["ours_first_step_from"], c["trl_first_step_from"]) == ("process start", "its imports")   # a TRL run without the key: the older count
    assert "prompt_note" not in c
    s = recs[("split", "long", "sync", "vllm-server")]
    assert s["prompt_note"].startswith("ours measured with shorter prompts") and s["speedup_mean"] == pytest.approx(1.2)


def test_merge_keeps_earlier_pairs_beside_the_newest(tmp_path):
    H, H2 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    newest = (_run("ours:colocated:sync:bench", H, 2.0), _run("trl:vllm-colocate:bench", H, 2.2))
    older = {"a": (_run("ours:colocated:sync:bench", H, 2.0), _run("trl:vllm-colocate:bench", H, 1.8)),
             "b": (_run("ours:colocated:sync:bench", H, 2.0), _run("trl:vllm-colocate:bench", H2, 1.0))}   # two GPU models: not a pair
    for d, rs in [(tmp_path, newest)] + [(tmp_path / "earlier" / k, v) for k, v in older.items()]:
        d.mkdir(parents=True, exist_ok=True)
        for r in rs: (d / f"run_{r['run'].replace(':', '_')}.json").write_text(json.dumps(r))
    rec = next(r for r in E.merge(tmp_path)["records"] if r["peer"] == "trl" and r["trl_backend"] == "vllm-colocate" and r["shape"] == "bench")
    assert rec["speedup_mean"] == pytest.approx(1.1) and [e["from"] for e in rec["earlier"]] == ["a"]
    assert rec["earlier"][0]["speedup_mean"] == pytest.approx(0.9)


def test_verl_starts_its_own_ray_instance():
    "verl's bare ray.init() would join the last cluster started on the host (a run of ours beside it); RAY_ADDRESS=local keeps them apart."
    assert all(_plan(b, Path("/tmp/x"))["env"]["RAY_ADDRESS"] == "local" for b in V.BACKENDS)


def test_the_split_mode_runs_past_verls_logger_call_with_flush(tmp_path):
    "verl 0.9.1's separate-async set-up logs with `flush=True`, a TypeError in the standard library; its run's sitecustomize drops the keyword."
    plan = V.verl_plan("separate-async", BENCH, tmp_path / "model", tmp_path, ["t1"], E.toy_reward)
    V.write_files(plan)
    code = "import logging; logging.getLogger('x').warning('ok %s', 1, flush=True); print('ran')"
    run = lambda env: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "TypeError" in run({}).stderr   # what verl's call does in a plain interpreter
    r = run({"PYTHONPATH": plan["env"]["PYTHONPATH"]})
    assert r.stdout.split() == ["ran"] and "ok 1" in r.stderr
    assert "verl_site" not in V.verl_plan("hybrid", BENCH, tmp_path / "m", tmp_path, ["t1"], E.toy_reward)["env"].get("PYTHONPATH", "")
