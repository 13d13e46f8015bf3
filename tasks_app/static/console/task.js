// The task page's live parts (templates/console/task_panel.html): status, progress bar, phase, steps, version, the
// event tail, checkpoints and artifacts, kept current from the task's Server-Sent Events stream.
//
// The stream sends a `task.snapshot` first ({seq, snapshot}), then each task event in seq order ({seq, type, data}).
// A gap in seq means events were missed: the page re-reads the snapshot instead of guessing. After `terminal` the
// page closes the stream (EventSource would otherwise reconnect and be sent the terminal state again).
// An agent task's page also shows the model's text as it is written (`llm.delta`, live only: no seq, never stored)
// in a "writing" bubble, which the committed answer (`llm.message`, then the conversation re-read) replaces.
// Everything is written with textContent, never as HTML. Without EventSource or the stream, the page stays as the
// server rendered it, which is correct as of its loading.
//
// The steering form sends the version the person SAW (its expected_version, as the server rendered it), never one
// the page learned later: when the task changes under an open page (another tab, another operator), the page says
// what changed and by whom, and a button pressed on the old view asks first ("the task changed… act on it as it is
// now?"). Without this script the server refuses the stale version with a 409 written for a person.
(function () {
  "use strict";
  var root = document.getElementById("console-task");
  if (!root || typeof window.EventSource !== "function") { return; }

  var TERMINAL = ["completed", "failed", "cancelled"];
  var TAIL = Math.max(Number(root.dataset.tail) || 0, 30);
  var lastSeq = Number(root.dataset.seq) || 0;
  var status = root.dataset.status;
  var source = null;
  var versionInput = root.querySelector('[data-field="expected-version"]');
  var seenVersion = versionInput ? Number(versionInput.value) : null;  // what the person saw: what the form sends
  var currentVersion = seenVersion;
  var changes = [];  // what changed since seenVersion: "pause by user:alice at 12:03:04", from steering events
  // Buttons that cannot be taken back: each asks first, saying what will happen.
  var DESTRUCTIVE = {
    cancel: "Cancel this task? It stops at its next safe point: the running step finishes, steps done stay done, " +
            "and effects already made are not undone.",
    kill: "Kill this task now? It stops at once, without waiting for its running step; an effect that step had " +
          "started is left for the ledger to reconcile."
  };

  function field(name) { return root.querySelector('[data-field="' + name + '"]'); }
  function setText(name, value) { var el = field(name); if (el) { el.textContent = value; } }

  function setProgress(progress) {
    if (typeof progress !== "number") { return; }
    var bar = field("progress");
    if (bar) { bar.value = progress; }
    setText("percent", Math.round(progress * 100) + "%");
  }

  // The badge's words and colour, as console.status_shown writes them: a kill shows as "cancelled (killed)", a wait
  // as input or approval (the kind comes with the input_required event, before the status event).
  var waitKind = null;
  function statusLabel(internal, message) {
    if (internal === "cancelled" && (message || field("message").textContent).indexOf("Killed by ") === 0) {
      return "cancelled (killed)";
    }
    if (internal === "input_required" && waitKind) { return internal + " (" + waitKind + ")"; }
    return internal;
  }

  function setStatus(internal, message) {
    if (!internal) { return; }
    var before = status;
    status = internal;
    root.dataset.status = internal;
    if (message) { setText("message", message); }
    var badge = field("status");
    if (badge) {
      badge.textContent = statusLabel(internal, message);
      badge.className = "console-badge console-status-" + internal;
    }
    if (before !== internal) { sinceNow(); retitle(before, internal); }
    // The steering buttons that apply in this status (each says where in data-when).
    root.querySelectorAll("[data-when]").forEach(function (button) {
      button.hidden = button.dataset.when.split(" ").indexOf(internal) < 0;
    });
    var steer = root.querySelector("#console-steer");
    if (steer) { steer.hidden = !steer.querySelector("[data-when]:not([hidden])"); }  // (a finished task: none)
    // The parts rendered for one status (the open wait, the dead-letter box) are re-read with the others.
    if (before !== internal) { refreshSoon(); }
  }

  // "for 12 s": the status just changed, by the database's clock (clock.js).
  function sinceNow() {
    var since = root.querySelector('[data-live="since"]');
    if (!since || !window.consoleClock) { return; }
    var time = document.createElement("time");
    time.className = "console-age";
    time.setAttribute("datetime", window.consoleClock.now().toISOString());
    time.dataset.age = "";
    time.textContent = "0 s";
    since.textContent = "for ";
    since.appendChild(time);
  }

  // The page's heading and title name the status as of loading ("greeting <id> (working)"): keep them current.
  function retitle(before, after) {
    var suffix = " (" + before + ")";
    var heading = document.querySelector("#content > h2");
    [heading, document.querySelector("title")].forEach(function (element) {
      if (element && element.textContent.indexOf(suffix) >= 0) {
        element.textContent = element.textContent.replace(suffix, " (" + after + ")");
      }
    });
  }

  // -- The model's text as it is written (agents_app.agent publishes it as `llm.delta` {turn, offset, text}) -----------
  // Pieces of one turn are appended in order; a piece of an older turn, or of a turn whose answer is committed, is
  // dropped (it came late). The committed answer (the llm.message event) ends the bubble: it shows the answer's
  // excerpt until a re-read of the panel that started after it brings the message itself, then it goes.
  function liveTextAdd(writing, data, committedTurn) {
    var turn = Number(data && data.turn) || 0;
    var text = data && typeof data.text === "string" ? data.text : "";
    if (!turn || turn <= committedTurn || (writing && writing.turn > turn)) { return writing; }
    var before = writing && writing.turn === turn && !writing.done ? writing.text : "";
    // `offset`: the characters this model call had sent before this piece. Less than the bubble holds: the turn's
    // call started again (its step ran again after a failure or a crash): what the first call wrote is dropped.
    var offset = data && typeof data.offset === "number" ? data.offset : before.length;
    if (offset < before.length) { before = before.slice(0, offset); }
    return { turn: turn, text: before + text, done: false, doneAt: 0 };
  }
  function liveTextCommitted(writing, data, now) {
    var turn = Number(data && data.turn) || 0;
    if (!writing || writing.turn > turn) { return writing; }
    var content = data && typeof data.content === "string" && data.content ? data.content : writing.text;
    return { turn: writing.turn, text: content, done: true, doneAt: now };
  }
  function liveTextRefreshed(writing, startedAt, committedTurn) {
    if (!writing) { return null; }
    if (writing.done ? startedAt >= writing.doneAt : writing.turn <= committedTurn) { return null; }
    return writing;
  }
  // -- end of the model's text --

  var writing = null;
  var committedTurn = 0;
  function turnsShown() {
    var counter = root.querySelector('[data-counter="turns"]');
    return counter ? Number(counter.textContent) || 0 : 0;
  }
  committedTurn = turnsShown();

  function renderWriting() {
    var bubble = field("writing");
    if (!bubble) { return; }
    if (!writing) { bubble.hidden = true; setText("writing-text", ""); return; }
    setText("writing-turn", String(writing.turn));
    setText("writing-label", writing.done ? "The model answered" : "The model is writing\u2026");
    setText("writing-text", writing.text);
    bubble.hidden = false;
  }

  function onLive(message) {
    var item;
    try { item = JSON.parse(message.data); } catch (error) { return; }
    if (item && item.type === "llm.delta") {
      writing = liveTextAdd(writing, item.data, committedTurn);
      renderWriting();
    }
  }

  // The parts marked data-live (steps, timeline, ledger, checkpoints, artifacts, the wait, the dead letter, the
  // steering history, an agent's conversation and counters) are re-read from the server's own rendering of this panel (…/panel/), at most once every
  // REFRESH_MS and one read at a time, after events that change them. The steering form is never replaced: it
  // keeps the version the person saw.
  var REFRESH_MS = 2000;
  var refreshTimer = null, refreshing = false, lastRefresh = 0;
  function refreshSoon() {
    if (refreshTimer || !root.dataset.panelUrl) { return; }
    var wait = Math.max(REFRESH_MS - (Date.now() - lastRefresh), 150);
    refreshTimer = setTimeout(refresh, wait);
  }

  function adopt(node) { return document.adoptNode(node); }

  function refresh() {
    refreshTimer = null;
    if (refreshing) { refreshSoon(); return; }
    refreshing = true;
    lastRefresh = Date.now();
    var started = lastRefresh;
    fetch(root.dataset.panelUrl, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        fresh.querySelectorAll("[data-live]").forEach(function (part) {
          var here = root.querySelector('[data-live="' + part.dataset.live + '"]');
          if (here) { here.replaceChildren.apply(here, Array.from(part.childNodes).map(adopt)); }
        });
        if (window.consoleClock) { window.consoleClock.refresh(root); }
        committedTurn = Math.max(committedTurn, turnsShown());
        writing = liveTextRefreshed(writing, started, committedTurn);
        renderWriting();
      })
      .catch(function () { /* the next event tries again */ })
      .then(function () { refreshing = false; });
  }

  function setVersion(version) {
    if (version === undefined || version === null) { return; }
    setText("version", String(version));
    currentVersion = Math.max(currentVersion || 0, version);
    showChanged();
  }

  // The task moved on from the version the form would send: say so beside the buttons (never swap the version).
  function showChanged() {
    var box = field("changed");
    if (!box || seenVersion === null) { return; }
    if (!(currentVersion > seenVersion)) { box.hidden = true; return; }
    box.textContent = "This task changed since you looked at it (version " + seenVersion + ", now " +
      currentVersion + "): " + (changes.length ? changes.join("; ") : "a command was accepted") + ". It is " +
      status + " now. ";
    var take = document.createElement("button");
    take.type = "button";
    take.textContent = "I have seen it: act on it as it is now";
    take.addEventListener("click", acknowledge);
    box.appendChild(take);
    box.hidden = false;
  }

  function acknowledge() {
    seenVersion = currentVersion;
    changes = [];
    if (versionInput) { versionInput.value = String(currentVersion); }
    showChanged();
  }

  function noteChange(data) {
    if (typeof data.version !== "number" || seenVersion === null || data.version <= seenVersion) { return; }
    changes.push((data.type || "a command") + " by " + (data.requestedBy || "an unnamed caller") + " at " + time());
    setVersion(data.version);
  }

  var form = root.querySelector("#console-steer");
  if (form) {
    form.addEventListener("submit", function (event) {
      var type = event.submitter ? event.submitter.value : "";
      var stale = currentVersion > seenVersion;
      var question = stale ? "This task changed since you looked at it: " +
        (changes.length ? changes.join("; ") : "version " + seenVersion + " is now " + currentVersion) +
        ". It is " + status + " now. " + (type || "Act") + " it as it is now?" : DESTRUCTIVE[type];
      if (!question) { return; }
      if (!window.confirm(question)) { event.preventDefault(); return; }
      if (stale) { acknowledge(); }  // the form is read after this handler: it sends the version just confirmed
    });
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
  function percent(value) { return Math.round((Number(value) || 0) * 100) + "%"; }
  function planText(runs) {
    if (!runs || !runs.length) { return "nothing"; }
    return runs.map(function (run) {
      var name = Array.isArray(run) ? run[0] : run, count = Array.isArray(run) ? run[1] : 1;
      return count !== 1 ? name + " \u00d7" + count : String(name);
    }).join(", ");
  }
  function summary(type, data) {
    switch (type) {
      case "status": return (data.status || "") + ": " + (data.message || "");
      case "progress": return percent(data.progress) + " — step " + (data.stepsCompleted || "") +
        " " + (data.step || "") + (data.phase ? " (" + data.phase + ")" : "") +
        (data.effects && data.effects.length ? "; effects " + data.effects.join(", ") : "");
      case "log": return "step " + (data.step || "") + ": " + (data.message || "");
      case "artifact": return (data.name || "") + " (" + (data.bytes || "") + " bytes)";
      case "checkpoint": return "checkpoint " + (data.sequence || "") + " (" + (data.bytes || "") + " bytes)";
      case "effect": return "effect " + (data.name || "") + ": " + (data.status || "") + " (key " + (data.key || "") + ")";
      case "steering.applied": case "steering.rejected":
        var applied = type === "steering.applied";
        var text = (data.type || "") + " by " + (data.requestedBy || "an unnamed caller") + (applied ? " applied" : " rejected");
        if (applied && data.version !== undefined && data.version !== null) { text += " (version " + data.version + ")"; }
        var why = data.why || data.reason;
        return why ? text + ": " + why : text;
      case "plan.adjusted": return "plan " + (data.oldPlanVersion || "") + " \u2192 " + (data.newPlanVersion || "") +
        " from step " + (data.fromStep || "") + ": was " + planText(data.oldPlan) + "; now " + planText(data.newPlan);
      case "task.forked": return "forked from " + (data.from || "") + " at step " + (data.fromStep || "") + ": " +
        ((data.inherited || {}).steps !== undefined ? data.inherited.steps : "") + " steps inherited, " +
        (data.repeatsCount !== undefined ? data.repeatsCount : "") + " effects may run again after approval";
      case "task.snapshot": return "recovered: resumes after step " + (data.stepsCompleted || "") +
        (data.checkpoint !== undefined && data.checkpoint !== null ? ", from checkpoint " + data.checkpoint : "");
      case "tool.call": return "call " + (data.tool || "") + " (key " + (data.key || "") + ")";
      case "tool.result": return (data.tool || "") + ": " + (data.outcome || "") +
        (data.ms !== undefined && data.ms !== null ? " in " + data.ms + " ms" : "");
      case "tool.denied": return (data.tool || "") + " denied by " + (data.rule || "");
      case "tool.flagged": return (data.tool || "") + " result flagged (" + (data.rules || []).join(", ") + "): " +
        (data.action || "");
      case "llm.message": return "turn " + (data.turn || "") + " (" + (data.model || "") + "): " +
        (data.toolCalls && data.toolCalls.length ? "calls " + data.toolCalls.join(", ") : "answered") +
        " \u2014 " + (data.tokensIn !== undefined ? data.tokensIn : "") + " tokens in, " +
        (data.tokensOut !== undefined ? data.tokensOut : "") + " out, cost " + (data.cost || "");
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
    if (tableId === "console-events") { row.dataset.type = cells[1]; row.hidden = !shown(cells[1]); }
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

  // Live rows are stamped by the database's clock as this page knows it (clock.js), in its zone, labelled.
  function time() {
    return window.consoleClock ? window.consoleClock.format(window.consoleClock.now()) : new Date().toISOString();
  }

  // The event tail's type filter: rows of other types are hidden, the ones that arrive later too.
  var typeFilter = field("event-type");
  function shown(type) { return !typeFilter || !typeFilter.value || typeFilter.value === type; }
  if (typeFilter) {
    typeFilter.closest(".console-filter").hidden = false;
    typeFilter.addEventListener("change", function () {
      root.querySelectorAll("#console-events tbody tr[data-type]").forEach(function (row) {
        row.hidden = !shown(row.dataset.type);
      });
    });
  }

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
    else if (type === "steering.applied" || type === "steering.rejected") { noteChange(data); reread(); }
    else if (type === "task.snapshot") { reread(); }
    else if (type === "input_required") { waitKind = data.kind || null; setStatus("input_required"); }
    else if (type === "terminal") { setStatus(data.status); reread(); stop(); }
    else if (type === "llm.message") {
      committedTurn = Math.max(committedTurn, Number(data.turn) || 0);
      writing = liveTextCommitted(writing, data, Date.now());
      renderWriting();
    }
    if (type !== "log") { refreshSoon(); }  // steps, ledger, checkpoints, the wait, the steering history
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

  // Every event type the runtime writes (tasks_app.events.EVENT_TYPES, rendered into the page): an SSE event of a
  // type nobody listens for is dropped by EventSource, so the list comes from the one place that defines it.
  var TYPES = (root.dataset.eventTypes || "").split(" ").filter(Boolean);
  // And the live-only items (tasks_app.streaming.LIVE_ONLY_TYPES): no id, no seq, never replayed.
  var LIVE_TYPES = (root.dataset.liveTypes || "").split(" ").filter(Boolean);

  function start() {
    source = new EventSource(root.dataset.streamUrl);
    TYPES.forEach(function (type) { source.addEventListener(type, onEvent); });
    LIVE_TYPES.forEach(function (type) { source.addEventListener(type, onLive); });
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
