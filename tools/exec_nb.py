"""Execute one notebook in place with nbclient, skipping cells that carry a test flag from settings.ini (`#| gpu` ...)."""
import configparser, pathlib, re, sys
import nbformat
from nbclient import NotebookClient

def main(path):
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
    nbformat.write(nb, path)

if __name__ == "__main__": main(sys.argv[1])
