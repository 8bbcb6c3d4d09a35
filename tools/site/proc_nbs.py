#!/usr/bin/env python
"""`nbdev_proc_nbs` (nbs/ -> _proc/) made safe for this project's docs build.

1. nbdev 2.4.7's `nbdev_proc_nbs`, with no `quarto` on PATH, first tries to download Quarto with sudo and then runs
   `pip install -e ".[dev]"` with whatever `pip` comes first on PATH (outside .venv: the system Python's). Quarto is
   not needed to process notebooks, so that step is skipped; the processing itself is nbdev's own.
2. While processing, nbdev re-executes every cell of a documented notebook that contains an import (and exported
   and show_doc cells). A cell mixing imports with work (`import ray` + `ray.init(...)`) would start Ray or vLLM
   inside the docs build; nbdev only warns. Here such cells are an error, named with the fix, before anything runs.

    python tools/site/proc_nbs.py        # what tools/build_site.sh runs; safe to run any time
"""
import ast, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _directives(src: str) -> dict:
    "nbdev's leading `#| word args` lines of a cell -> {word: [args]}."
    d = {}
    for line in src.splitlines():
        s = line.strip()
        if not s: continue
        if not s.startswith("#|"): break
        words = s[2:].split()
        if words: d[words[0]] = words[1:]
    return d


def _contains(trees, types) -> bool: return any(isinstance(n, types) for t in trees for n in ast.walk(t))


def mixed_import_cells(nb_path: Path) -> list[tuple[int, str]]:
    "(cell index, source) of the cells nbdev_proc_nbs would execute although they do more than import."
    nb = json.loads(nb_path.read_text())
    if (nb.get("metadata", {}).get("kernelspec", {}) or {}).get("language", "python") != "python": return []
    cells = []
    for i, c in enumerate(nb.get("cells", [])):
        if c.get("cell_type") != "code": continue
        src = "".join(c.get("source", "")) if isinstance(c.get("source"), list) else (c.get("source") or "")
        try: trees = ast.parse(src).body
        except SyntaxError: trees = []          # magics, shell lines: nbdev does not run them either
        cells.append((i, src, _directives(src), trees))
    shows = {"export", "exports", "exec_doc"}
    has_docs = any((d.keys() & shows) and "hide" not in d for _, _, d, _ in cells) or any(
        isinstance(t, ast.Expr) and isinstance(t.value, ast.Call) and getattr(t.value.func, "id", "") == "show_doc"
        for _, _, _, trees in cells for t in trees)
    if not has_docs: return []
    out = []
    for i, src, d, trees in cells:
        if not trees or "nbdev_export()" in src: continue
        if d.get("eval:", [""])[0].lower() == "false" or d.keys() & {"export", "exports", "exporti", "exec_doc"}: continue
        if _contains(trees, (ast.Import, ast.ImportFrom)) and _contains(trees, (ast.Expr, ast.Assign)): out.append((i, src))
    return out


def check(nbs: Path) -> list[str]:
    problems = []
    for p in sorted(nbs.rglob("*.ipynb")):
        rel = p.relative_to(nbs)
        if any(part.startswith(("_", ".")) for part in rel.parts): continue
        for i, src in mixed_import_cells(p):
            lines = [l for l in src.splitlines() if l.strip() and not l.lstrip().startswith("#|")]
            problems.append(f"{nbs.name}/{rel.as_posix()} cell index {i}: " + " / ".join(lines[:3])[:150])
    return problems


def main():
    import configparser
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(ROOT / "settings.ini")
    problems = check(ROOT / cp["DEFAULT"].get("nbs_path", "nbs"))
    if problems:
        print("proc_nbs: the docs build (nbdev_proc_nbs) would execute these cells, which mix imports with other code:\n"
              + "\n".join(f"  - {p}" for p in problems) +
              "\nFix: move the imports into the notebook's import cell (test-only ones into a `#| hide` import-only "
              "cell), so that every cell with an `import` holds nothing else (STYLE.md).", file=sys.stderr)
        sys.exit(1)
    # nbdev skips a notebook whose _proc/ copy is not older than the _proc/ folder's last run, which misses a notebook
    # saved while a run was under way: drop every copy older than its notebook so nbdev processes it again.
    # The same for the other files nbdev copies (sidebar.yml, _quarto.yml, styles.css): a stale copy would win.
    nbs, proc = ROOT / cp["DEFAULT"].get("nbs_path", "nbs"), ROOT / "_proc"
    for src in (f for f in nbs.rglob("*") if f.is_file()):
        copy = proc / src.relative_to(nbs)
        if copy.exists() and copy.stat().st_mtime < src.stat().st_mtime: copy.unlink()
    import nbdev.quarto
    nbdev.quarto._ensure_quarto = lambda: None
    nbdev.quarto.nbdev_proc_nbs.__wrapped__()
    tidy_show_doc(proc, cp["DEFAULT"].get("git_url", ""), cp["DEFAULT"].get("source_links", "True") == "True")


def tidy_show_doc(proc: Path, git_url: str, source_links: bool) -> None:
    """What show_doc prints for functions executed in a notebook: `__main__.ModelShape` for the notebook's own classes
    (markdown turns `__main__` into a bold "main"), `NoneType` for a `None` default, and source links to `git_url`.
    Types are written as the library names them; source links are dropped while the repository has no public home."""
    link = re.compile(r"\[source\]\(" + re.escape(git_url.rstrip("/")) + r"[^)]*\)(\{[^}]*\})?\n?") if git_url and not source_links else None
    for p in proc.rglob("*.ipynb"):
        text = p.read_text()
        nb = json.loads(text)
        for c in nb.get("cells", []):
            for o in c.get("outputs", []):
                md = o.get("data", {}).get("text/markdown")
                if md is None: continue
                s = "".join(md) if isinstance(md, list) else md
                s = s.replace("__main__.", "").replace("NoneType", "None")
                if link is not None: s = link.sub("", s)
                o["data"]["text/markdown"] = s
        new = json.dumps(nb, indent=1, ensure_ascii=False)
        if new != text: p.write_text(new)


if __name__ == "__main__":   # nbdev's workers are spawned and re-import this file: keep the guard
    main()
