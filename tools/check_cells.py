"""Fail when an exported notebook cell defines several public names, or runs over 40 lines, without saying why.

    python tools/check_cells.py [nbs]

The rule of the notebooks: one public definition per exported cell, unless its names form one protocol (a command
and its command line, pack and unpack, a registry and its `register`), and no exported cell over 40 lines without a
reason. The reason is a sentence of the markdown right before the cell that says so; it is recognised by one of
REASONS (for instance "... form one protocol, so they share a cell" or "... is kept whole in one cell, over 40 lines,
because ..."). Each offending cell is printed as notebook, cell index, lines, public names.
"""
import ast, json, pathlib, re, sys

REASONS = re.compile(r"one protocol|longer than|over 40|40 lines|belong together|form one|read as one|kept whole|"
                     r"stays? whole|in one cell|one cell", re.I)
EXPORT = re.compile(r"^#\|\s*export\b", re.M)


def public_names(code:str) -> list[str]:
    "Top-level public functions, classes and assigned names of a cell's code (directives stripped)."
    names = []
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names += [t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def offenders(nb_path:pathlib.Path) -> list[tuple]:
    "Exported cells of one notebook that break the rule without a reason in the prose before them."
    cells, out = json.loads(nb_path.read_text())["cells"], []
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        if c["cell_type"] != "code" or not EXPORT.search(src): continue
        code = "\n".join(l for l in src.splitlines() if not l.startswith("#|"))
        try: names = public_names(code)
        except SyntaxError: continue   # cell magics and the like: nothing to count
        lines = len(code.splitlines())
        if len(names) <= 1 and lines <= 40: continue
        prose, j = "", i - 1
        while j >= 0 and cells[j]["cell_type"] == "markdown": prose, j = "".join(cells[j]["source"]) + prose, j - 1
        if not REASONS.search(prose): out.append((nb_path, i, lines, names))
    return out


def main(root:str="nbs") -> int:
    bad = [o for p in sorted(pathlib.Path(root).glob("**/*.ipynb")) if ".ipynb_checkpoints" not in p.parts for o in offenders(p)]
    for p, i, n, names in bad: print(f"check_cells: {p} cell {i}: {n} lines, public names {names}")
    if bad: print(f"check_cells: {len(bad)} exported cell(s) break the one-definition rule. Fix: split the cell (one public name, "
                  "under 40 lines each), or say in the markdown right before it why it stays whole (see tools/check_cells.py).")
    else: print("check_cells: every exported cell holds one public definition or says why not")
    return 1 if bad else 0


if __name__ == "__main__": sys.exit(main(*sys.argv[1:]))
