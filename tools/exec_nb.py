"""Execute one notebook in place with nbclient, skipping cells that carry a test flag from settings.ini (`#| gpu` ...)."""
import configparser, pathlib, re, sys
import nbformat
from nbclient import NotebookClient

def main(path):
    import os
    os.environ.setdefault("TQDM_DISABLE", "1")   # progress bars would be committed frozen at their first frame
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")   # transformers' own bars (loading weights)
    cfg = configparser.ConfigParser(); cfg.read(pathlib.Path(__file__).parents[1] / "settings.ini")
    flags = cfg["DEFAULT"].get("tst_flags", "").split()
    nb = nbformat.read(path, as_version=4)
    skipped = []
    for c in nb.cells:
        if c.cell_type != "code": continue
        if any(re.search(rf"^#\|\s*{f}\b", c.source, re.M) for f in flags) or re.search(r"^#\|\s*eval:\s*false", c.source, re.M):
            c.metadata["_skip"] = True; skipped.append(c)
    saved = {id(c): c.source for c in skipped}
    for c in skipped: c.source = "pass"  # keep the cell, do not run it
    NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(pathlib.Path(path).parent)}}).execute()
    for c in skipped: c.source = saved[id(c)]; c.outputs = []; c.execution_count = None; c.metadata.pop("_skip", None)
    for c in nb.cells:
        for o in c.get("outputs", []): _scrub(o)
    nbformat.write(nb, path)


_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
_PATHS = [(re.compile(r"(?:/var)?/tmp/(?:tmp|pytest-of-)[A-Za-z0-9_]{4,}"), "$TMPDIR"), (re.compile(re.escape(_ROOT)), "$REPO"),
          (re.compile("|".join(re.escape(p) for p in sorted({sys.prefix, sys.base_prefix}, key=len, reverse=True))), "$PYTHON"),
          (re.compile(re.escape(str(pathlib.Path.home())) + r"(?=/)"), "~")]

def _scrub(o) -> None:
    "Committed outputs show no machine-specific paths: temp directories, the checkout, the interpreter."
    def fix(t: str) -> str:
        for rx, sub in _PATHS: t = rx.sub(sub, t)
        return t
    if "text" in o: o["text"] = fix(o["text"])
    for k, v in (o.get("data") or {}).items():
        if isinstance(v, str) and k.startswith("text/"): o["data"][k] = fix(v)

if __name__ == "__main__": main(sys.argv[1])
