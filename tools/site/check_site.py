#!/usr/bin/env python
"""Open every page of a static site in headless Chromium and list everything wrong with it.

    python tools/site/check_site.py _site                                # serves the folder itself on 127.0.0.1
    python tools/site/check_site.py _site --base-url http://127.0.0.1:PORT/   # a server already runs there
    python tools/site/check_site.py _site --screenshot page.html:out.png     # also save a screenshot of one page

Fails (exit 1, one line per problem) on: a local link to a page or file that does not exist, or to an #anchor the
target page does not have; any request to a host other than 127.0.0.1/localhost (blocked, then reported); any page
error (uncaught exception) or console error (a failed resource included); TeX left unrendered in visible text
(`$$`, `\\(`, `\\[`, `$..$` with TeX in it) or a KaTeX error element; an <img> that did not load (naturalWidth 0)
or a plot output that is only its text (`<Figure size 640x480 with 1 Axes>`).
Uses the system Chromium (Debian package `chromium`), never a downloaded one.
"""
from __future__ import annotations

import argparse, functools, posixpath, re, sys, tempfile, threading
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
  const katexErrors = [...document.querySelectorAll('.katex-error')].map(e => (e.getAttribute('title') || '') + ' :: ' + e.textContent);
  return {ids, links, images, text: texts.join(''), katexErrors, figureReprs};
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check_site.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path, help="folder of the built site (e.g. _site)")
    ap.add_argument("--base-url", help="where the site is served already (default: serve it here on a free port)")
    ap.add_argument("--chromium", default=CHROMIUM, help="Chromium executable (default %(default)s)")
    ap.add_argument("--screenshot", metavar="PAGE:PNG", help="save a screenshot of PAGE (site-relative) to PNG")
    a = ap.parse_args(argv)
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
