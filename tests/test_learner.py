"""The learner group on CPU: two DeepSpeed ZeRO-3 ranks in Ray actors over gloo, training a tiny Qwen2.

One Ray cluster serves the module. The main test trains N steps (saving at step K and N), kills the
actors, corrupts the newest checkpoint and leaves a partial one beside it, then resumes in new actors:
the broken checkpoints are skipped with a warning, the step-K one is loaded, and steps K+1…N reproduce
the first run bit for bit (losses, every rank's parameters, optimizer state, schedule and RNG state).
Its first step (7 sequences: 4 on one rank, 3 on the other) is checked against a single-process plain-torch
computation of the same loss (the global token denominator × W under DeepSpeed's averaging), and the exported HF directory against the learners.
"""
import importlib.util, json, logging, shutil, tempfile, time
from pathlib import Path
import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_nb.actors import local_ray_node
from grpo_nb.config import LearnerConfig
from grpo_nb.checkpoint import CheckpointError, checkpoint_files, commit_checkpoint, file_digest, latest_checkpoint, verify_checkpoint
from grpo_nb.learner import (LearnerSpec, PolicyLogProbs, TrainBatch, create_learner_group, make_micro_batch, micro_batch_loss,
                             pack_sequences, shard_batch, step_counts)
from grpo_nb.loss import loss_kwargs

N, K = 4, 2  # steps of the first run; the checkpoint resumed from


def tiny_dir(tmp:Path) -> str:
    "The project's tiny policy (tied embeddings, 2 KV heads), or an equivalent built here."
    try:
        from grpo_nb.tiny import tiny_model_dir
        return str(tiny_model_dir("tiny-arith"))
    except ImportError:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
        Qwen2ForCausalLM(cfg).float().save_pretrained(tmp / "tiny")
        return str(tmp / "tiny")


def batch_for(step:int, n:int) -> TrainBatch:
    "A deterministic batch: prompts of 2-5 tokens, completions of 0-12, engine log-probs a little off the learner's."
    g = torch.Generator().manual_seed(1000 + step)
    ids, plen, roll = [], [], []
    for _ in range(n):
        p, c = int(torch.randint(2, 6, (1,), generator=g)), int(torch.randint(0, 13, (1,), generator=g))
        ids.append([1] + torch.randint(4, 60, (p + c - 1,), generator=g).tolist()); plen.append(p)
        roll.append((-torch.rand(c, generator=g) * 6).tolist())
    return TrainBatch(ids, plen, (torch.randn(n, generator=g)).tolist(), rollout_logprobs=roll)


LCFG = LearnerConfig(learning_rate=3e-3, zero_stage=3, micro_batch_size=2, gradient_accumulation_steps=2, pack_length=24,
                     kl_beta=0.05, ref_policy="gpu", entropy_coef=0.01, max_grad_norm=1.0, seed=7)


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    if importlib.util.find_spec("deepspeed") is None: pytest.skip("needs deepspeed")   # looked up, not imported: only the actors import it
    tmp = Path(tempfile.mkdtemp(prefix="learner"))
    from ray._private.utils import get_ray_address_file
    for attempt in range(3):
        try:
            # Ray records the newest cluster's address in /tmp/ray whatever temp_dir says; another test's Ray shutting down
            # may have removed that directory, and add_node then fails writing the file (seen once in CI).
            Path(get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)
            c = local_ray_node(4, object_store_bytes=150 * 2**20, temp_dir=tmp / f"ray{attempt}")   # agent ports chosen, longer agent wait
            ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
            break
        except Exception:
            ray.shutdown()
            if attempt == 2: raise
            time.sleep(3)
    try: yield {"tmp": tmp, "model": tiny_dir(tmp)}
    finally:
        ray.shutdown(); c.shutdown(); shutil.rmtree(tmp, ignore_errors=True)


def make_group(model:str):
    spec = LearnerSpec(model=model, learner=LCFG, device="cpu", temperature=0.9, norm_len=12, seed=LCFG.seed,
                       ds_overrides={"zero_optimization": {"stage3_param_persistence_threshold": 0}})  # partition every tensor
    return create_learner_group(spec, 2, actor_options=[{"num_cpus": 1}] * 2, timeout_s=600)


def reference_step1(model:str, batch:TrainBatch) -> dict:
    "Loss and gradient norm of step 1 in one process, plain torch, one micro-batch holding every sequence."
    from transformers import AutoModelForCausalLM
    m = PolicyLogProbs(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32))
    mb = make_micro_batch(batch, list(range(len(batch))))
    mb.ref_logp = None
    lp, ent = m(mb.input_ids, mb.position_ids, mb.score_idx, mb.targets, temperature=0.9, with_entropy=True)
    mb.ref_logp = lp.detach()  # the reference policy is the initial policy
    loss, _ = micro_batch_loss(lp, ent, mb, step_counts([mb]), loss_kwargs(LCFG), norm_len=12)
    loss.backward()
    return {"loss": float(loss.detach()), "grad_norm": float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters())))}


def flip_byte(path:Path, at:int=100):
    raw = bytearray(path.read_bytes()); raw[at] ^= 0xFF; path.write_bytes(bytes(raw))


def test_zero3_kill_resume_is_bit_exact(cluster, caplog):
    model, ck = cluster["model"], cluster["tmp"] / "ckpt"
    sizes = {s: 7 if s == 1 else 16 for s in range(1, N + 1)}  # step 1: one optimizer step over an uneven 4/3 split; later: two, with a π_old pass
    # ---- run A: N uninterrupted steps, checkpoints at K and N --------------------------------------
    g = make_group(model)
    assert [i["attention"] for i in g.info] == ["sdpa"] * 2 and g.info[0]["zero_stage"] == 3
    assert all(i["gc_frozen"] > 10_000 for i in g.info)   # each learner's process froze its heap once built (Ray actors)
    first = {}
    for s in range(1, N + 1):
        first[s] = g.step(batch_for(s, sizes[s]))
        if s in (K, N): g.save(ck, data_state={"next_prompt": 16 * s}, keep_last=3)
    digests = g.digests()
    exported = g.export(cluster["tmp"] / "export")
    probe = [[1, 5, 9, 13, 17, 21], [1, 30, 31, 32]]
    learner_lp = ray_call_all(g, "ws_logprobs", probe, [2, 1])
    g.shutdown(kill=True)  # as a crash would: no clean exit
    # step 1 against one plain-torch process: global denominators × W under DeepSpeed's averaging
    ref = reference_step1(model, batch_for(1, 7))  # uneven shards compute what one process computes
    assert abs(first[1]["loss"] - ref["loss"]) < 1e-5 * max(1, abs(ref["loss"])), (first[1], ref)
    assert abs(first[1]["grad_norm"] - ref["grad_norm"]) < 1e-4 * ref["grad_norm"], (first[1], ref)
    assert first[1]["kl"] == 0.0 and first[N]["kl"] > 0 and first[N]["optimizer_steps"] == 2
    assert digests[0]["rng"] != digests[1]["rng"]  # ranks have their own generators
    saved = [json.loads((c / "trainer.json").read_text())["kernels"] for c in sorted(ck.glob("step_*"))]
    assert saved == ["torch", "torch"], saved  # the kernels each checkpoint was trained with: what a resume under `auto` must keep
    # the export is an ordinary HF directory computing what the learners computed
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    from grpo_nb.weight_sync import sequence_logprobs
    assert torch.allclose(torch.tensor(sum(sequence_logprobs(hf, probe, [2, 1]), [])), torch.tensor(sum(learner_lp, [])), atol=1e-5)
    # ---- break things: corrupt step N, leave a killed save and a manifest-less directory ------------
    good, newest = ck / f"step_{K:08d}", ck / f"step_{N:08d}"
    flip_byte(max((newest / "deepspeed").rglob("*optim_states.pt"), key=lambda p: p.stat().st_size))
    (ck / f".tmp-step_{N + 1:08d}-dead" / "deepspeed").mkdir(parents=True)
    shutil.copytree(good, ck / f"step_{N + 2:08d}"); (ck / f"step_{N + 2:08d}" / "COMPLETE").unlink()
    with caplog.at_level(logging.WARNING, logger="grpo_nb.learner"):
        assert latest_checkpoint(ck) == good
    assert "interrupted" in caplog.text and "SHA-256" in caplog.text
    # ---- run B: new actors, resume, finish --------------------------------------------------------
    g2 = make_group(model)
    try:
        with pytest.raises(CheckpointError, match="SHA-256"): g2.load(newest)
        meta = g2.resume(ck)
        assert meta["path"] == str(good) and meta["step"] == K and meta["data_state"] == {"next_prompt": 16 * K}
        second = {s: g2.step(batch_for(s, sizes[s])) for s in range(K + 1, N + 1)}
        for s in second:
            for key in ("loss", "pg_loss", "grad_norm", "kl", "entropy", "clip_frac", "lr", "ratio_max"):
                assert second[s][key] == first[s][key], (s, key, first[s][key], second[s][key])
        assert g2.digests() == digests  # parameters, optimizer, schedule, RNG of both ranks: bit for bit
    finally:
        g2.shutdown()


def ray_call_all(group, method, *args):
    "Call a method on every rank (ZeRO-3 gathers are collective); rank 0's result."
    from grpo_nb.rollout import gather, submit
    return gather([submit(a, method, *args) for a in group.actors])[0]


# ---- fast checks of the pure pieces -------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(50, 120))
def test_packing_keeps_every_sequence_once_within_the_limit(lengths, pack_length):
    packs = pack_sequences(lengths, pack_length)
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= pack_length for p in packs)
    assert sum(1 for p in packs if sum(lengths[i] for i in p) <= pack_length // 2) <= 1  # first-fit: at most one half-empty row


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=30), st.integers(1, 4))
def test_shards_cover_the_batch_with_balanced_counts(lengths, world):
    sh = shard_batch(lengths, world)
    assert sorted(i for s in sh for i in s) == list(range(len(lengths)))
    assert max(map(len, sh)) - min(map(len, sh)) <= 1


def test_micro_batch_scores_completion_tokens_only():
    b = TrainBatch([[1, 2, 3, 4], [1, 7, 8]], [3, 1], [0.5, -1.0], rollout_logprobs=[[-0.1], [-0.2, -0.3]])
    mb = make_micro_batch(b, [0, 1])
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert mb.targets_row().tolist() == [[-100, -100, 4, -100, 7, 8, -100]]
    assert mb.rollout_logp.tolist() == pytest.approx([-0.1, -0.2, -0.3]) and mb.advantages.tolist() == [0.5, -1.0, -1.0]


def test_partial_and_corrupted_checkpoints_are_never_loaded(tmp_path, caplog):
    def save(step, payload):
        t = tmp_path / f".tmp-{step}"; t.mkdir(); (t / "state.pt").write_bytes(payload)
        return commit_checkpoint(t, tmp_path / f"step_{step:08d}", {r: file_digest(t / r) for r in checkpoint_files(t)})
    a, b = save(1, b"x" * 64), save(2, b"y" * 64)
    assert latest_checkpoint(tmp_path) == b
    (b / "state.pt").write_bytes(b"y" * 63)                       # truncated
    with pytest.raises(CheckpointError, match="truncated"): verify_checkpoint(b)
    flip = tmp_path / "step_00000003"; shutil.copytree(a, flip); flip_byte(flip / "state.pt", 5)
    with caplog.at_level(logging.WARNING, logger="grpo_nb.learner"):
        assert latest_checkpoint(tmp_path) == a
    assert caplog.text.count("skipping checkpoint") == 2
