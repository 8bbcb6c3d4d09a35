"""Re-execute notebooks whose committed outputs users read first (the README's index, the CLI page) and fail when
an output would change: a stale `--help` or an outdated example must not ship.

    python tools/check_outputs.py nbs/index.ipynb nbs/13_cli.ipynb nbs/guides/config_reference.ipynb

Each notebook is copied next to itself, executed like `tools/nbrun.sh` does (flagged cells skipped), cleaned like
`nbdev_clean`, and its code cells' outputs compared with the committed ones. Fix a failure with
`tools/nbrun.sh <notebook>` and commit the result.
"""
import json, pathlib, shutil, subprocess, sys, tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from exec_nb import main as execute


def outputs(path:pathlib.Path) -> list:
    nb = json.loads(path.read_text())
    return [(c["source"], c.get("outputs", [])) for c in nb["cells"] if c["cell_type"] == "code"]


def check(path:pathlib.Path) -> bool:
    fd, tmp = tempfile.mkstemp(prefix=".check-", suffix=".ipynb", dir=path.parent)
    tmp = pathlib.Path(tmp)
    try:
        shutil.copyfile(path, tmp)
        execute(str(tmp))
        subprocess.run([str(pathlib.Path(sys.executable).parent / "nbdev_clean"), "--fname", str(tmp)], check=True)
        old, new = outputs(path), outputs(tmp)
        bad = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
        if bad or len(old) != len(new):
            src = "".join(old[bad[0]][0])[:120] if bad else ""
            print(f"check_outputs: {path}: {len(bad)} code cell(s) would change, first: {src!r}.\n"
                  f"  Fix: tools/nbrun.sh {path} and commit the result.", file=sys.stderr)
            return False
        return True
    finally: tmp.unlink(missing_ok=True)


if __name__ == "__main__":
    ok = all([check(pathlib.Path(p)) for p in sys.argv[1:]])
    print(f"check_outputs: {'outputs current' if ok else 'stale outputs'} in {', '.join(sys.argv[1:])}")
    sys.exit(0 if ok else 1)
