// One clock on screen (tasks_app/templatetags/console_time.py): every time the console writes is in the project's
// zone (UTC), to the second, labelled; every age ("12 min") is measured against the DATABASE's clock. The page
// carries the database's now as it was rendered (<meta name="console-now">); the offset between it and this
// browser's clock corrects everything measured here, so a browser whose clock is minutes off still shows the ages
// the server would. Ages (<time data-age>) are rewritten every 5 s. task.js and list.js write their live times with
// consoleClock.format(consoleClock.now()).
(function () {
  "use strict";
  var meta = document.querySelector('meta[name="console-now"]');
  var rendered = meta ? Date.parse(meta.content) : NaN;
  var offset = isNaN(rendered) ? 0 : rendered - Date.now();  // database minus browser, as of loading

  function now() { return new Date(Date.now() + offset); }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // "2026-12-02 05:59:38 UTC", the same text as console_time.time_text.
  function format(date) {
    return date.getUTCFullYear() + "-" + pad(date.getUTCMonth() + 1) + "-" + pad(date.getUTCDate()) + " " +
      pad(date.getUTCHours()) + ":" + pad(date.getUTCMinutes()) + ":" + pad(date.getUTCSeconds()) + " UTC";
  }

  // The same steps as console_time.age_text.
  function age(seconds) {
    seconds = Math.max(Math.floor(seconds), 0);
    if (seconds < 60) { return seconds + " s"; }
    var minutes = Math.floor(seconds / 60);
    if (minutes < 60) { return minutes + " min"; }
    var hours = Math.floor(minutes / 60); minutes = minutes % 60;
    if (hours < 24) { return hours + " h" + (minutes ? " " + minutes + " min" : ""); }
    var days = Math.floor(hours / 24); hours = hours % 24;
    return days + " d" + (hours ? " " + hours + " h" : "");
  }

  function refresh(scope) {
    (scope || document).querySelectorAll("time[data-age]").forEach(function (element) {
      var at = Date.parse(element.getAttribute("datetime"));
      if (!isNaN(at)) { element.textContent = age((now() - at) / 1000) + (element.dataset.suffix || ""); }
    });
  }

  window.consoleClock = { now: now, format: format, age: age, refresh: refresh };
  setInterval(refresh, 5000);
})();
