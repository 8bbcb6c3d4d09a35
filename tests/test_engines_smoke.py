"""Smoke tests: the real engines run on this CPU machine. No mocks.

(a) a 2-node Ray cluster with logical GPUs places a STRICT_SPREAD group, one bundle a node;
(b) a real vLLM engine samples from a tiny local model with the tokenizer built here, and its log-probs
    match a transformers forward pass on the same weights.
(DeepSpeed ZeRO-3 over gloo runs through the real learner in tests/test_learner.py.)
Engines that take over process state (vLLM) run in spawned processes (`grpo_nb.tiny.spawn_call`),
so nothing is left running in the pytest process, and they are killed if a test fails.
"""
import math, os, shutil, tempfile
from pathlib import Path
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from grpo_nb.tiny import make_arithmetic, spawn_call, tiny_model_dir, vllm_generate


def _processes_mentioning(text:str) -> list[int]:
    "PIDs whose command line contains `text` (to prove a shutdown left nothing behind)."
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid(): continue
        try: cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError: continue
        if text in cmd: pids.append(int(d.name))
    return pids


def _start_cluster(tmp:str, nodes:int, gpus:int, attempts:int=3):
    """A `ray.cluster_utils.Cluster` of `nodes` nodes with `gpus` logical GPUs each, object store capped at 80 MiB.
    Retried: on a loaded machine a raylet gives up after ~15 s waiting for its dashboard agent to start."""
    from ray.cluster_utils import Cluster
    args = dict(num_cpus=1, num_gpus=gpus, object_store_memory=80 << 20, include_log_monitor=False)
    for attempt in range(1, attempts + 1):
        cluster = Cluster(initialize_head=False)
        try:
            for i in range(nodes):
                cluster.add_node(**args, **(dict(temp_dir=tmp, include_dashboard=False) if i == 0 else {}))
            return cluster
        except Exception:
            cluster.shutdown()
            if attempt == attempts: raise


@pytest.mark.timeout(400)
@pytest.mark.slow  # CI budget: the real multi-node cluster of tests/test_placement.py covers it
def test_ray_two_nodes_strict_spread_with_logical_gpus():
    ray = pytest.importorskip("ray")
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=1, num_gpus=2)
    class Probe:
        def where(self):
            return {"node": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must stay under 107 characters
    cluster = None
    try:
        cluster = _start_cluster(tmp, nodes=2, gpus=2)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="warning")
        assert ray.cluster_resources().get("GPU") == 4 and len(ray.nodes()) == 2
        pg = placement_group([{"CPU": 1, "GPU": 2}] * 2, strategy="STRICT_SPREAD")
        assert pg.wait(timeout_seconds=60), "a STRICT_SPREAD group of 2 bundles must fit on 2 nodes"
        probes = [Probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
                  for i in range(2)]
        seen = ray.get([p.where.remote() for p in probes], timeout=120)
        assert len({s["node"] for s in seen}) == 2, seen                        # one bundle a node
        for s in seen:
            assert len(s["gpu_ids"]) == 2 and set(s["gpu_ids"]) <= {"0", "1"}, s  # a node's own 2 logical GPUs
            assert s["cuda_visible_devices"] == ",".join(s["gpu_ids"]), s       # what torch would see there
        too_wide = placement_group([{"GPU": 1}] * 3, strategy="STRICT_SPREAD")  # 3 bundles, 2 nodes: never placed
        assert not too_wide.wait(timeout_seconds=2)
        remove_placement_group(too_wide); remove_placement_group(pg)
    finally:
        ray.shutdown()
        if cluster is not None: cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    assert _processes_mentioning(tmp) == [], "Ray processes outlived cluster.shutdown()"


@pytest.mark.timeout(300)
@pytest.mark.slow  # CI budget: tests/test_weight_sync_vllm.py checks vLLM log-probs against transformers too
def test_vllm_engine_logprobs_match_transformers():
    pytest.importorskip("vllm")
    model_dir = tiny_model_dir("tiny-arith")
    prompts = ["12+7=", "3+4=", "user: hi\nassistant: "]
    out, = spawn_call([(vllm_generate, dict(model_dir=model_dir, prompts=prompts, n=2, max_tokens=8, temperature=1.0, seed=0))],
                      timeout=240)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    worst, sampled = 0.0, 0
    for prompt, o in zip(prompts, out):
        assert o["prompt_ids"] == tok(prompt).input_ids                      # vLLM used the tokenizer built here
        assert len(o["samples"]) == 2
        for s in o["samples"]:
            ids, lps = s["token_ids"], s["logprobs"]
            assert 0 < len(ids) == len(lps) <= 8 and all(0 <= i < len(tok) for i in ids)
            assert s["text"] == tok.decode(ids, skip_special_tokens=True)
            full = torch.tensor([o["prompt_ids"] + ids])                     # 1, T
            with torch.no_grad(): logits = model(full).logits[0].float()    # T, V
            P = len(o["prompt_ids"])
            ref = torch.log_softmax(logits[P - 1:-1], -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
            worst = max(worst, (ref - torch.tensor(lps)).abs().max().item()); sampled += len(ids)
    assert worst < 1e-4, f"vLLM vs transformers log-probs differ by {worst:.2e} over {sampled} tokens"
