"""Self-correction (#11c): five tiny models on CPU, each changes only when it should; Polyak in bounded chunks; placement; script."""
import copy, os, subprocess
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
    with pytest.raises(ValueError, match="unknown role"): resolve_placement({"*": "cpu", "value": "cpu"}, gpus=0)
    assert self_correction_cli(["--placement", '{"*": "cuda:7"}']) == 2

def test_launch_script(tmp_path):
    from grpo_nb.self_correction import render_scripts
    (p,) = render_scripts(tmp_path)
    r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "python -m grpo_nb.self_correction" in p.read_text() and os.access(p, os.X_OK)
