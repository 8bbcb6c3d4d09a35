"""Self-correction (#11c): five tiny models on CPU, each changes only when it should; Polyak in bounded chunks; placement; script."""
import copy, os, subprocess
from pathlib import Path
import pytest, torch

def test_each_model_changes_only_when_it_should():
    from grpo_nb.self_correction import SCConfig, train, polyak_update_
    snaps = {}
    def on_step(step, models):
        snaps[step] = {r: {k: v.detach().clone() for k, v in m.named_parameters()} for r, m in models.items()}
    cfg = SCConfig(steps=4, episodes=3, guidance_every=2, tau=0.25)
    res = train(cfg, on_step=on_step)
    d = res["digests"]
    ch = {r: [d[r][i] != d[r][i - 1] for i in range(1, 5)] for r in d}
    assert ch["policy"] == [True] * 4
    assert ch["critic"] == [True] * 4
    assert ch["reference"] == [False] * 4
    assert ch["guidance"] == [False, True, False, True]
    assert d["reference"][0] == d["policy"][0] and d["target_critic"][0] == d["critic"][0]   # copies at the start
    # the target moved by Polyak only: target_s = (1-τ)·target_{s-1} + τ·critic_s
    for s in (2, 3, 4):
        for k, t in snaps[s]["target_critic"].items():
            want = (1 - cfg.tau) * snaps[s - 1]["target_critic"][k] + cfg.tau * snaps[s]["critic"][k]
            torch.testing.assert_close(t, want, rtol=1e-5, atol=1e-6)
    assert all(m["guidance_updated"] == (m["step"] % 2 == 0) for m in res["metrics"])

def test_polyak_extra_memory_is_bounded_by_the_chunk():
    from grpo_nb.self_correction import polyak_update_
    torch.manual_seed(0)
    src, tgt = torch.nn.Linear(512, 256), torch.nn.Linear(512, 256)
    want = {k: 0.7 * v + 0.3 * dict(src.named_parameters())[k] for k, v in tgt.named_parameters()}
    chunk, moved = 4096, []
    def transfer(x, device, dtype):
        moved.append(x.numel()); return x.to(device=device, dtype=dtype).clone()   # a real copy, like a device move
    # every allocation made during the update, seen by the profiler
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        polyak_update_(tgt, src, tau=0.3, chunk=chunk, transfer=transfer)
    biggest = max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)
    assert 0 < biggest <= chunk * 4 + 512, biggest          # at most one fp32 chunk alive (allocator rounding aside)
    assert max(moved) == chunk and sum(moved) == 512 * 256 + 256
    for k, v in tgt.named_parameters(): torch.testing.assert_close(v, want[k])
    # the whole model at once would have needed a copy of every parameter
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof2:
        polyak_update_(copy.deepcopy(tgt), src, tau=0.3, chunk=10**9, transfer=transfer)
    assert max(e.cpu_memory_usage for e in prof2.events() if e.cpu_memory_usage > 0) >= 512 * 256 * 4

def test_placement_and_cli_errors():
    from grpo_nb.self_correction import resolve_placement, self_correction_cli, SEED_PLACEMENT
    assert resolve_placement(SEED_PLACEMENT, gpus=2)["target_critic"] == "cpu"
    with pytest.raises(ValueError, match="cuda:1 but 1 GPU"): resolve_placement(SEED_PLACEMENT, gpus=1)
    with pytest.raises(ValueError, match="unknown role"): resolve_placement({"*": "cpu", "values": "cpu"}, gpus=0)
    assert self_correction_cli(["--placement", '{"*": "cuda:7"}']) == 2

def test_launch_script(tmp_path):
    from grpo_nb.self_correction import render_scripts
    (p,) = render_scripts(tmp_path)
    r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "python -m grpo_nb.self_correction" in p.read_text() and os.access(p, os.X_OK)
    text = p.read_text()   # the walltime signal is trapped and passed on; a clean stop requeues the job, which resumes from its checkpoints
    assert "#SBATCH --signal=B:USR1@" in text and "trap 'on_stop USR1' USR1" in text and "run_and_requeue python -m grpo_nb.self_correction" in text
    assert '--checkpoint_dir="$OUT/checkpoints" --resume=auto' in text and "scontrol requeue" in text


# ---- the trainer at scale: data parallelism, checkpoints, the GPU benchmark's script ------------------------------------

def _dp_rank(rank:int, world:int, port:int, out:str):
    "One torchrun-like rank: the gradients from its half of fixed episodes (summed over the ranks), then a short run with checkpoints."
    import json, os, copy
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch, torch.distributed as dist
    from grpo_nb.self_correction import SCConfig, load_models, run_episodes, update, train
    from grpo_nb.tiny import make_arithmetic
    dist.init_process_group("gloo")
    cfg = SCConfig(episodes=6, micro_batch=2)
    torch.manual_seed(0)
    models, tok, _ = load_models(cfg)
    ep = run_episodes(models, tok, make_arithmetic(6, seed=0), 4, torch.Generator().manual_seed(0))
    half = type(ep)(*[getattr(ep, f)[rank::world] for f in ep.__dataclass_fields__])
    keep = {k: _KeepGrads(models[k]) for k in ("policy", "guidance", "critic")}
    update(models, keep, tok, half, 2, cfg, total=6)
    torch.save({k: o.grads for k, o in keep.items()}, f"{out}/grads{rank}.pt")
    res = train(SCConfig(steps=1, episodes=4, checkpoint_dir=f"{out}/ck"))
    (Path(out) / f"run{rank}.json").write_text(json.dumps({"digests": res["digests"], "metrics": res["metrics"]}))
    dist.destroy_process_group()

class _KeepGrads:
    def __init__(self, m): self.m, self.grads = m, None
    def zero_grad(self): self.m.zero_grad(set_to_none=True)
    def step(self): self.grads = {n: p.grad.clone() for n, p in self.m.named_parameters() if p.grad is not None}

def test_two_ranks_sum_to_one_batch_and_stay_in_step(tmp_path):
    import json
    import torch.multiprocessing as tmp_mp
    from grpo_nb.self_correction import SCConfig, load_models, run_episodes, update
    from grpo_nb.checkpoint import read_latest, verify_checkpoint
    from grpo_nb.actors import free_port
    from grpo_nb.tiny import make_arithmetic
    tmp_mp.spawn(_dp_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    # the single-process gradients on all six episodes
    cfg = SCConfig(episodes=6)
    torch.manual_seed(0)
    models, tok, _ = load_models(cfg)
    ep = run_episodes(models, tok, make_arithmetic(6, seed=0), 4, torch.Generator().manual_seed(0))
    keep = {k: _KeepGrads(models[k]) for k in ("policy", "guidance", "critic")}
    update(models, keep, tok, ep, 2, cfg)
    g0, g1 = (torch.load(tmp_path / f"grads{r}.pt") for r in (0, 1))
    for k, grads in keep.items():
        for n, g in grads.grads.items():   # after update's all_reduce every rank holds the gradient of the whole batch
            torch.testing.assert_close(g0[k][n], g, rtol=1e-4, atol=1e-6); torch.testing.assert_close(g1[k][n], g, rtol=1e-4, atol=1e-6)
    r0, r1 = (json.loads((tmp_path / f"run{r}.json").read_text()) for r in (0, 1))
    assert r0["digests"] == r1["digests"] and len(r0["digests"]["policy"]) == 2   # the ranks hold the same models after the step
    assert r0["metrics"] == [dict(m, step_s=r0["metrics"][i]["step_s"]) for i, m in enumerate(r1["metrics"])]
    assert read_latest(tmp_path / "ck") == 1
    man = verify_checkpoint(tmp_path / "ck" / "step_00000001")
    assert {"rng_rank0.pt", "rng_rank1.pt", "policy.pt", "optimizer_policy.pt", "state.json"} <= set(man["files"])

def test_resume_refuses_another_policy_and_a_fresh_start_over_checkpoints(tmp_path):
    from grpo_nb.config import ConfigError
    from grpo_nb.self_correction import SCConfig, train
    cfg = SCConfig(steps=1, episodes=2, checkpoint_dir=str(tmp_path))
    train(cfg, digests=False)
    with pytest.raises(ConfigError, match="starting policy"): train(SCConfig(steps=2, episodes=2, checkpoint_dir=str(tmp_path), policy="tiny-1kv-tied"), digests=False)
    with pytest.raises(ConfigError, match="--resume=auto"): train(SCConfig(steps=2, episodes=2, checkpoint_dir=str(tmp_path), resume="none"), digests=False)

def test_gradient_checkpointing_no_cache_and_offload_give_the_same_parameters():
    "One update of every role (guidance included) gives the same parameters with checkpointing, without the KV cache and with the optimizer offloaded (fp32 CPU masters)."
    from grpo_nb.self_correction import SCConfig, train
    base = train(SCConfig(steps=1, episodes=3, guidance_every=1))["digests"]
    assert train(SCConfig(steps=1, episodes=3, guidance_every=1, grad_ckpt=True, kv_cache=False, optimizer_offload=True))["digests"] == base

def test_gpu_memory_bench_script_runs_its_smoke_config(tmp_path):
    import json, sys
    out = tmp_path / "sc.json"
    r = subprocess.run([sys.executable, "bench/sc_memory_gpu.py", "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["steps"] == 3 and len(rec["step_s_all"]) == 2 and rec["step_s_p90"] >= rec["step_s_median"]

def test_own_problems_and_reward(tmp_path):
    import json
    from grpo_nb.config import ConfigError
    from grpo_nb.self_correction import SCConfig, load_sc_config, run_episodes, load_models, train
    f = tmp_path / "problems.jsonl"
    f.write_text("\n".join(json.dumps({"q": f"{i}+{i}=", "a": str(2 * i), "source": "mine"}) for i in range(3)))
    res = train(SCConfig(steps=2, episodes=2, data=str(f), prompt_key="q", answer_key="a", reward="math"), digests=False)
    assert [m["step"] for m in res["metrics"]] == [1, 2]                     # 4 episodes from 3 rows: cycled
    with pytest.raises(ConfigError, match="--prompt_key=<field>"): train(SCConfig(steps=1, episodes=2, data=str(f)), digests=False)
    with pytest.raises(ConfigError, match="--reward=math"): load_sc_config(None, ["--reward=nope"])


def test_sigusr1_checkpoints_exits_0_and_the_resumed_run_continues_exactly(tmp_path):
    """The walltime signal mid-run: a checkpoint of the step it was on, exit 0, metrics.jsonl; the resumed run ends where the
    uninterrupted one does. The resumed run also gets the walltime signal again and again once it has written its summary
    (after its last checkpoint), while it shuts down: exit 0, never death by SIGUSR1 (what a run of its own checked before)."""
    import json, signal, sys, time
    from grpo_nb.self_correction import SCConfig, train
    ck, out = tmp_path / "ck", tmp_path / "out"
    cmd = [sys.executable, "-m", "grpo_nb.self_correction", "--episodes=2", f"--checkpoint_dir={ck}", f"--out={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([*cmd, "--steps=1000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2):
            assert p.poll() is None and time.time() < deadline, "the run ended or stalled before two steps"
            time.sleep(0.1)
        p.send_signal(signal.SIGUSR1)
        log = p.communicate(timeout=120)[0]
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode == 0, log[-3000:]
    stopped = json.loads((out / "summary.json").read_text())
    k = stopped["last_step"]
    assert stopped["stopped_by"] == "SIGUSR1" and 2 <= k < 1000, (stopped["stopped_by"], k)
    assert (ck / "latest").read_text().split()[-1] == str(k)
    # the run that is never interrupted, as long as the resumed one: a run's steps do not depend on how many it is given (the
    # stopped run was given 1000, the resumed one k + 2), so it need not be long enough for a late signal on a busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as the runs (OMP_NUM_THREADS=1): a CPU's reductions round differently with another thread count
    try: ref = train(SCConfig(steps=k + 2, episodes=2))
    finally: torch.set_num_threads(threads)
    p = subprocess.Popen([*cmd, f"--steps={k + 2}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not _summary_of_a_resumed_run(out / "summary.json"):   # written after the last checkpoint
            assert p.poll() is None and time.time() < deadline, "the resumed run ended or stalled before its summary"
            time.sleep(0.02)
        while p.poll() is None:   # the signal again and again while it shuts down
            try: p.send_signal(signal.SIGUSR1)
            except ProcessLookupError: break
            time.sleep(0.002)
        log = p.communicate(timeout=60)[0]
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode == 0, (p.returncode, log[-2000:])
    resumed = json.loads((out / "summary.json").read_text())
    assert Path(resumed["resumed_from"]).name == f"step_{k:08d}" and resumed["stopped_by"] is None
    assert resumed["digests"] == {role: d[:k + 3] for role, d in ref["digests"].items()}   # every model, after every step
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == list(range(1, k + 3))


def _summary_of_a_resumed_run(path:Path) -> bool:
    "Whether `path` holds the summary of a run that resumed from a checkpoint (the stopped run's summary is there before it)."
    import json
    try: return bool(json.loads(path.read_text()).get("resumed_from"))
    except (OSError, ValueError): return False   # not there yet, or being written


# ---- the memory check before loading, the new options --------------------------------------------------------------------

def test_memory_check_refuses_before_loading_and_names_the_fix(tmp_path):
    "A plan over the host's memory is refused by the command line before any model is built (a 3B model would take minutes on this CPU)."
    import sys, time
    from grpo_nb.self_correction import SCConfig, sc_fit_error, load_sc_config
    from grpo_nb.memory import GiB
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "grpo_nb.self_correction", "--policy=random:Llama-3.2-3B", "--guidance=random:Llama-3.2-3B",
                        "--critic=random:Llama-3.2-1B", "--host_mem_gib=16", f"--out={tmp_path}"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "host needs" in r.stderr and "Fix:" in r.stderr and "--memory_check=false" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "summary.json").exists()
    # the GPUs: the seed's preset without the offloaded optimizer is over both 44.5 GiB GPUs; the fix named is the offload
    cfg = load_sc_config("seed004-score-2gpu", ["--policy=random:Llama-3.2-3B", "--guidance=random:Llama-3.2-3B", "--critic=random:Llama-3.2-1B",
                                                "--optimizer_offload=false"])
    gpus = {"cuda:0": int(44.53 * GiB), "cuda:1": int(44.53 * GiB)}
    e = sc_fit_error(cfg, gpus, 512 * GiB)
    assert e is not None and "cuda:0 needs" in str(e) and "cuda:1 needs" in str(e) and e.fix.startswith("--optimizer_offload=true"), e
    assert sc_fit_error(load_sc_config("seed004-score-2gpu", ["--policy=random:Llama-3.2-3B", "--guidance=random:Llama-3.2-3B",
                                                              "--critic=random:Llama-3.2-1B"]), gpus, 512 * GiB) is None
    # two ranks on the node need twice the host memory
    one = load_sc_config("seed004-score-2gpu", ["--policy=random:Llama-3.2-3B", "--guidance=random:Llama-3.2-3B", "--critic=random:Llama-3.2-1B"])
    assert sc_fit_error(one, gpus, 200 * GiB) is None and "(2 ranks)" in str(sc_fit_error(one, gpus, 200 * GiB, world=2, ranks_per_node=2))

def test_adamw_8bit_runs_where_bitsandbytes_is_installed_and_is_refused_where_not():
    import importlib.util
    from grpo_nb.config import ConfigError
    from grpo_nb.self_correction import SCConfig, load_sc_config, train, make_optimizers, load_models
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(ConfigError, match="pip install bitsandbytes"): load_sc_config(None, ["--optimizer=adamw-8bit"])
        return
    cfg = load_sc_config(None, ["--optimizer=adamw-8bit", "--steps=2", "--episodes=2", "--guidance_every=1"])
    res = train(cfg)
    assert all(d[2] != d[0] for r, d in res["digests"].items() if r in ("policy", "guidance", "critic"))   # every trained role moved
    models, _, _ = load_models(SCConfig(critic="tiny-arith"))
    opt = make_optimizers(models, cfg)["policy"]
    big = max(opt.params, key=lambda p: p.numel())
    big.grad = torch.ones_like(big)
    for p in opt.params:
        if p.grad is None: p.grad = torch.zeros_like(p)
    opt.step()
    assert opt.opt.state[big]["state1"].dtype == torch.uint8   # 8-bit moments

def test_value_function_is_its_own_model_placed_planned_and_checkpointed(tmp_path):
    "V(s): its own placement, memory row and optimizer; trained every step; saved, and a resumed run continues exactly."
    from grpo_nb.config import ConfigError
    from grpo_nb.self_correction import SCConfig, VALUE, train, five_model_memory, device_totals, SEED_PLACEMENT
    rows = five_model_memory(placement=SEED_PLACEMENT, value="Llama-3.2-1B")
    v = next(r for r in rows if r["role"] == VALUE)
    assert v["device"] == "cuda:1" and v["trained"] and v["resident"] > 0
    assert device_totals(rows)["cuda:1"] > device_totals(five_model_memory())["cuda:1"]   # the guidance's GPU carries it
    cfg = SCConfig(steps=2, episodes=2, guidance_every=1, value_model="tiny-1kv-tied", checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1)
    whole = train(SCConfig(**{**cfg.__dict__, "checkpoint_dir": "", "checkpoint_every": 0}))
    assert len(set(whole["digests"][VALUE])) == 3 and whole["params"][VALUE] > 0
    def stop_at_1(step, models):
        if step == 1: raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): train(cfg, on_step=stop_at_1)
    assert (tmp_path / "ck" / "step_00000001" / f"{VALUE}.pt").exists()
    resumed = train(cfg)
    assert resumed["digests"] == whole["digests"]
    with pytest.raises(ConfigError, match="without a value function"):   # a checkpoint of a run without V cannot seed one with it
        train(SCConfig(steps=1, episodes=2, checkpoint_dir=str(tmp_path / "ck0")), digests=False)
        train(SCConfig(steps=2, episodes=2, checkpoint_dir=str(tmp_path / "ck0"), value_model="tiny-1kv-tied"), digests=False)

def test_overlapped_updates_equal_the_sequential_order_and_are_refused_under_torchrun(monkeypatch):
    "overlap=threads: the same parameters bit for bit (offloaded optimizer, value function, full gradient flow on); refused with several ranks."
    from grpo_nb.config import ConfigError
    from grpo_nb.self_correction import SCConfig, train
    kw = dict(steps=2, episodes=3, guidance_every=1, value_model="tiny-1kv-tied", fullgrad_coef=0.5, optimizer_offload=True, micro_batch=2)
    assert train(SCConfig(**kw, overlap="threads"))["digests"] == train(SCConfig(**kw))["digests"]
    monkeypatch.setenv("WORLD_SIZE", "2"); monkeypatch.setenv("RANK", "0"); monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match="--overlap=none"): train(SCConfig(**kw, overlap="threads"))
