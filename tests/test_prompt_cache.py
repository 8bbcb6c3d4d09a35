"""A start of `grpo_nb train` that has seen the same data and model reads its prompts' token ids from the cache and
imports no tokenizer (no transformers at all in the driver), and tokenizes again when the data change; a start that
tokenizes imports the tokenizer only once Ray is up, not in the launch before it."""
import json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch(cache:Path, out:Path, *extra:str) -> dict:
    "One launch of `grpo_nb train demo`, stopped where Ray would start (bench/launch_profile.py's child): what it reports."
    env = {**os.environ, "GRPO_NB_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "bench/launch_profile.py"), "--child", "--", "demo", f"--logging.output_dir={out}",
                        "--checkpoint.resume=none", *extra], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])


def test_a_second_start_reads_the_tokens_and_imports_no_tokenizer(tmp_path):
    from grpo_nb.tiny import default_cache_dir, tiny_model_dir
    tiny_model_dir("tiny-arith")   # built once, shared: the test's cache links to it
    cache = tmp_path / "cache"; cache.mkdir()
    (cache / "tiny").symlink_to(default_cache_dir() / "tiny", target_is_directory=True)
    first = launch(cache, tmp_path / "a")
    again = launch(cache, tmp_path / "b")
    assert (first["prompts_cached"], first["transformers_imported"], first["transformers_before_ray"]) == (False, True, False)
    assert (again["prompts_cached"], again["transformers_imported"]) == (True, False)
    other = launch(cache, tmp_path / "c", "--data.max_prompt_tokens=20")   # another setting the ids depend on: tokenized again
    assert (other["prompts_cached"], other["transformers_imported"]) == (False, True)
    assert len(list((cache / "prompts").glob("*.json"))) == 4   # training and held-out prompts, two settings
