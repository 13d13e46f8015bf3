// The overview (admin …/task/overview/) is drawn by the server; this re-reads it every data-refresh-seconds while
// the tab is visible and swaps in the new #console-overview (HTML the server escaped, parsed, never built from
// strings here). Without it, the page is current as of its loading.
(function () {
  "use strict";
  var current = document.getElementById("console-overview");
  if (!current || typeof window.fetch !== "function" || typeof window.DOMParser !== "function") { return; }
  var seconds = Number(current.dataset.refreshSeconds) || 30;

  function refresh() {
    if (document.visibilityState !== "visible") { return; }
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("console-overview");
        var shown = document.getElementById("console-overview");
        if (fresh && shown) { shown.replaceWith(document.adoptNode(fresh)); }
      })
      .catch(function () { /* try again at the next tick */ });
  }

  window.setInterval(refresh, seconds * 1000);
})();
