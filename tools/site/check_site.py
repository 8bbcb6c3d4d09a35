#!/usr/bin/env python
"""Open every page of a static site in headless Chromium and list everything wrong with it.

    python tools/site/check_site.py _site                                # serves the folder itself on 127.0.0.1
    python tools/site/check_site.py _site --base-url http://127.0.0.1:PORT/   # a server already runs there
    python tools/site/check_site.py _site --screenshot page.html:out.png     # also save a screenshot of one page
    python tools/site/check_site.py --notebooks nbs                      # only the notebooks' prose and outputs

Fails (exit 1, one line per problem) on: a local link to a page or file that does not exist, or to an #anchor the
target page does not have; any request to a host other than 127.0.0.1/localhost (blocked, then reported); any page
error (uncaught exception) or console error (a failed resource included); TeX left unrendered in visible text
(`$$`, `\\(`, `\\[`, `$..$` with TeX in it) or a KaTeX error element; an <img> that did not load (naturalWidth 0)
or a plot output that is only its text (`<Figure size 640x480 with 1 Axes>`); a code block wider than the page.

With `--notebooks nbs` it first reads the committed notebooks, as a reader would see them, and fails on each class
of defect a guide must not have (`check_notebooks`): output of the machine that built the page (log lines with
timestamps, WARNING lines, tracebacks, absolute paths, host addresses, cluster tools' errors, raw kernel names);
words about how the project was made rather than what it is (sessions, budgets, issues and requests, history,
"seed" for a source document); tables printed as text (pipe tables in code blocks); figures without axis labels
or with text under 8 pt; text cut mid-word. Each message names the cell and the fix.
Uses the system Chromium (Debian package `chromium`), never a downloaded one.
"""
from __future__ import annotations

import argparse, functools, json, posixpath, re, socket, sys, tempfile, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# Runs in the page: ids, links, images (after they settled), leftover TeX and KaTeX errors.
COLLECT_JS = r"""
async () => {
  const imgs = [...document.images];
  await Promise.race([
    Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); }))),
    new Promise(r => setTimeout(r, 5000))]);
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id)
    .concat([...document.querySelectorAll('a[name]')].map(e => e.getAttribute('name')));
  const links = [...document.querySelectorAll('a[href]')].map(a => ({raw: a.getAttribute('href'), abs: a.href}));
  const images = imgs.map(i => ({src: i.getAttribute('src') || '', abs: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0}));
  const SKIP = 'pre, code, kbd, samp, script, style, textarea, .katex, .katex-display, .katex-error';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const texts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && n.parentElement.closest(SKIP)) continue;
    texts.push(n.nodeValue);
  }
  const figureReprs = [...document.querySelectorAll('pre')].map(e => e.textContent)
    .filter(t => /^\s*<(Figure|matplotlib\.figure\.Figure) size [\d.]+x[\d.]+( with \d+ Axes)?>\s*$/.test(t));
  const overflow = [...document.querySelectorAll('main pre, .content pre')].filter(e => e.scrollWidth > e.clientWidth + 2)
    .map(e => e.textContent.trim().split('\n')[0].slice(0, 80));
  const katexErrors = [...document.querySelectorAll('.katex-error')].map(e => (e.getAttribute('title') || '') + ' :: ' + e.textContent);
  return {ids, links, images, text: texts.join(''), katexErrors, figureReprs, overflow};
}
"""

_TEX_INLINE = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]{1,300}?)(?<=\S)\$(?![\w$])")
_TEXISH = re.compile(r"\\[A-Za-z]+|[\^_{}]|^[A-Za-z]$")


def leftover_tex(text: str) -> list[str]:
    "Pieces of visible text that look like TeX the page did not render."
    found = []
    for pat in (r"\$\$", r"\\\(", r"\\\["):
        for m in re.finditer(pat, text): found.append(text[max(0, m.start() - 30): m.end() + 30])
    for m in _TEX_INLINE.finditer(text):
        if _TEXISH.search(m.group(1)): found.append(m.group(0))
    return [re.sub(r"\s+", " ", f).strip() for f in found]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


def serve(site: Path) -> ThreadingHTTPServer:
    "Serve `site` on 127.0.0.1 on a free port in a daemon thread (stopped with .shutdown())."
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def site_pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))


def check_site(site: Path, base_url: str | None = None, chromium: str = CHROMIUM,
               screenshot: tuple[str, Path] | None = None) -> tuple[list[str], dict]:
    "Problems found on the site at `site` (served at `base_url`, or served here), and counts of what was checked."
    from playwright.sync_api import sync_playwright
    site = Path(site).resolve()
    httpd = None
    if not base_url:
        httpd = serve(site)
        base_url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    base_url = base_url.rstrip("/") + "/"
    origin = urlparse(base_url)
    pages = site_pages(site)
    problems: list[str] = []
    current = {"page": "(start)"}
    blocked: set[str] = set()

    def add(msg: str):
        msg = f"{current['page']}: {msg}"
        if msg not in problems: problems.append(msg)

    def route(r):
        u = urlparse(r.request.url)
        if u.scheme in ("http", "https", "ws", "wss") and u.hostname not in LOCAL_HOSTS:
            blocked.add(r.request.url)
            add(f"request to a non-local host: {r.request.url}")
            return r.abort()
        return r.continue_()

    ids: dict[str, set[str]] = {}
    links: list[tuple[str, str, str]] = []
    n_images = 0
    try:
        with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
            ctx = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
                                                       viewport={"width": 1400, "height": 1000})
            ctx.route("**/*", route)
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.on("console", lambda m: m.type == "error" and add(f"console error: {m.text}"))
            page.on("pageerror", lambda e: add(f"page error: {e}"))
            page.on("response", lambda r: r.status >= 400 and add(f"HTTP {r.status} for {r.url}"))
            # (net::ERR_ABORTED: a request cut short by the next navigation; a missing file is a 404 above)
            page.on("requestfailed", lambda r: r.url not in blocked and "ERR_ABORTED" not in (r.failure or "")
                    and add(f"request failed: {r.url} ({r.failure})"))
            for rel in pages:
                current["page"] = rel
                try:
                    resp = page.goto(urljoin(base_url, rel), wait_until="load", timeout=20000)
                except Exception as e:  # a page that does not load at all
                    add(f"does not load: {e}"); continue
                if resp is None or resp.status >= 400:
                    add(f"HTTP {resp.status if resp else '?'}"); continue
                info = page.evaluate(COLLECT_JS)
                ids[rel] = set(info["ids"])
                for l in info["links"]: links.append((rel, l["raw"], l["abs"]))
                for im in info["images"]:
                    n_images += 1
                    if not im["ok"]: add(f"image did not load (missing plot?): {im['src'][:120] or '(no src)'}")
                for t in leftover_tex(info["text"]): add(f"unrendered math: {t!r}")
                for e in info["katexErrors"]: add(f"KaTeX error: {e}")
                for o in info["overflow"]:
                    add(f"a code block wider than the page (it scrolls sideways): {o!r}. Fix: keep `pre` wrapping (nbs/styles.css), "
                        f"and show tables as tables (IPython.display.Markdown), not as text")
                for f in info["figureReprs"]: add(f"missing plot: the output shows only {f.strip()!r} (no image saved)")
                if screenshot and screenshot[0].partition("#")[0] == rel:
                    if "#" in screenshot[0]: page.goto(urljoin(base_url, screenshot[0]), wait_until="load")
                    page.screenshot(path=str(screenshot[1]), full_page=False)
            current["page"] = "(end)"
            ctx.close()
    finally:
        if httpd: httpd.shutdown(); httpd.server_close()

    # every local link: the file must exist; an #anchor must exist on the target page
    n_links = 0
    for rel, raw, absu in links:
        u = urlparse(absu)
        if u.scheme not in ("http", "https") or u.hostname not in LOCAL_HOSTS or u.port != origin.port: continue
        n_links += 1
        path = unquote(u.path)
        if not path.startswith(origin.path):
            problems.append(f"{rel}: link {raw!r} leaves the site ({path})"); continue
        target = path[len(origin.path):]
        if target == "" or target.endswith("/"): target += "index.html"
        target = posixpath.normpath(target)
        f = site / target
        if not f.is_file():
            problems.append(f"{rel}: broken link {raw!r}: {target} does not exist"); continue
        frag = unquote(u.fragment)
        if frag and target in ids and frag not in ids[target]:
            problems.append(f"{rel}: broken link {raw!r}: {target} has no element with id {frag!r}")
    return problems, {"pages": len(pages), "links": n_links, "images": n_images}


# ---------------------------------------------------------------------------------------------------------------
# What the pages say: the committed notebooks, checked without a browser (`--notebooks nbs`)
#
# Each rule is a class of defect, never one instance; every message names the fix. Text in code spans and fenced
# code blocks of markdown is exempt from the wording rules (a preset named `seed000-...` is a name, not prose).

_RE_FLAG = re.compile(r"^\s*#\|\s*([\w-]+)\s*:?\s*(.*)$")

MACHINE_OUTPUT = [   # (pattern on a line of a committed output, what it is)
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"), "a log line with a timestamp"),
    (re.compile(r"^\s*\(?(?:[A-Z][\w]*Actor|raylet|pid=\d+)[^)]*\)\s", re.M), "a Ray worker's log prefix"),
    (re.compile(r"\[(?:WARNING|INFO|DEBUG|ERROR)\]|^\s*(?:WARNING|INFO|DEBUG)\b[ :]|\b\w*Warning: ", re.M), "a logger's WARNING/INFO line"),
    (re.compile(r"Traceback \(most recent call last\)"), "a traceback"),
    (re.compile(r"(?<![\w.~$}/-])/(?:home|work|root|Users|opt|usr/lib|usr/local|var/folders|private)/\S+|/tmp/(?:tmp|pytest|ray)\w*|site-packages/"),
     "an absolute path of the machine that ran the notebook"),
    # (example addresses: 127.0.0.1, 0.0.0.0, 10.0.0.x and RFC 5737's 192.0.2.x / 198.51.100.x / 203.0.113.x)
    (re.compile(r"\b(?!127\.0\.0\.1\b|0\.0\.0\.0\b|10\.0\.0\.|192\.0\.2\.|198\.51\.100\.|203\.0\.113\.)(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b(?![\w.])"),
     "a host address"),
    (re.compile(r"\b(?:sinfo|squeue|sbatch|scontrol|srun|salloc|sacct|nvidia-smi|ssh|module|apt-get|pip): error: |res_nsearch|Unknown host\b"),
     "a cluster or system tool's error message"),
    (re.compile(r"\bvoid [\w:]+<|\bat::native::"), "a raw GPU kernel name"),
    (re.compile(r"\x1b\[[0-9;]*m|\b\d{1,3}%\|"), "terminal colours or a progress bar"),
]

MAKING_OF = [   # (pattern on prose, what it is): words about how the project was made, not what it is
    (re.compile(r"\bseed(?:s'|'s|s?\s+\d{3}\b|[- ]\d{3}\b)|\bseeds?[- ](?:documents?|guides?|systems?|runs?|tables?|scripts?|says|files?|setups?|ports?)\b"
                r"|\bthe seeds\b|\bother seed\b|\bthe seed (?:gives|says|uses|runs|trains|puts|sizes|writes|names|is wrong)\b|\|\s*seeds?\s*\|", re.I),
     "'seed' for a source document (readers have none): name the run itself, e.g. 'the open-instruct 32B RL-Zero "
     "guide', 'the Isambard migration', with its source where it is public"),
    (re.compile(r"\b(?:this|the|a|one|each|GPU|previous|earlier|last|next|measuring)\s+session'?s?\b(?<!interactive session)"
                r"|\bsession'?s device time\b|\bprevious_session\w*", re.I),
     "a work session of the makers"),
    (re.compile(r"\b(?:GPU|device)[ -](?:time |hours? )?budget\b|(?<!CPU-)(?<!CPU )\btime budget\b|\bbudget of (?:a|the|one) session\b", re.I),
     "a budget of the makers (GPU time, device time)"),
    (re.compile(r"\bissue \d+|\b(?:of|in|from|for) the issue\b|\b(?:this|the) issue (?:asks|asked|wants|started|came|names|requires)\b|\bissue asks\b"
                r"|\b(?:brief|task|request)\s+(?:asks|asked|wants)\b|\bas (?:requested|asked)\b", re.I),
     "a request or issue the work answered"),
    (re.compile(r"\b(?:an |the )?earlier (?:versions?|comparisons?|attempts?|builds?|commits?|releases?)\b|\bused to (?:be|refuse|fail|take)\b"
                r"|\bnot diagnosed\b|\bat commit\b|\b(?:we|I) (?:tried|fixed|changed|found)\b|\bbefore (?:this|the) (?:fix|change)\b"
                r"|\bprevious(?:ly)? (?:versions?|runs? of this)\b", re.I),
     "history of the work"),
]

_RE_PIPE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_RE_PIPE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")
_RE_CUT = [   # text cut mid-word: a fragment left dangling at the end of a line or a table cell
    re.compile(r"(?<=[a-z])(?:\.\.\.|…)(?=[ \t]*(?:\||$))", re.M),        # "diagnos..."
    re.compile(r":[ \t]+[a-z][ \t]*(?:\||$)", re.M),                        # "not diagnosed: t"
    re.compile(r"\[\s*'[^'\]\n]*'\s*,[ \t]*(?:\||\Z)"),                     # "one of ['A100-40GB',"
]


def _cut_cells(text: str) -> list[str]:
    "Cells of a markdown table that three or more rows cut at one fixed width (>= 40 characters): text sliced for display."
    cols: dict[int, list[str]] = {}
    for line in text.splitlines():
        if not _RE_PIPE_ROW.match(line) or _RE_PIPE_SEP.match(line): continue
        for j, cell in enumerate(line.strip().strip("|").split("|")): cols.setdefault(j, []).append(cell.strip())
    out = []
    for cells in cols.values():
        lens = [len(c) for c in cells if len(c) >= 40]
        if lens and lens.count(max(lens)) >= 3:
            out += [c for c in cells if len(c) == max(lens) and not c.endswith((".", ")", "`", "*", "|"))][:1]
    return out


def _src(x) -> str: return "".join(x) if isinstance(x, list) else (x or "")


def _directives(src: str) -> dict[str, str]:
    d = {}
    for line in src.splitlines():
        m = _RE_FLAG.match(line)
        if not m:
            if line.strip(): break
            continue
        d[m.group(1)] = m.group(2).strip()
    return d


def _prose(md: str) -> str:
    "Markdown with fenced code, inline code, link targets and HTML comments blanked (the words a reader reads)."
    md = re.sub(r"```.*?```|~~~.*?~~~", lambda m: "\n" * m.group(0).count("\n"), md, flags=re.S)
    md = re.sub(r"<!--.*?-->", "", md, flags=re.S)
    md = re.sub(r"(`+)(?:(?!\1).)+?\1", "`…`", md, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]()", md)


def _visible_outputs(cell: dict) -> list[tuple[str, str]]:
    "(kind, text) of what a reader sees of a code cell's outputs: stream, error, markdown/html, plain text, image."
    out = []
    for o in cell.get("outputs", []) or []:
        t = o.get("output_type")
        if t == "stream": out.append(("stream", _src(o.get("text"))))
        elif t == "error": out.append(("error", "\n".join(o.get("traceback") or []) or "Traceback (most recent call last)"))
        else:
            data = o.get("data", {}) or {}
            if any(k.startswith("image/") for k in data): out.append(("image", _src(data.get("text/plain", ""))))
            elif "text/markdown" in data: out.append(("markdown", _src(data["text/markdown"])))
            elif "text/html" in data: out.append(("html", _src(data["text/html"])))
            elif "text/plain" in data: out.append(("plain", _src(data["text/plain"])))
    return out


def _pipe_table_in(text: str) -> bool:
    lines = text.splitlines()
    return any(_RE_PIPE_SEP.match(l) for l in lines) and sum(bool(_RE_PIPE_ROW.match(l)) for l in lines) >= 2


def _library_source(root: Path) -> dict[str, str]:
    "name -> source text of each top-level function of the library (grpo_nb/*.py), for the plotting helpers cells call."
    out = {}
    lib = root / "grpo_nb"
    for f in sorted(lib.glob("*.py")) if lib.is_dir() else []:
        text = f.read_text()
        for m in re.finditer(r"^def (\w+)\(.*?(?=^\S)", text + "\nEND", re.S | re.M): out[m.group(1)] = m.group(0)
    return out


MIN_FONT_PT = 8


def _figure_source(code: str, lib: dict[str, str]) -> str:
    "The cell's code plus the library functions it calls (plotting helpers), comments removed."
    called = set(re.findall(r"\b(\w+)\(", code))
    return re.sub(r"#.*", "", code + "\n" + "\n".join(lib[n] for n in called if n in lib))


def _figure_problems(code: str, n_axes: int, lib: dict[str, str]) -> list[str]:
    "Axis labels a figure lacks, judged from the cell's code plus the library functions it calls."
    text = _figure_source(code, lib)
    xs = len(re.findall(r"\b(?:set_)?xlabel\s*[(=]|supxlabel\(", text))
    ys = re.findall(r"\b(?:set_)?ylabel\s*[(=]|supylabel\(", text)
    bad = []
    if not xs: bad.append("no x-axis label")
    if not ys: bad.append("no y-axis label")
    elif n_axes > 1 and len(ys) < n_axes and not re.search(r"sharey\s*=\s*True|supylabel\(|for\s+\w+.*\bin\b[^\n]*\n(?:[ \t]+.*\n)*?[ \t]+.*set_ylabel", text):
        bad.append(f"{len(ys)} y-axis label(s) for {n_axes} panels")
    return bad


def check_notebooks(nbs: Path, root: Path | None = None) -> list[str]:
    "Problems in what readers see of the notebooks under `nbs` (prose and committed outputs): one line each, with the fix."
    nbs = Path(nbs)
    root = root or nbs.parent
    lib = _library_source(root)
    host = socket.gethostname().split(".")[0]
    problems: list[str] = []
    for path in sorted(p for p in nbs.rglob("*.ipynb") if not any(s.startswith((".", "_")) for s in p.relative_to(nbs).parts)):
        rel = path.relative_to(nbs).as_posix()
        try: cells = json.loads(path.read_text()).get("cells", [])
        except ValueError as e: problems.append(f"{rel}: not a notebook ({e})"); continue

        def add(i: int, what: str, excerpt: str, fix: str):
            ex = re.sub(r"\s+", " ", excerpt).strip()
            problems.append(f"{rel} cell {i}: {what}: {ex[:100]!r}. Fix: {fix}")

        for i, c in enumerate(cells):
            src = _src(c.get("source"))
            if c.get("cell_type") == "markdown":
                prose = _prose(src)
                for rx, what in MAKING_OF:
                    for m in rx.finditer(prose):
                        add(i, f"words about how the project was made ({what})", prose[max(0, m.start() - 40): m.end() + 40],
                            "say what the tool does, what was measured and what is not yet, without the history or the requests behind it")
                for block in re.findall(r"```[^\n]*\n(.*?)```", src, flags=re.S):
                    if _pipe_table_in(block):
                        add(i, "a pipe table inside a code block", block[:80], "write the table as markdown outside the fence")
                continue
            if c.get("cell_type") != "code": continue
            d = _directives(src)
            if "hide" in d or d.get("include") == "false" or d.get("output") == "false": continue
            outs = _visible_outputs(c)
            for kind, text in outs:
                if kind == "image":
                    if re.search(r"\bImage\(", src): continue                     # a saved file: checked where it is drawn
                    small = [float(x) for x in re.findall(r"fontsize\s*=\s*(\d+(?:\.\d+)?)\b", _figure_source(src, lib)) if float(x) < MIN_FONT_PT]
                    if small:
                        add(i, f"a figure with text of {min(small):g} pt", src.splitlines()[-1] if src.strip() else "",
                            f"use at least {MIN_FONT_PT:g} pt (fontsize=9 reads well at the page's width), and a larger figure if it crowds")
                    if re.search(r"axis\(\s*[\"']off|set_axis_off\(", src): continue   # a diagram without axes
                    m = re.search(r"with (\d+) Axes", text)
                    for b in _figure_problems(src, int(m.group(1)) if m else 1, lib):
                        add(i, f"a figure with {b}", src.splitlines()[-1] if src.strip() else "",
                            "label every axis with its quantity and unit (ax.set_xlabel('sequence length (tokens)'), ax.set_ylabel('GiB'))")
                    continue
                if kind == "error":
                    add(i, "a traceback in a committed output", text.splitlines()[0] if text else "",
                        "fix the cell, or show the error the way a user meets it (`test_fail`, or print the message)")
                    continue
                for rx, what in MACHINE_OUTPUT:
                    m = rx.search(text)
                    if m: add(i, f"output of the machine that built the page ({what})", text[max(0, m.start() - 40): m.end() + 40],
                              "print the point the cell makes, not the log: silence the logger, catch and summarise, or drop the line")
                if len(host) > 3 and host not in ("localhost",) and re.search(rf"\b{re.escape(host)}\b", text):
                    add(i, "output of the machine that built the page (its host name)", host, "do not print host names of the build machine")
                if kind in ("stream", "plain") and _pipe_table_in(text):
                    add(i, "a table printed as text (a pipe table in a code block)", text.strip().splitlines()[0],
                        "display it as a table: `IPython.display.Markdown(table_text)` or a DataFrame, with units in the header")
                shown = _prose(text) if kind == "markdown" else text
                for rx, what in MAKING_OF:
                    m = rx.search(shown)
                    if m: add(i, f"words about how the project was made ({what}) in an output", shown[max(0, m.start() - 40): m.end() + 40],
                              "change the text the cell prints (or the JSON field it reads) to say what is, not how it came to be")
                cut = [text[max(0, m.start() - 50): m.end() + 10] for rx in _RE_CUT for m in rx.finditer(text)][:1]
                if kind == "markdown": cut += _cut_cells(text)
                for c_ in cut[:1]:
                    add(i, "text cut mid-word", c_,
                        "show the whole text, or shorten at a word boundary with a mark (textwrap.shorten(s, width, placeholder=' …'))")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check_site.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path, nargs="?", help="folder of the built site (e.g. _site)")
    ap.add_argument("--notebooks", type=Path, metavar="NBS", help="also check what readers see of the notebooks in NBS (no browser needed)")
    ap.add_argument("--base-url", help="where the site is served already (default: serve it here on a free port)")
    ap.add_argument("--chromium", default=CHROMIUM, help="Chromium executable (default %(default)s)")
    ap.add_argument("--screenshot", metavar="PAGE:PNG", help="save a screenshot of PAGE (site-relative) to PNG")
    a = ap.parse_args(argv)
    if a.notebooks:
        found = check_notebooks(a.notebooks)
        if found:
            print(f"page check FAILED: {len(found)} problem(s) in what readers see of {a.notebooks}/:", file=sys.stderr)
            for p in found: print(f"  - {p}", file=sys.stderr)
            return 1
        print(f"page check passed: no build-machine output, making-of wording, table printed as text, unlabelled axis "
              f"or cut text in {a.notebooks}/.")
        if a.site is None: return 0
    if a.site is None: ap.error("give the site folder, --notebooks, or both")
    if not Path(a.chromium).exists():
        print(f"check_site.py: no Chromium at {a.chromium}. Fix: apt-get install -y --no-install-recommends chromium", file=sys.stderr)
        return 2
    if not site_pages(a.site):
        print(f"check_site.py: no .html pages under {a.site}. Fix: run `make docs` first.", file=sys.stderr)
        return 2
    shot = None
    if a.screenshot:
        pg, _, png = a.screenshot.partition(":")
        shot = (pg, Path(png))
    problems, n = check_site(a.site, a.base_url, a.chromium, shot)
    what = f"{n['pages']} pages, {n['links']} local links, {n['images']} images"
    if problems:
        print(f"browser test FAILED ({what}): {len(problems)} problem(s):", file=sys.stderr)
        for p in problems: print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"browser test passed: {what} checked in headless Chromium; no broken link, external request, "
          f"page or console error, unrendered math or missing image.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
