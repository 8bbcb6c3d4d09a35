"""What a process pays before it does anything: the driver of every run imports the trainer, and `grpo_nb plan` or
`--help` import the CLI. Neither imports torch's compiler (`torch._dynamo`); a learner that compiles
its layers imports it then, and keeps attention out of the compiled graphs."""
import subprocess, sys
import torch


def test_the_driver_and_the_cli_import_no_compiler():
    code = "import sys, grpo_nb.trainer, grpo_nb.cli; print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout[-2000:] + out.stderr[-2000:]


def test_compile_layers_keeps_attention_out_of_the_graphs(tiny_model):
    from transformers import AutoModelForCausalLM
    from grpo_nb import learner
    policy = AutoModelForCausalLM.from_pretrained(tiny_model(), torch_dtype=torch.float32)
    assert learner.compile_layers(policy, zero_stage=0) == policy.config.num_hidden_layers
    wrapped = learner._attend_within
    assert wrapped._out_of_graphs and learner.compile_layers(policy, zero_stage=0) and learner._attend_within is wrapped   # once
    q = torch.randn(1, 2, 5, 4)   # [1, heads, L, d]; two packed sequences of 2 and 3 tokens, the CPU's per-sequence path
    out = wrapped(None, q, q, q, torch.tensor([0, 2, 5]), 3, 0.5)
    assert out.shape == (1, 5, 2, 4)


def test_the_job_scripts_python_steps_import_no_torch(tmp_path):
    """grpo.sbatch reads the config (`job_env_cli`) and waits for Ray (`grpo_nb.slurm`) in Python before the trainer starts,
    and `grpo_nb plan`, `config` and `sbatch` only read configs: none imports torch, which takes seconds on a warm
    local disk and can take minutes on a cluster's shared filesystem."""
    code = ("import sys, grpo_nb.preflight, grpo_nb.slurm, grpo_nb.cli, grpo_nb.config\n"
            "from grpo_nb.preflight import job_env_cli\n"
            f"rc = job_env_cli(['demo', '--logging.output_dir={tmp_path}/run'])\n"
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "0 False", out.stdout[-2000:] + out.stderr[-2000:]
