"""Every ZeRO stage and offload mode, one rank in this process: train, checkpoint, train, resume, train again.

The resumed step must reproduce the first one bit for bit, and every configuration must compute the same
gradient norm (the optimizer's partitioning changes where numbers live, not what they are). About two
minutes on two cores, so it runs only with GRPO_NB_SLOW_TESTS=1 (the two-rank ZeRO-3 test in
test_learner.py always runs).
"""
import os, tempfile, warnings
import pytest
import torch

pytestmark = pytest.mark.slow  # tests/conftest.py skips it unless GRPO_NB_SLOW_TESTS=1


def batch(step:int, n:int=8):
    from grpo_nb.learner import TrainBatch
    g = torch.Generator().manual_seed(step)
    ids = [[1] + torch.randint(4, 60, (int(torch.randint(4, 20, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]
    return TrainBatch(ids, [3] * n, torch.randn(n, generator=g).tolist())


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("deepspeed")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use `torch.distributed")
    from grpo_nb.tiny import tiny_model_dir
    return str(tiny_model_dir("tiny-untied"))


norms = {}

@pytest.mark.parametrize("zero,offload", [(0, "none"), (1, "none"), (2, "none"), (2, "optimizer"), (3, "optimizer"), (3, "all")])
def test_stage_resumes_exactly(model, zero, offload):
    from grpo_nb.config import LearnerConfig
    from grpo_nb.learner import LearnerSpec, create_learner_group
    L = LearnerConfig(learning_rate=1e-3, zero_stage=zero, offload=offload, micro_batch_size=2, pack_length=40,
                      lr_schedule="cosine", warmup_steps=2)
    g = create_learner_group(LearnerSpec(model=model, learner=L, device="cpu", total_optimizer_steps=40), 1, local=True)
    try:
        for s in range(2): g.step(batch(s))
        ck = tempfile.mkdtemp()
        g.save(ck); saved = g.digests()
        first = g.step(batch(2)); after = g.digests()
        assert g.resume(ck)["step"] == 2 and g.digests() == saved
        again = g.step(batch(2))
        assert (again["loss"], again["grad_norm"], again["lr"]) == (first["loss"], first["grad_norm"], first["lr"])
        assert g.digests() == after
        norms[(zero, offload)] = first["grad_norm"]
        assert all(abs(n - first["grad_norm"]) < 1e-5 * n for n in norms.values()), norms
    finally:
        g.shutdown()
