// The task list, live (tasks_app.admin: live_status, live_progress, live_phase, each marked data-task-id): kept
// current from the tenant-wide stream /runtime/events (every tenant's, for staff), which sends {taskId, seq, type,
// data} for status, progress and terminal events of every task, without replay.
// - A row's status badge (its words and colour, as console.status_shown writes them), its "in this status for"
//   age (restarted by the database's clock, clock.js), its progress, steps and phase change in place. An event
//   older than one already shown for its task is dropped.
// - An event of a task the list does not show (a new task, or one that now matches the filters) re-reads the list
//   as the server renders it for the same URL — filters, search, order and page kept — at most once every
//   RELOAD_MS, and only while no row is selected for a bulk action (a person mid-choice keeps their rows).
// Written with textContent only. Without the stream the list is as the server rendered it.
(function () {
  "use strict";
  if (typeof window.EventSource !== "function" || !document.getElementById("changelist")) { return; }
  var RELOAD_MS = 3000;
  var cells = {}, seen = {}, reloadTimer = null, lastReload = 0;

  function bind() {
    cells = {};
    document.querySelectorAll("#changelist [data-task-id]").forEach(function (element) {
      var id = element.dataset.taskId;
      cells[id] = cells[id] || {};
      if (element.classList.contains("console-status")) { cells[id].status = element; }
      if (element.classList.contains("console-progress")) { cells[id].progress = element; }
      if (element.classList.contains("console-phase")) { cells[id].phase = element; }
    });
  }

  function label(status, message) {
    return status === "cancelled" && (message || "").indexOf("Killed by ") === 0 ? "cancelled (killed)" : status;
  }

  function setStatus(row, data) {
    var badge = row.status.querySelector(".console-badge");
    var before = badge ? badge.className : "";
    if (badge) {
      badge.textContent = label(data.status, data.message);
      badge.className = "console-badge console-status-" + data.status;
    }
    if (data.message) { row.status.title = data.message; }
    var age = row.status.querySelector("time[data-age]");
    if (age && window.consoleClock && before !== (badge && badge.className)) {
      age.setAttribute("datetime", window.consoleClock.now().toISOString());
      age.textContent = "0 s";
    }
  }

  function selecting() { return !!document.querySelector("#result_list input.action-select:checked"); }

  function reloadSoon() {
    if (reloadTimer) { return; }
    reloadTimer = setTimeout(reload, Math.max(RELOAD_MS - (Date.now() - lastReload), 200));
  }

  function reload() {
    reloadTimer = null;
    if (selecting()) { notice(); return; }
    lastReload = Date.now();
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        // The table, its counters and paginator (the form) and the search bar's count; not the filters, whose
        // open/closed state the admin's own script keeps. Never while a person types a search.
        if (document.activeElement && document.activeElement.id === "searchbar") { notice(); return; }
        ["toolbar", "changelist-form"].forEach(function (id) {
          var part = fresh.getElementById(id), here = document.getElementById(id);
          if (part && here) { here.replaceWith(document.adoptNode(part)); }
        });
        bind();
        // Django's actions.js holds the checkboxes it found at load: hand it the new ones (its listeners on the
        // replaced table went with it; the ones left on the page act on detached rows, harmlessly).
        var boxes = document.querySelectorAll("tr input.action-select");
        if (window.Actions && boxes.length) { window.Actions(boxes); }
        if (window.consoleClock) { window.consoleClock.refresh(); }
        var note = document.getElementById("console-list-notice");
        if (note) { note.hidden = true; }
      })
      .catch(function () { /* the next event tries again */ });
  }

  // A person has rows selected: say that the list changed instead of replacing it under them.
  function notice() {
    var note = document.getElementById("console-list-notice");
    if (!note) {
      note = document.createElement("p");
      note.id = "console-list-notice";
      note.className = "console-notice";
      var form = document.getElementById("changelist");
      form.parentNode.insertBefore(note, form);
    }
    note.textContent = "Tasks changed or were created since this list was loaded. ";
    var link = document.createElement("a");
    link.href = window.location.href;
    link.textContent = "Show them";
    note.appendChild(link);
    note.hidden = false;
  }

  function onTask(message) {
    var event;
    try { event = JSON.parse(message.data); } catch (error) { return; }
    if (!event.taskId || (seen[event.taskId] || 0) >= event.seq) { return; }
    seen[event.taskId] = event.seq;
    var row = cells[event.taskId];
    var data = event.data || {};
    if (!row) {
      if (event.type === "status" || event.type === "terminal") { reloadSoon(); }  // not progress: it is chatty
      return;
    }
    if ((event.type === "status" || event.type === "terminal") && row.status && data.status) { setStatus(row, data); }
    if (event.type === "progress") {
      if (row.progress && typeof data.progress === "number") {
        row.progress.querySelector("progress").value = data.progress;
        row.progress.querySelector(".console-percent").textContent = Math.round(data.progress * 100) + "%";
        var steps = row.progress.querySelector(".console-steps");
        if (steps && data.stepsCompleted !== undefined) {
          steps.textContent = steps.textContent.replace(/^\d+/, String(data.stepsCompleted));
        }
      }
      if (row.phase && data.phase !== undefined) { row.phase.textContent = data.phase || ""; }
    }
  }

  bind();
  var source = new EventSource("/runtime/events");
  source.addEventListener("task", onTask);
  source.addEventListener("message", onTask);
})();
