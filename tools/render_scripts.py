"""Writes the generated shell scripts into sbatch/ from the library (the notebooks own the templates).

`make export` runs it after nbdev_export; `make test` checks that it changes nothing. Each module that
generates scripts exposes `render_scripts(out_dir) -> list[Path]`.
"""
import importlib, pathlib, sys

MODULES = ["grpo_nb.slurm", "grpo_nb.ddp", "grpo_nb.reward_model", "grpo_nb.self_correction"]

def main(out_dir="sbatch"):
    out = pathlib.Path(out_dir); out.mkdir(exist_ok=True)
    for name in MODULES:
        try: mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name: continue  # that notebook does not exist yet
            raise
        if hasattr(mod, "render_scripts"): mod.render_scripts(out)

if __name__ == "__main__": main(*sys.argv[1:])
