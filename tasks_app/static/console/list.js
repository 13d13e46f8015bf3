// The task list's live cells (tasks_app.admin: live_status, live_progress, live_phase, each marked data-task-id):
// kept current from the tenant-wide stream /runtime/events, which sends {taskId, seq, type, data} for status,
// progress and terminal events of every task, without replay. Rows of other tasks are ignored; an event older than
// one already shown for its task is dropped. Written with textContent only. Without the stream the list is as the
// server rendered it.
(function () {
  "use strict";
  if (typeof window.EventSource !== "function") { return; }
  var cells = {};
  document.querySelectorAll("[data-task-id]").forEach(function (element) {
    var id = element.dataset.taskId;
    cells[id] = cells[id] || {};
    if (element.classList.contains("console-status")) { cells[id].status = element; }
    if (element.classList.contains("console-progress")) { cells[id].progress = element; }
    if (element.classList.contains("console-phase")) { cells[id].phase = element; }
  });
  if (Object.keys(cells).length === 0) { return; }
  var seen = {};

  function onTask(message) {
    var event;
    try { event = JSON.parse(message.data); } catch (error) { return; }
    var row = cells[event.taskId];
    if (!row || (seen[event.taskId] || 0) >= event.seq) { return; }
    seen[event.taskId] = event.seq;
    var data = event.data || {};
    if ((event.type === "status" || event.type === "terminal") && row.status && data.status) {
      row.status.textContent = data.status;
      if (data.message) { row.status.title = data.message; }
    }
    if (event.type === "progress") {
      if (row.progress && typeof data.progress === "number") {
        row.progress.querySelector("progress").value = data.progress;
        row.progress.querySelector(".console-percent").textContent = Math.round(data.progress * 100) + "%";
      }
      if (row.phase && data.phase !== undefined) { row.phase.textContent = data.phase || ""; }
    }
  }

  var source = new EventSource("/runtime/events");
  source.addEventListener("task", onTask);
  source.addEventListener("message", onTask);
})();
