// Search box of the offline site: filters window.SITE_SEARCH (written by tools/site/render.py into
// site_libs/search.js, so it also works from file://). Every word typed must occur in a section's text or titles.
(function () {
  "use strict";
  var input = document.getElementById("search-input");
  var list = document.getElementById("search-results");
  var root = document.body.getAttribute("data-root") || "";
  var entries = (window.SITE_SEARCH || []).map(function (e) {
    return { e: e, hay: (e.p + " " + e.s + " " + e.x).toLowerCase() };
  });
  if (!input || !list) return;

  function escapeHtml(s) {
    return s.replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; });
  }

  function show() {
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.length) { list.hidden = true; list.innerHTML = ""; return; }
    var hits = entries.filter(function (x) {
      return words.every(function (w) { return x.hay.indexOf(w) >= 0; });
    }).slice(0, 20);
    list.innerHTML = hits.length ? hits.map(function (x) {
      var e = x.e;
      var i = e.x.toLowerCase().indexOf(words[0]);
      var snippet = i < 0 ? e.x.slice(0, 120) : e.x.slice(Math.max(0, i - 40), i + 80);
      return '<li><a href="' + escapeHtml(root + e.h) + '"><strong>' + escapeHtml(e.p) + "</strong>" +
        (e.s ? " › " + escapeHtml(e.s) : "") + "<span>" + escapeHtml(snippet) + "</span></a></li>";
    }).join("") : "<li class=\"none\">No match</li>";
    list.hidden = false;
  }

  input.addEventListener("input", show);
  input.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") { input.value = ""; show(); }
    if (ev.key === "Enter") { var a = list.querySelector("a"); if (a) window.location.href = a.href; }
  });
  document.addEventListener("click", function (ev) {
    if (!list.contains(ev.target) && ev.target !== input) list.hidden = true;
  });
})();
