// Render many TeX snippets with KaTeX in one process (called by tools/site/render.py).
//   node katex_batch.cjs <path to the katex package>  < [[tex, display], ...]  > [{html} | {error}, ...]
// The site then needs only katex.min.css and its fonts: no JavaScript runs in the reader's browser for math.
"use strict";
const katex = require(process.argv[2]);
let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (d) => { input += d; });
process.stdin.on("end", () => {
  const out = JSON.parse(input).map(([tex, display]) => {
    try {
      return { html: katex.renderToString(tex, { displayMode: display, throwOnError: true, output: "htmlAndMathml", strict: "ignore" }) };
    } catch (e) {
      return { error: String(e && e.message ? e.message : e) };
    }
  });
  process.stdout.write(JSON.stringify(out));
});
