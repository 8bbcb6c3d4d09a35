"""The offline site: tools/site/render.py renders an nbdev project without Quarto, tools/site/check_site.py
fails on every kind of breakage a reader would meet. The browser tests need Debian's Chromium (`make docs-test`
installs it and runs this file after checking the real site); the render test needs KaTeX from `make docs`."""
import base64, importlib.util, json, shutil, struct, sys, zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE_TOOLS = ROOT / "tools" / "site"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, SITE_TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


render = _load("render")
check_site = _load("check_site")
needs_chromium = pytest.mark.skipif(not Path(check_site.CHROMIUM).exists(),
                                    reason=f"no Chromium at {check_site.CHROMIUM} (`make docs-test` installs it and runs this file)")
needs_katex = pytest.mark.skipif(not (render.KATEX_DIR / "package.json").exists() or not shutil.which("node"),
                                 reason="KaTeX not vendored yet in .site_deps/ (`make docs` installs it)")


# --- pieces that need no browser ---------------------------------------------------------------------------

def test_heading_ids_follow_pandoc():
    "nbdev's doc links (`config.html#trainconfig`) assume pandoc's identifiers."
    assert render.pandoc_id("TrainConfig") == "trainconfig"
    assert render.pandoc_id("TrainConfig.derive") == "trainconfig.derive"
    assert render.pandoc_id("Errors that name the fix") == "errors-that-name-the-fix"
    assert render.pandoc_id("grpo_nb config") == "grpo_nb-config"
    assert render.pandoc_id("_private") == "private"
    assert render.pandoc_id("2. Step (one)") == "step-one"
    assert render.pandoc_id("!!!") == "section"
    used = {}
    assert [render.unique_id("a", used) for _ in range(3)] == ["a", "a-1", "a-2"]


def test_cell_directives():
    d, code = render.cell_directives("#| echo: false\n#| output: asis\n#|hide\n#| export mod\nx = 1\n#| not a directive\n")
    assert d == {"echo": "false", "output": "asis", "hide": "", "export": "mod"}
    assert code == "x = 1\n#| not a directive\n"


def test_leftover_tex_ignores_prices_and_finds_tex():
    assert check_site.leftover_tex("It costs $5 and $10.") == []
    assert check_site.leftover_tex("plain $ sign") == []
    assert len(check_site.leftover_tex(r"energy $\alpha + x^2$ here")) == 1
    assert len(check_site.leftover_tex("display $$E=mc^2$$")) >= 1
    assert len(check_site.leftover_tex(r"inline \(x\) and \[y\]")) == 2


def test_quarto_callouts_become_divs():
    out = render.quarto_divs("::: {.callout-note}\nSome *text*.\n:::\n```\n:::\n```")
    assert '<div class="callout-note callout">' in out and "</div>" in out
    assert out.endswith("```\n:::\n```")          # fences are left alone


# --- a deliberately broken site: each failure kind must be reported ----------------------------------------

BROKEN = {
    "index.html": """<!DOCTYPE html><html><head><meta charset="utf-8"><title>i</title></head><body>
        <a href="missing.html">gone</a> <a href="good.html#nope">no anchor</a> <a href="good.html#here">fine</a>
        <a href="https://example.com/elsewhere">external links are not requests</a></body></html>""",
    "good.html": """<!DOCTYPE html><html><head><meta charset="utf-8"><title>g</title></head><body><h2 id="here">Here</h2>
        <img src="nothere.png" alt="missing plot"> <img src="data:image/png;base64,AAAA" alt="corrupt plot">
        <div class="cell-output"><pre><code>&lt;Figure size 640x480 with 1 Axes&gt;</code></pre></div></body></html>""",
    "ext.html": """<!DOCTYPE html><html><head><meta charset="utf-8"><title>e</title>
        <link rel="stylesheet" href="https://cdn.example.com/katex.css"></head><body><p>cdn</p></body></html>""",
    "err.html": """<!DOCTYPE html><html><head><meta charset="utf-8"><title>x</title></head><body>
        <script>console.error("bad thing happened")</script><script>throw new Error("boom")</script></body></html>""",
    "wide.html": """<!DOCTYPE html><html><head><meta charset="utf-8"><title>w</title></head><body><main style="width: 600px">
        <pre style="overflow-x: auto">| model | GPUs | ZeRO | variant | attention | device | row tokens | tokens/s | MFU | measured GiB | predicted GiB |</pre>
        </main></body></html>""",
    "math.html": r"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>m</title></head><body>
        <p>Energy $$E=mc^2$$, inline \(x\) and $\alpha$ too; prices $5 and $10 are fine.</p>
        <span class="katex-error" title="ParseError: KaTeX parse error">\frac</span>
        <pre>$HOME and $$ and \(fine\) inside code</pre></body></html>""",
}


@needs_chromium
def test_check_site_reports_every_failure_kind(tmp_path):
    for name, text in BROKEN.items(): (tmp_path / name).write_text(text)
    problems, counts = check_site.check_site(tmp_path)
    text = "\n".join(problems)
    assert counts["pages"] == len(BROKEN)
    expected = [
        "index.html: broken link 'missing.html'",                          # page that does not exist
        "index.html: broken link 'good.html#nope': good.html has no element with id 'nope'",   # anchor
        "ext.html: request to a non-local host: https://cdn.example.com/katex.css",            # internet
        "err.html: page error: boom",                                       # uncaught exception
        "err.html: console error: bad thing happened",                      # console error
        "math.html: unrendered math",                                       # leftover TeX
        "math.html: KaTeX error: ParseError",                               # KaTeX error element
        "good.html: image did not load (missing plot?): nothere.png",       # missing plot
        "good.html: image did not load (missing plot?): data:image/png",    # corrupt plot
        "good.html: missing plot: the output shows only '<Figure size 640x480 with 1 Axes>'",  # plot never saved
        "wide.html: a code block wider than the page",                      # scrolls sideways
    ]
    for e in expected: assert e in text, f"not reported: {e}\n--- problems:\n{text}"
    assert "good.html#here" not in text and "HOME" not in text and "$5" not in text, text
    assert "example.com/elsewhere" not in text                             # a link is not a request
    assert check_site.main([str(tmp_path / "nothing-built-here")]) == 2       # no pages: says to run `make docs`


# --- a tiny nbdev project rendered end to end, then checked in the browser -----------------------------------

def _png(w=4, h=3) -> str:
    "A small valid PNG (red), base64 as in a notebook output."
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


def _nb(cells):
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def md(s): return {"cell_type": "markdown", "metadata": {}, "source": s}
def raw(s): return {"cell_type": "raw", "metadata": {}, "source": s}
def code(s, outputs=()): return {"cell_type": "code", "metadata": {}, "source": s, "outputs": list(outputs), "execution_count": None}
def stream(s): return {"output_type": "stream", "name": "stdout", "text": s}
def fm(title, desc, out): return raw(f"---\ndescription: {desc}\noutput-file: {out}\ntitle: {title}\n---\n\n")


SHOW_DOC = ('---\n\n[source](https://github.com/example/tiny/blob/main/tiny/a.py#L1){target="_blank" style="float:right; font-size:smaller"}'
            '\n\n### {name}\n\n>      {name} (x:int=3)\n\n*Return `x` squared: $x^2$.*')


def _tiny_project(root: Path):
    "nbs/ as authors write it and _proc/ as nbdev_proc_nbs leaves it (front matter cell, flags and hidden cells gone)."
    (root / "settings.ini").write_text(
        "[DEFAULT]\nrepo = tiny\nlib_name = tiny\nversion = 0.0.1\nnbs_path = nbs\nlib_path = tiny\ndoc_path = _docs\n"
        "title = tiny\ndescription = A tiny project\ndoc_host = https://tiny.example.org\ndoc_baseurl = /tiny\n"
        "git_url = https://github.com/example/tiny\nbranch = main\ntst_flags = gpu slurm slow\nreadme_nb = index.ipynb\n"
        "user = example\nauthor = x\nauthor_email = x@example.org\ncopyright = x\nkeywords = x\nlanguage = English\n"
        "status = 3\nmin_python = 3.10\nlicense = apache2\nblack_formatting = False\ncustom_sidebar = True\n")
    nbs, proc = root / "nbs", root / "_proc"
    (nbs / "guides").mkdir(parents=True)
    (nbs / "_quarto.yml").write_text((ROOT / "nbs" / "_quarto.yml").read_text())
    (nbs / "styles.css").write_text(".cell { margin-bottom: 1rem; }\n")
    (nbs / "nbdev.yml").write_text('website:\n  title: "tiny"\n  site-url: "https://tiny.example.org/tiny"\n'
                                   '  navbar:\n    left:\n      - text: The guide\n        href: guides/g.ipynb\n')
    (nbs / "sidebar.yml").write_text("website:\n  sidebar:\n    contents:\n      - index.ipynb\n"
                                     "      - section: Library\n        contents:\n          - 01_a.ipynb\n"
                                     "      - section: Guides\n        contents: []\n")
    prose = ("## Math\n\nInline $x^2 + \\alpha$ and display:\n\n$$\\sum_{i=1}^n i = \\frac{n(n+1)}{2}$$\n\n"
             "Prices $5 and $10 stay text. See [the index](index.ipynb), [a guide](guides/g.ipynb#usage), "
             "[`foo`](https://tiny.example.org/tiny/a.html#foo), [`_bar`](https://tiny.example.org/tiny/a.html#_bar) "
             "and [`undocumented`](https://tiny.example.org/tiny/a.html#undocumented).\n\n"
             "::: {.callout-note}\nA callout with **markdown**.\n:::\n")
    widget = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
              "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2, "version_minor": 0},
                       "text/plain": "IntSlider(value=3)"}}
    plot = {"output_type": "display_data", "metadata": {}, "data": {"image/png": _png(), "text/plain": "<Figure size 4x3 with 1 Axes>"}}
    table = {"output_type": "execute_result", "execution_count": 2, "metadata": {},
             "data": {"text/html": '<table class="dataframe"><tr><th>col</th></tr><tr><td>17</td></tr></table>', "text/plain": "   col\n0   17"}}
    doc = lambda n: {"output_type": "execute_result", "execution_count": 3, "metadata": {},
                     "data": {"text/markdown": SHOW_DOC.replace("{name}", n), "text/plain": n}}
    src_a = [md("# Page A\n> The first page"), md(prose), code("#| hide\nhidden_marker = 1"),
             code('#| echo: false\nprint("only the output")', [stream("only the output\n")]),
             code("#| gpu\nrun_on_gpu()"), code("plt.plot([1, 2])", [plot]), code("df", [table]), code("slider", [widget]),
             code('print("$HOME")', [stream("$HOME and $$ stay literal in code\n")])]
    proc_a = [fm("Page A", "The first page", "a.html"), md(render.NBDEV_WARNING), md(prose),
              code("#| echo: false\n#| output: asis\nshow_doc(foo)", [doc("foo")]),
              code("#| echo: false\n#| output: asis\nshow_doc(_bar)", [doc("_bar")]),
              code("#| hide\nhidden_marker = 1"),            # nbdev drops these; the renderer must too
              code('#| echo: false\nprint("only the output")', [stream("only the output\n")]),
              code("run_on_gpu()"), code("plt.plot([1, 2])", [plot]), code("df", [table]), code("slider", [widget]),
              code('print("$HOME")', [stream("$HOME and $$ stay literal in code\n")])]
    src_i = [md("# tiny\n> A tiny project"), md("Welcome. Read [Page A](01_a.ipynb#math)."), code('print("hello")', [stream("hello\n")])]
    proc_i = [fm("tiny", "A tiny project", "index.html"), md(render.NBDEV_WARNING)] + src_i[1:]
    src_g = [md("# A guide\n> Not in the sidebar"), md("## Usage\n\nBack to [A](../01_a.ipynb).")]
    proc_g = [fm("A guide", "Not in the sidebar", "g.html"), src_g[1]]
    for rel, s, p in [("01_a.ipynb", src_a, proc_a), ("index.ipynb", src_i, proc_i), ("guides/g.ipynb", src_g, proc_g)]:
        (nbs / rel).write_text(json.dumps(_nb(s)))
    for rel, s, p in [("01_a.ipynb", src_a, proc_a), ("index.ipynb", src_i, proc_i), ("guides/g.ipynb", src_g, proc_g)]:
        (proc / rel).parent.mkdir(parents=True, exist_ok=True)
        (proc / rel).write_text(json.dumps(_nb(p)))
    for f in ("_quarto.yml", "nbdev.yml", "sidebar.yml", "styles.css"): shutil.copy2(nbs / f, proc / f)
    (nbs / "guides" / "notes.md").write_text("---\ntitle: Notes\ndescription: A markdown page\n---\n\nSee [A](../01_a.ipynb): $a^2$.\n")


@needs_katex
def test_render_tiny_project(tmp_path, capsys):
    _tiny_project(tmp_path)
    assert render.main(["--root", str(tmp_path)]) == 0, capsys.readouterr().err
    site = tmp_path / "_site"
    a, index, guide = (site / "a.html").read_text(), (site / "index.html").read_text(), (site / "guides" / "g.html").read_text()
    assert "<h1 class=\"title\">Page A</h1>" in a and "The first page" in a
    assert a.count('class="katex"') >= 4 and "$x^2" not in a and "\\frac" not in a.split('class="katex-mathml"')[0]
    assert "Prices $5 and $10 stay text" in a
    assert 'href="index.html"' in a and 'href="guides/g.html#usage"' in a and 'href="a.html#foo"' in a
    assert '<h3 id="foo">' in a and 'id="_bar"' in a and 'href="a.html#_bar"' in a
    assert "<code>undocumented</code>" in a and "a.html#undocumented" not in a      # nbdev link to an undocumented name
    assert 'class="callout-note callout"' in a and "<strong>markdown</strong>" in a
    assert "hidden_marker" not in a
    assert "only the output" in a and "print(&quot;only" not in a and 'print</span><span class="p">(</span><span class="s2">&quot;only' not in a
    assert "Not run in CI" in a and "run_on_gpu" in a
    pngs = list((site / "a_files").rglob("*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes().startswith(b"\x89PNG") and f'src="a_files/figure-html/{pngs[0].name}"' in a
    assert "<td>17</td>" in a and "Interactive widget" in a and "IntSlider(value=3)" in a
    assert "More pages" in index and 'href="guides/g.html"' in index            # a page the sidebar does not list
    assert 'href="../a.html"' in guide and 'href="../site_libs/site.css"' in guide
    assert 'href="a.html#math"' in index
    notes = (site / "guides" / "notes.html").read_text()
    assert "<h1 class=\"title\">Notes</h1>" in notes and 'href="../a.html"' in notes and 'class="katex"' in notes
    assert '<a class="navbar-link navbar-left" href="guides/g.html">The guide</a>' in index
    assert '<a class="navbar-link navbar-left" href="g.html">The guide</a>' in guide
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# tiny\n") and "> A tiny project" in readme
    assert '```python\nprint("hello")\n```\n\n```\nhello\n```' in readme and "(nbs/01_a.ipynb#math)" in readme
    if Path(check_site.CHROMIUM).exists():
        problems, counts = check_site.check_site(site)
        assert problems == [], "\n".join(problems)
        assert counts["pages"] == 4 and counts["images"] == 1


@needs_katex
def test_render_reports_broken_notebook_links(tmp_path, capsys):
    _tiny_project(tmp_path)
    p = tmp_path / "_proc" / "index.ipynb"
    nb = json.loads(p.read_text())
    nb["cells"].append(md("A link to [nothing](99_missing.ipynb) and bad TeX $\\frac{1$."))
    p.write_text(json.dumps(nb))
    assert render.main(["--root", str(tmp_path), "--no-readme"]) == 1
    err = capsys.readouterr().err
    assert "index.ipynb: link '99_missing.ipynb' points at nothing" in err
    assert "index.ipynb: TeX does not parse" in err


def test_readme_only_matches_the_site_build(tmp_path):
    "`render.py --readme-only` processes index.ipynb with nbdev in memory: same README as the build from _proc/."
    _tiny_project(tmp_path)
    project = render.Project.load(tmp_path)
    from_proc = render.readme_markdown(project, json.loads((tmp_path / "_proc" / "index.ipynb").read_text()))
    assert render.main(["--root", str(tmp_path), "--readme-only"]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert readme == from_proc
    assert "Welcome. Read [Page A](nbs/01_a.ipynb#math)." in readme and "DO NOT EDIT" in readme


def test_docs_build_refuses_cells_mixing_imports_and_work(tmp_path):
    "nbdev_proc_nbs would execute such cells (Ray, vLLM) in the docs build: tools/site/proc_nbs.py names them first."
    proc_nbs = _load("proc_nbs")
    cells = [code("#| export\nimport os\ndef f(): return 1"), code("#| hide\nimport json"),
             code("import ray\nray.init()"), code("#| eval: false\nimport x\nx.run()"), code("%%bash\nimport nothing")]
    (tmp_path / "01_x.ipynb").write_text(json.dumps(_nb(cells)))
    assert [i for i, _ in proc_nbs.mixed_import_cells(tmp_path / "01_x.ipynb")] == [2]
    (tmp_path / "02_nodocs.ipynb").write_text(json.dumps(_nb([code("import ray\nray.init()")])))   # nbdev runs nothing there
    assert proc_nbs.check(tmp_path) == [f"{tmp_path.name}/01_x.ipynb cell index 2: import ray / ray.init()"]


@needs_katex
def test_render_reports_a_stale_processed_copy(tmp_path, capsys):
    _tiny_project(tmp_path)
    src = tmp_path / "nbs" / "01_a.ipynb"
    src.write_text(src.read_text())          # saved after nbdev_proc_nbs ran
    import os; os.utime(src, (src.stat().st_mtime + 10, src.stat().st_mtime + 10))
    assert render.main(["--root", str(tmp_path), "--no-readme"]) == 1
    assert "01_a.ipynb: _proc/ has an older copy of it" in capsys.readouterr().err
    assert "Page A" in (tmp_path / "_site" / "a.html").read_text()      # still rendered, from the notebook itself


def test_pages_show_the_library_as_readers_import_it():
    """show_doc once printed `__main__.ModelShape` (markdown turned `__main__` into a bold "main"), `NoneType`
    for a `None` default, source links to a placeholder repository, and a progress bar frozen at 0%."""
    site = ROOT / "_site"
    if not (site / "index.html").exists(): pytest.skip("no built site (`make docs` builds it; `make test` builds it before pytest)")
    bad = {}
    for page in site.rglob("*.html"):
        text = page.read_text()
        for what in ("__main__.", "<strong>main</strong>", "NoneType", "github.com/grpo-nb/grpo-nb/blob", "0%|"):
            if what in text: bad.setdefault(page.name, []).append(what)
    assert not bad, bad


# --- what readers see of the notebooks: each class of defect a guide must not have --------------------------------

def _out(text, kind="stream"):
    if kind == "stream": return {"output_type": "stream", "name": "stdout", "text": text}
    return {"output_type": "execute_result", "execution_count": 1, "metadata": {}, "data": {"text/markdown": text, "text/plain": "<Markdown>"}}


def _img(axes=1): return {"output_type": "display_data", "metadata": {}, "data": {"image/png": _png(), "text/plain": f"<Figure size 640x480 with {axes} Axes>"}}


def test_check_notebooks_reports_every_defect_class(tmp_path):
    cells = [
        code("x", [_out("[2026-01-02 03:04:05,678] [WARNING] [real_accelerator.py:213] Setting accelerator to CPU\n")]),  # 0 log line
        code("y", [_out("WARNING grpo_nb.checkpoint: skipping checkpoint of step 40\n")]),                                # 1 logger line
        code("z", [{"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["Traceback (most recent call last)", "ValueError: bad"]}]),  # 2
        code("p", [_out("wrote /home/alice/project/run/metrics.jsonl\n")]),                                              # 3 absolute path
        code("s", [_out("nodes WARN sinfo failed: sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error\n")]),     # 4 cluster tool error
        code("k", [_out("longest kernels: void at::native::elementwise_kernel<128, 2> 78 ms\n")]),                     # 5 kernel template
        md("The seeds' 7B layout, as seed 003 wrote it."),                                                              # 6 jargon
        md("A blank cell means the GPU budget of a session ran out; an earlier version refused this (the issue asks for 10%)."),  # 7
        code("print(table)", [_out("| a | b |\n|---|---|\n| 1 | 2 |\n")]),                                             # 8 table as text
        code("plt.plot([1, 2])", [_img()]),                                                                              # 9 no labels
        code("fig, ax = plt.subplots(1, 2)\nax[0].plot([1]); ax[0].set_xlabel('step'); ax[0].set_ylabel('loss')", [_img(2)]),  # 10 panel
        code("t", [_out("| run | note |\n|---|---|\n| a | no result within 140 s; not diagnosed: t |\n", "markdown")]),  # 11 cut
        code("plt.text(0, 0, 'L0', fontsize=6); plt.axis('off')", [_img()]),                                           # 12 tiny text
    ]
    (tmp_path / "01_bad.ipynb").write_text(json.dumps(_nb(cells)))
    good = [md("Sample with `seed=0`: the same seed gives the same samples. An interactive session of `salloc` works too."),
            code("#| hide\nprint('/home/x')", [_out("/home/x\n")]),
            code("Markdown(t)", [_out("| a | b |\n|---|---|\n| 1 | 2 |\n", "markdown")]),
            code("ax.plot([1]); ax.set_xlabel('tokens'); ax.set_ylabel('GiB')", [_img()]),
            code("print(addr)", [_out("ray start --head --node-ip-address=10.0.0.1 (example address)\n")])]
    (tmp_path / "02_good.ipynb").write_text(json.dumps(_nb(good)))
    problems = check_site.check_notebooks(tmp_path, root=tmp_path)
    text = "\n".join(problems)
    assert "02_good" not in text, text
    expected = {0: "a log line with a timestamp", 1: "a logger's WARNING/INFO line", 2: "a traceback", 3: "an absolute path",
                4: "a cluster or system tool's error message", 5: "a raw GPU kernel name", 6: "'seed' for a source document",
                8: "a table printed as text", 9: "no x-axis label", 10: "1 y-axis label(s) for 2 panels", 11: "text cut mid-word",
                12: "text of 6 pt"}
    for i, what in expected.items():
        assert any(p.startswith(f"01_bad.ipynb cell {i}:") and what in p and "Fix:" in p for p in problems), f"cell {i}: {what}\n{text}"
    for what in ("a work session of the makers", "a budget of the makers", "history of the work", "a request or issue"):
        assert any(p.startswith("01_bad.ipynb cell 7:") and what in p for p in problems), f"cell 7: {what}\n{text}"
    assert check_site.main(["--notebooks", str(tmp_path)]) == 1


def test_project_notebooks_pass_the_page_check():
    "The committed notebooks, as readers see them, have none of those defects (the browser test runs this too)."
    problems = check_site.check_notebooks(ROOT / "nbs")
    assert problems == [], "\n".join(problems)
