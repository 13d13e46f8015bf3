"""The console's pages as a person reads them: one clock (every time in one zone, labelled, to the second; ages by
the database's clock), the list (status words and colours, time in state, id-prefix and goal search), the task
page's live parts (…/panel/), the step timeline, a readable line for every event type — the same line from the
server and from task.js — and the "all events" page showing each event's data.

What moves in a browser is checked by tests/test_console_browser.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.db import connection
from django.utils import timezone

from tasks_app import events
from tasks_app.models import Step, Task, TaskEvent
from tasks_app.selectors import task_id_prefix_bounds
from tasks_app.templatetags.console_time import age_text, time_text
from tasks_app.web import console
from tests.engine_support import drive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

LABELLED_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def page(client, path: str, **params) -> str:
    response = client.get(path, params)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# -- one clock --------------------------------------------------------------------------------------------------------
def test_it_writes_every_time_in_one_zone_labelled_to_the_second(new_task, admin_client):
    task = new_task(steps=3)
    drive(task.id)
    pages = {
        "list": page(admin_client, "/admin/tasks_app/task/"),
        "task": page(admin_client, f"/admin/tasks_app/task/{task.id}/change/"),
        "events": page(admin_client, f"/admin/tasks_app/task/{task.id}/history/events/"),
        "steps": page(admin_client, f"/admin/tasks_app/task/{task.id}/history/steps/"),
        "overview": page(admin_client, "/admin/tasks_app/task/overview/"),
    }

    for name, text in pages.items():
        # Django's English default ("Dec. 2, 2026, 5:59 a.m.") has neither the seconds nor the zone.
        assert not re.search(r"\b[ap]\.m\.", text), name
        assert '<meta name="console-now" content="' in text and "/static/console/clock.js" in text, name
    for name in ("task", "events", "steps"):
        assert LABELLED_TIME.search(pages[name]), name
    # The task page's read-only fields (created, updated…) are written the same way by the admin itself.
    created = Task.objects.get(id=task.id).created_at
    assert time_text(created) in pages["task"]
    # The list writes ages (kept current by clock.js) with the exact time in their title.
    assert re.search(rf'<time class="console-age" datetime="[^"]+" title="{re.escape(time_text(created))}" data-age '
                     r'data-suffix=" ago">\d+ s ago</time>', pages["list"])


def test_it_measures_ages_by_the_databases_clock_and_writes_them_as_clock_js_does():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        database_now = cursor.fetchone()[0]
    old = Task(created_at=database_now - timedelta(minutes=12, seconds=5))

    assert [age_text(s) for s in (0, 59, 60, 3599, 3600, 3660, 86400, 90000)] == \
        ["0 s", "59 s", "1 min", "59 min", "1 h", "1 h 1 min", "1 d", "1 d 1 h"]
    assert time_text(timezone.now().replace(year=2026, month=12, day=2, hour=5, minute=59, second=38,
                                            microsecond=120)) == "2026-12-02 05:59:38 UTC"
    assert age_text((database_now - old.created_at).total_seconds()) == "12 min"
    clock = run_js(finders.find("console/clock.js"), "window.consoleClock.age", [0, 59, 60, 3599, 3600, 3660, 86400,
                                                                                90000], prelude=BROWSERLESS)
    assert clock == ["0 s", "59 s", "1 min", "59 min", "1 h", "1 h 1 min", "1 d", "1 d 1 h"]


# -- the list ---------------------------------------------------------------------------------------------------------
def test_it_finds_a_task_by_the_start_of_its_id_and_by_words_of_its_goal(new_task, admin_client):
    wanted, other = new_task(steps=1), new_task(steps=1)
    Task.objects.filter(id=wanted.id).update(goal={"text": "Summarise the Zanzibar contracts"})
    # Version-7 ids made a moment apart share their first (time) digits: the shortest prefix that tells them apart.
    shared = next(n for n, (a, b) in enumerate(zip(str(wanted.id), str(other.id))) if a != b)
    prefix = str(wanted.id)[:max(shared + 1, 8)]

    by_prefix = page(admin_client, "/admin/tasks_app/task/", q=prefix)
    by_dashed = page(admin_client, "/admin/tasks_app/task/", q=str(wanted.id)[:shared + 6])
    by_whole = page(admin_client, "/admin/tasks_app/task/", q=str(wanted.id).upper())
    by_end = page(admin_client, "/admin/tasks_app/task/", q=str(wanted.id)[-8:])  # as the list shows its end
    by_goal = page(admin_client, "/admin/tasks_app/task/", q="zanzibar")
    shared_start = page(admin_client, "/admin/tasks_app/task/", q=str(wanted.id)[:shared])

    for found in (by_prefix, by_dashed, by_whole, by_end, by_goal):
        assert str(wanted.id) in found and str(other.id) not in found
    if shared >= 4:
        assert str(wanted.id) in shared_start and str(other.id) in shared_start
    assert task_id_prefix_bounds("abc") is None and task_id_prefix_bounds("summary") is None
    low, high = task_id_prefix_bounds("3F2A-9c1e")
    assert str(low) == "3f2a9c1e-0000-0000-0000-000000000000" and str(high) == "3f2a9c1e-ffff-ffff-ffff-ffffffffffff"


def test_it_tells_a_killed_task_and_input_from_approval_waits_apart_with_a_colour_and_time_in_status(
        new_task, admin_client):
    killed, approval, question, working = (new_task(steps=1) for _ in range(4))
    Task.objects.filter(id=killed.id).update(status="cancelled", status_message="Killed by user:ops: runaway")
    Task.objects.filter(id=approval.id).update(status="input_required", wait={"kind": "approval", "name": "send"})
    Task.objects.filter(id=question.id).update(status="input_required", wait={"kind": "input", "name": "city"})
    Task.objects.filter(id=working.id).update(status="working")
    # The working task entered its status 3 minutes ago by the database's clock: its newest status event (events
    # are append-only: a new one, dated back).
    TaskEvent.objects.create(task_id=working.id, seq=working.event_seq + 1, type="status", hash="0" * 64,
                             data={"status": "working", "message": "Working"},
                             at=timezone.now() - timedelta(minutes=3, seconds=2))

    listed = page(admin_client, "/admin/tasks_app/task/")

    def badge(task):
        return re.search(rf'data-task-id="{task.id}"[^>]*><span class="console-badge ([^"]+)">([^<]+)</span>'
                         r'(?: <time[^>]*>([^<]*)</time>)?', listed).groups()

    assert badge(killed)[:2] == ("console-status-cancelled", "cancelled (killed)")
    assert badge(approval)[:2] == ("console-status-input_required", "input_required (approval)")
    assert badge(question)[:2] == ("console-status-input_required", "input_required (input)")
    assert badge(working) == ("console-status-working", "working", "3 min")
    styles = open(finders.find("console/console.css")).read()
    for status in ("queued", "working", "input_required", "paused", "cancelled", "completed", "failed",
                   "dead_lettered"):
        assert f".console-status-{status}" in styles, status


# -- the task page --------------------------------------------------------------------------------------------------
def test_it_serves_the_task_panels_live_parts_as_of_now(new_task, admin_client):
    task = new_task(steps=3)
    before = page(admin_client, f"/admin/tasks_app/task/{task.id}/panel/")
    drive(task.id)

    after = page(admin_client, f"/admin/tasks_app/task/{task.id}/panel/")

    for part in ("since", "wait", "dead-letter", "timeline", "steps", "checkpoints", "effects", "artifacts",
                 "steering-history"):
        assert f'data-live="{part}"' in after, part
    steps = re.search(r'<tbody data-live="steps">(.*?)</tbody>', after, re.S).group(1)
    assert "No step" in re.search(r'<tbody data-live="steps">(.*?)</tbody>', before, re.S).group(1)
    assert steps.count("<td>committed</td>") == 3 and re.search(r"<td>\d+\.\d{3} s</td>", steps)
    assert after.count('class="console-step console-step-committed"') == 3  # the timeline
    assert "<html" not in after  # the panel alone: task.js takes its parts


def test_it_places_each_step_on_one_time_axis_by_its_start_and_duration():
    start = timezone.now()

    def step(seq, begins, takes):
        return {"seq": seq, "name": f"s{seq}", "status": "committed", "started_at": start + timedelta(seconds=begins),
                "finished_at": start + timedelta(seconds=begins + takes), "seconds": takes,
                "duration": console.duration_text(takes)}

    bars = console.step_timeline([step(3, 6, 4), step(2, 1, 5), step(1, 0, 0.0001)])  # newest first, as read

    assert [bar["seq"] for bar in bars] == [1, 2, 3]
    assert [(bar["left"], bar["width"]) for bar in bars] == [(0.0, 0.4), (10.0, 50.0), (60.0, 40.0)]
    assert [console.duration_text(s) for s in (0.0042, 1.25, 184)] == ["0.004 s", "1.25 s", "3 min 4 s"]


def test_it_shows_each_events_data_folded_on_the_all_events_page(new_task, admin_client):
    task = new_task(steps=2)
    drive(task.id)

    shown = page(admin_client, f"/admin/tasks_app/task/{task.id}/history/events/")

    assert "<th scope=\"col\">data</th>" in shown and "<th scope=\"col\">what</th>" in shown
    assert shown.count("<details><summary><code>") >= 4  # each event's data, folded, with a one-line preview
    assert "&quot;stepsCompleted&quot;: 2" in shown  # pretty-printed inside
    assert "100% — step 2" in shown  # and its line, as on the task page


# -- a line for every event -------------------------------------------------------------------------------------------
EXAMPLES = [
    ("status", {"status": "paused", "message": "Paused"}),
    ("progress", {"progress": 0.625, "phase": "reading", "step": "fetch", "stepsCompleted": 7,
                  "effects": ["7:send_mail"]}),
    ("checkpoint", {"sequence": 3, "bytes": 2048}),
    ("task.snapshot", {"stepsCompleted": 12, "nextStep": 12, "planLength": 40, "checkpoint": 2}),
    ("effect", {"name": "send_mail", "key": "t:3:send_mail", "status": "unknown"}),
    ("log", {"step": "fetch", "message": "got 3 pages"}),
    ("artifact", {"name": "report.md", "ref": "x", "bytes": 812}),
    ("terminal", {"status": "completed"}),
    ("input_required", {"kind": "approval", "name": "send_mail", "prompt": "Send it?"}),
    ("plan.adjusted", {"oldPlanVersion": 1, "newPlanVersion": 2, "fromStep": 5, "oldPlan": [["fetch", 3], ["sum", 1]],
                       "newPlan": [["fetch", 1], ["translate", 2]], "commandId": "c"}),
    ("task.forked", {"from": "t0", "fromStep": 7, "inherited": {"steps": 6, "effects": 6}, "repeatsCount": 4,
                     "repeats": [], "requestedBy": "user:alice"}),
    ("steering.applied", {"type": "pause", "version": 4, "requestedBy": "user:alice", "reason": "lunch"}),
    ("steering.rejected", {"type": "resume", "version": 5, "requestedBy": "token:ci", "reason": "",
                           "why": "the task is completed"}),
    ("tool.call", {"tool": "crm.upsert", "key": "t:2:crm.upsert:1", "arguments": {"id": 7}}),
    ("tool.result", {"tool": "crm.upsert", "key": "t:2:crm.upsert:1", "outcome": "ok", "ms": 120}),
    ("tool.denied", {"tool": "shell.root", "rule": "tools.deny 'shell.root' (deployment)"}),
    ("tool.flagged", {"tool": "web.fetch", "key": "t:3:web.fetch:1", "rules": ["instructions", "exfil_link"],
                      "action": "held"}),
    ("llm.message", {"turn": 2, "model": "gpt-x", "finish": "tool_calls", "tokensIn": 1500, "tokensOut": 20,
                     "cost": "0.0032", "toolCalls": ["crm__upsert", "finish"], "content": "", "ref": "ab12"}),
]


def test_it_writes_a_readable_line_for_every_event_type_naming_who_steered():
    lines = {event_type: console.event_summary(event_type, data) for event_type, data in EXAMPLES}

    assert set(lines) == set(events.EVENT_TYPES)  # every type the runtime writes has an example here
    assert all(lines.values()), lines
    assert lines["plan.adjusted"] == "plan 1 → 2 from step 5: was fetch ×3, sum; now fetch, translate ×2"
    assert lines["effect"] == "effect send_mail: unknown (key t:3:send_mail)"
    assert lines["task.forked"] == "forked from t0 at step 7: 6 steps inherited, 4 effects may run again after approval"
    assert lines["steering.applied"] == "pause by user:alice applied (version 4): lunch"
    assert lines["steering.rejected"] == "resume by token:ci rejected: the task is completed"
    assert lines["progress"] == "63% — step 7 fetch (reading); effects 7:send_mail"  # a half rounds up, as in JS
    assert lines["task.snapshot"] == "recovered: resumes after step 12, from checkpoint 2"
    assert lines["tool.result"] == "crm.upsert: ok in 120 ms"
    assert lines["tool.denied"] == "shell.root denied by tools.deny 'shell.root' (deployment)"
    assert lines["llm.message"] == "turn 2 (gpt-x): calls crm__upsert, finish — 1500 tokens in, 20 out, cost 0.0032"


def test_it_writes_the_same_line_from_task_js_for_events_that_arrive_live():
    """task.js writes the lines of events that arrive after the page loaded; the server wrote the others. Both
    must read the same: the JS function, run as it is in the file, against the Python one."""
    script = open(finders.find("console/task.js")).read()
    start, end = script.index("  function percent("), script.index("  function prependRow(")
    source = script[start:end] + "\nglobalThis.summary = summary;\n"
    written = run_source(source, "summary", [[event_type, data] for event_type, data in EXAMPLES], spread=True)

    assert written == [console.event_summary(event_type, data) for event_type, data in EXAMPLES]


def test_it_writes_the_models_text_as_it_arrives_and_gives_way_to_the_committed_answer():
    """An agent's text streams to the page as llm.delta items (live only, never stored): task.js appends each piece
    to the turn's "writing" bubble, drops pieces that come late (an older turn, a committed one), and once the
    llm.message event commits the answer shows its excerpt until a panel re-read that started after it brings the
    message itself — the functions run as they are in the file."""
    script = open(finders.find("console/task.js")).read()
    start, end = script.index("  function liveTextAdd("), script.index("  // -- end of the model's text")
    source = script[start:end] + """
    function play(steps) {
      var writing = null, committed = 0, seen = [];
      steps.forEach(function (step) {
        if (step[0] === "delta") { writing = liveTextAdd(writing, step[1], committed); }
        else if (step[0] === "message") {
          committed = Math.max(committed, step[1].turn);
          writing = liveTextCommitted(writing, step[1], step[2]);
        } else { committed = Math.max(committed, step[2]); writing = liveTextRefreshed(writing, step[1], committed); }
        seen.push(writing && [writing.turn, writing.text, writing.done]);
      });
      return seen;
    }
    globalThis.play = play;
    """

    def delta(turn, text):
        return ["delta", {"turn": turn, "text": text}]

    seen = run_source(source, "play", [[[
        delta(2, "The colour "), delta(2, "is teal"), delta(1, "late piece of turn 1"),
        ["refresh", 100, 1],  # a re-read while turn 2 is written: the bubble stays
        ["message", {"turn": 2, "content": "The colour is teal."}, 200],
        delta(2, " (a piece after the commit)"),
        ["refresh", 150, 2],  # a re-read that started before the commit: the excerpt stays
        ["refresh", 250, 2],  # one that started after it brought the message: the bubble goes
        delta(3, "Next"), ["refresh", 300, 3],  # turn 3 committed, its message missed live: a re-read ends it
        ["delta", {"turn": 4, "offset": 0, "text": "First try"}],
        ["delta", {"turn": 4, "offset": 0, "text": "Second"}],  # the call started over: its first text dropped
        ["delta", {"turn": 4, "offset": 6, "text": " try"}],
    ]]], spread=True)[0]

    writing, committed = [2, "The colour is teal", False], [2, "The colour is teal.", True]
    assert seen == [[2, "The colour ", False], writing, writing, writing, committed, committed, committed, None,
                    [3, "Next", False], None, [4, "First try", False], [4, "Second", False],
                    [4, "Second try", False]]
    # The page listens for the live-only types it is given (tasks_app.streaming.LIVE_ONLY_TYPES), by their own name.
    assert "root.dataset.liveTypes" in script and "source.addEventListener(type, onLive)" in script


# -- running a console script outside a browser ---------------------------------------------------------------------
BROWSERLESS = "globalThis.window = globalThis; globalThis.document = {querySelector: () => null};" \
              "globalThis.setInterval = () => 0;"


def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is not installed: the console's JS is checked against the server's wording with it "
                    "(apt-get install nodejs)")
    return found


def run_js(path: str, function: str, arguments: list, *, prelude: str = "") -> list:
    return run_source(prelude + open(path).read(), function, [[argument] for argument in arguments], spread=True)


def run_source(source: str, function: str, calls: list, *, spread: bool) -> list:
    program = (f"{source}\nconst calls = {json.dumps(calls)};\n"
               f"process.stdout.write(JSON.stringify(calls.map(args => {function}(...args))));\n")
    done = subprocess.run([node(), "-e", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_it_keeps_the_step_table_for_the_newest_steps_only(new_task):
    task = new_task(steps=25)
    drive(task.id)

    rows = console.task_recent_steps(task=Task.objects.get(id=task.id))

    assert [row["seq"] for row in rows] == list(range(25, 5, -1))
    assert all(row["duration"] for row in rows) and Step.objects.filter(task_id=task.id).count() == 25


def test_it_formats_progress_cost_goal_and_a_traceback_for_people(new_task, admin_client):
    task = new_task(steps=2)
    Task.objects.filter(id=task.id).update(
        progress=0.625, goal="Find every contract that renews in 2027", cost_spent="1234.5", budget_cost="5000",
        status="failed", error={"type": "RuntimeError", "message": "boom",
                                "traceback": 'File "steps.py", line 3, in run\n    raise RuntimeError("boom")\n'})

    shown = page(admin_client, f"/admin/tasks_app/task/{task.id}/change/")

    assert "63%" in shown and "<div class=\"readonly\">0.625</div>" not in shown  # (the bar's value attribute has it)
    assert re.search(r'<div class="readonly">63%</div>', shown)
    assert "1,234.5000 spent of a budget of 5,000.0000" in shown
    assert '<p class="console-goal">Find every contract that renews in 2027</p>' in shown
    assert '<pre class="console-trace">File &quot;steps.py&quot;, line 3, in run\n    raise' in shown


def test_it_listens_on_the_live_page_for_every_event_type_the_runtime_writes(new_task, admin_client):
    """EventSource drops an event of a type nobody listens for: the page's list comes from EVENT_TYPES (a tool.*
    event was missed live when task.js kept a list of its own)."""
    task = new_task(steps=1)

    shown = page(admin_client, f"/admin/tasks_app/task/{task.id}/change/")

    listed = re.search(r'data-event-types="([^"]*)"', shown).group(1).split()
    assert listed == list(events.EVENT_TYPES) and "tool.result" in listed
    script = open(finders.find("console/task.js")).read()
    assert "root.dataset.eventTypes" in script and '"plan.adjusted", "terminal"]' not in script
