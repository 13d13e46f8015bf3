// The task page's live parts (templates/console/task_panel.html): status, progress bar, phase, steps, version, the
// event tail, checkpoints and artifacts, kept current from the task's Server-Sent Events stream.
//
// The stream sends a `task.snapshot` first ({seq, snapshot}), then each task event in seq order ({seq, type, data}).
// A gap in seq means events were missed: the page re-reads the snapshot instead of guessing. After `terminal` the
// page closes the stream (EventSource would otherwise reconnect and be sent the terminal state again).
// Everything is written with textContent, never as HTML. Without EventSource or the stream, the page stays as the
// server rendered it, which is correct as of its loading.
(function () {
  "use strict";
  var root = document.getElementById("console-task");
  if (!root || typeof window.EventSource !== "function") { return; }

  var TERMINAL = ["completed", "failed", "cancelled"];
  var TAIL = Math.max(Number(root.dataset.tail) || 0, 30);
  var lastSeq = Number(root.dataset.seq) || 0;
  var status = root.dataset.status;
  var source = null;

  function field(name) { return root.querySelector('[data-field="' + name + '"]'); }
  function setText(name, value) { var el = field(name); if (el) { el.textContent = value; } }

  function setProgress(progress) {
    if (typeof progress !== "number") { return; }
    var bar = field("progress");
    if (bar) { bar.value = progress; }
    setText("percent", Math.round(progress * 100) + "%");
  }

  function notice(message) {
    var el = field("notice");
    if (!el) { return; }
    el.textContent = message + " ";
    var reload = document.createElement("a");
    reload.href = window.location.pathname;
    reload.textContent = "Reload the page";
    el.appendChild(reload);
    el.hidden = false;
  }

  function setStatus(internal, message) {
    if (!internal) { return; }
    var before = status;
    status = internal;
    root.dataset.status = internal;
    setText("status", internal);
    if (message) { setText("message", message); }
    // The steering buttons that apply in this status (each says where in data-when).
    root.querySelectorAll("[data-when]").forEach(function (button) {
      button.hidden = button.dataset.when.split(" ").indexOf(internal) < 0;
    });
    var steer = root.querySelector("#console-steer");
    if (steer) { steer.hidden = !steer.querySelector("[data-when]:not([hidden])"); }  // (a finished task: none)
    // Parts rendered by the server for one status (the open wait, the dead-letter box) go stale when it changes.
    var statusBound = { input_required: "wait", dead_lettered: "dead-letter" };
    if (before !== internal && (statusBound[before] || statusBound[internal])) {
      notice("The task is " + internal + " now; what this page shows about its wait or dead letter is from before.");
    }
  }

  function setVersion(version) {
    if (version === undefined || version === null) { return; }
    setText("version", String(version));
    var input = field("expected-version");
    if (input) { input.value = String(version); }
  }

  function applySnapshot(snapshot) {
    if (!snapshot) { return; }
    setStatus(snapshot.internalStatus, snapshot.statusMessage);
    setProgress(snapshot.progress);
    setText("phase", snapshot.phase || "—");
    if (snapshot.stepsCompleted !== undefined) { setText("steps", String(snapshot.stepsCompleted)); }
    setVersion(snapshot.stateVersion);
    if (TERMINAL.indexOf(snapshot.internalStatus) >= 0) { stop(); }
  }

  // Re-read the REST snapshot (with the session): after a gap, a recovery, or a steering outcome (new version).
  function reread() {
    fetch(root.dataset.snapshotUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(applySnapshot)
      .catch(function () { /* the stream goes on; the next event or gap tries again */ });
  }

  // One line per event: the same wording as tasks_app.web.console.event_summary renders for the page's first rows.
  function summary(type, data) {
    switch (type) {
      case "status": return (data.status || "") + ": " + (data.message || "");
      case "progress": return Math.round((data.progress || 0) * 100) + "% — step " + (data.stepsCompleted || "") +
        " " + (data.step || "") + (data.phase ? " (" + data.phase + ")" : "");
      case "log": return "step " + (data.step || "") + ": " + (data.message || "");
      case "artifact": return (data.name || "") + " (" + (data.bytes || "") + " bytes)";
      case "checkpoint": return "checkpoint " + (data.sequence || "") + " (" + (data.bytes || "") + " bytes)";
      case "steering.applied": case "steering.rejected":
        return [data.type, data.why || data.reason].filter(Boolean).join(" ");
      case "terminal": return data.status || "";
      case "input_required": return (data.kind || "") + " " + (data.name || "") + ": " + (data.prompt || "");
      default: return "";
    }
  }

  function prependRow(tableId, cells, limit) {
    var body = root.querySelector("#" + tableId + " tbody");
    if (!body) { return; }
    body.querySelectorAll(".console-empty").forEach(function (row) { row.remove(); });
    var row = document.createElement("tr");
    cells.forEach(function (value) {
      var cell = document.createElement("td");
      cell.textContent = value;
      row.appendChild(cell);
    });
    body.insertBefore(row, body.firstChild);
    while (limit && body.rows.length > limit) { body.deleteRow(body.rows.length - 1); }
  }

  function addArtifact(data) {
    var list = root.querySelector("#console-artifacts");
    if (!list || !data.name) { return; }
    list.querySelectorAll(".console-empty").forEach(function (item) { item.remove(); });
    list.querySelectorAll("li").forEach(function (item) { if (item.dataset.name === data.name) { item.remove(); } });
    var item = document.createElement("li");
    item.dataset.name = data.name;
    var link = document.createElement("a");
    link.href = root.dataset.artifactsUrl + encodeURIComponent(data.name);
    link.textContent = data.name;
    item.appendChild(link);
    item.appendChild(document.createTextNode(" (" + data.bytes + " bytes)"));
    list.appendChild(item);
  }

  function time() { return new Date().toTimeString().slice(0, 8); }

  function handle(type, data, seq) {
    prependRow("console-events", [String(seq), type, time(), summary(type, data)], TAIL);
    if (type === "status") { setStatus(data.status, data.message); }
    else if (type === "progress") {
      setProgress(data.progress);
      if (data.phase !== undefined) { setText("phase", data.phase || "—"); }
      if (data.stepsCompleted !== undefined) { setText("steps", String(data.stepsCompleted)); }
    }
    else if (type === "checkpoint") { prependRow("console-checkpoints", [String(data.sequence), String(data.bytes), time(), ""]); }
    else if (type === "artifact") { addArtifact(data); }
    else if (type === "steering.applied" || type === "steering.rejected" || type === "task.snapshot") { reread(); }
    else if (type === "input_required") { setStatus("input_required"); }
    else if (type === "terminal") { setStatus(data.status); reread(); stop(); }
  }

  function onEvent(message) {
    var event;
    try { event = JSON.parse(message.data); } catch (error) { return; }
    if (typeof event.seq !== "number") { return; }
    if (event.snapshot) {  // the stream's first event: the whole snapshot as of `seq`
      lastSeq = Math.max(lastSeq, event.seq);
      applySnapshot(event.snapshot);
      return;
    }
    if (event.seq <= lastSeq) { return; }  // already on the page (rendered by the server, or sent before)
    var gap = event.seq !== lastSeq + 1;
    lastSeq = event.seq;
    handle(event.type, event.data || {}, event.seq);
    if (gap) { reread(); }
  }

  function stop() {
    if (source) { source.close(); source = null; }
    setText("live", "");
    var live = field("live");
    if (live) { live.hidden = true; }
  }

  var TYPES = ["task.snapshot", "status", "progress", "log", "artifact", "checkpoint", "effect", "steering.applied",
               "steering.rejected", "input_required", "plan.adjusted", "terminal"];

  function start() {
    source = new EventSource(root.dataset.streamUrl);
    TYPES.forEach(function (type) { source.addEventListener(type, onEvent); });
    source.addEventListener("message", onEvent);
    source.onopen = function () { var live = field("live"); if (live) { live.textContent = "● live"; live.hidden = false; } };
    source.onerror = function () {
      var live = field("live");
      if (live) { live.hidden = true; }
      // EventSource retries by itself; a 4xx answer (no stream for this page) closes it for good: stay static.
      if (source && source.readyState === EventSource.CLOSED) { source = null; }
    };
  }

  if (TERMINAL.indexOf(status) < 0) { start(); }
})();
