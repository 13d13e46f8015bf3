"""The console in a real browser: headless Chromium (Debian's `chromium` package, never a browser Playwright
downloads) driven by Playwright, against a real uvicorn process and a real Celery worker on the test database.

An operator logs in, opens a running task's page and sees its progress bar advance without the page reloading (it
follows the task's event stream), pauses it and sees `paused`, resumes it and sees it complete. A screenshot of the
finished page is kept as a test artifact: var/test-artifacts/console.png (and console.png in the test's tmp_path).

Without Chromium (or Playwright) the test is skipped with a reason saying how to enable it, which pytest's summary
prints (-ra); `.ci/run` installs Debian's package when it is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model

from tasks_app.models import Task
from tasks_app.services import task_create
from tests.embedded_support import ROOT

CHROMIUM = shutil.which("chromium")
ARTIFACTS = ROOT / "var" / "test-artifacts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),  # the web process and the worker see committed rows only
    pytest.mark.usefixtures("external_root"),
    pytest.mark.skipif(CHROMIUM is None, reason="browser test skipped: install Debian's chromium "
                                                "(apt-get install chromium; .ci/run does it as root) to run it"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="browser test skipped: Playwright is missing (pip install -r requirements-test.txt)"),
]

PASSWORD = "console-browser-test"  # a throwaway account in the test database


_COLLECTED: list[str] = []


def collected_static(tmp_path) -> str:
    """The web process serves collected files (WhiteNoise, DEBUG off), as in production: collect them first — once
    for this module's tests (a Django start of its own: seconds of CPU the suite need not spend four times)."""
    if not _COLLECTED:
        root = tmp_path / "static"
        env = {**os.environ, "STATIC_ROOT": str(root), "DJANGO_SETTINGS_MODULE": "config.settings"}
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v", "0"], cwd=ROOT,
                       env=env, check=True)
        _COLLECTED.append(str(root))
    return _COLLECTED[0]


def wait_for(page, expression: str, *, task, web, timeout: float = 20_000) -> None:
    """page.wait_for_function, failing with where the task, the page and the web process stand."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(expression, timeout=timeout)
    except PlaywrightTimeout:
        row = Task.objects.get(id=task.id)
        shown = page.evaluate("[document.querySelector('[data-field=status]').textContent, "
                              "document.getElementById('console-progress').value, "
                              "document.getElementById('console-events').innerText.slice(0, 600)]")
        pytest.fail(f"not true after {timeout / 1000} s: {expression}\ntask {row.status} at step "
                    f"{row.steps_completed} (event {row.event_seq}); the page shows {shown}\n"
                    f"web log:\n{web.log.read_text()[-3000:]}")


def test_it_shows_a_running_task_live_and_pauses_resumes_and_completes_it_in_a_browser(tenant, workers, tmp_path,
                                                                                       monkeypatch):
    from playwright.sync_api import sync_playwright

    from tests.web_support import WebProcess

    get_user_model().objects.create_superuser("browser-op", password=PASSWORD)
    web = WebProcess(tmp_path, env={"STATIC_ROOT": collected_static(tmp_path), "SESSION_COOKIE_SECURE": "false",
                                    "CSRF_COOKIE_SECURE": "false"})
    workers("console-worker")
    # 40 steps of 400 ms: long enough to see the bar move, pause early on and see the rest finish live, on a loaded
    # machine too (each step is events the page re-reads its panels for: fewer, longer steps cost the suite less).
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps",
                       input={"steps": 40, "sleep_ms": 400, "effect": False}).task
    page_url = web.url(f"/admin/tasks_app/task/{task.id}/change/")
    # Playwright's sync API runs an event loop on this thread, and Django refuses ORM calls where a loop runs: the
    # test's own reads (in wait_for's failure message) are plain synchronous ones. Set after the processes start.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    errors = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                 args=["--no-sandbox"])  # (CI runs as root)
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.set_default_timeout(20_000)

            page.goto(web.url(f"/admin/login/?next=/admin/tasks_app/task/{task.id}/change/"))
            page.fill("#id_username", "browser-op")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(page_url)

            # The bar advances while the worker runs, on this very page (a reload would drop the marker).
            page.evaluate("window.consoleNotReloaded = true")
            wait_for(page, "document.getElementById('console-progress').value > 0", task=task, web=web)
            first = page.eval_on_selector("#console-progress", "bar => bar.value")
            wait_for(page, f"document.getElementById('console-progress').value > {first}", task=task, web=web)
            assert page.evaluate("window.consoleNotReloaded === true")
            assert page.is_visible('[data-field="live"]')

            page.fill("#console-steer input[name=reason]", "browser test: pause")
            page.click("#console-steer button[value=pause]")
            page.wait_for_url(page_url)
            wait_for(page, "document.querySelector('[data-field=status]').textContent === 'paused'", task=task, web=web)
            paused_at = page.eval_on_selector("#console-progress", "bar => bar.value")
            assert 0 < paused_at < 1 and page.is_visible("#console-steer button[value=resume]")
            assert not page.is_visible("#console-steer button[value=pause]")

            page.fill("#console-steer input[name=reason]", "browser test: resume")
            page.click("#console-steer button[value=resume]")
            page.wait_for_url(page_url)
            page.evaluate("window.consoleNotReloaded = true")
            wait_for(page, "document.querySelector('[data-field=status]').textContent === 'completed'", task=task,
                     web=web, timeout=30_000)
            assert page.eval_on_selector("#console-progress", "bar => bar.value") == 1
            assert page.evaluate("window.consoleNotReloaded === true")  # the completion came live, too
            assert "terminal" in page.inner_text("#console-events")

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(tmp_path / "console.png"), full_page=True)
            shutil.copyfile(tmp_path / "console.png", ARTIFACTS / "console.png")
            browser.close()
    finally:
        web.stop()

    assert errors == []
    assert Task.objects.get(id=task.id).status == "completed"


def login(browser, web, username: str, next_path: str, errors: list):
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(20_000)
    page.goto(web.url(f"/admin/login/?next={next_path}"))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(web.url(next_path))
    return page


def test_it_never_acts_silently_on_a_view_another_tab_has_made_stale_and_serves_operators_of_no_tenant(
        tenant, workers, tmp_path, monkeypatch):
    """Two operators, each in a browser context of their own, neither a member of any tenant, on one running task.
    A pauses it. B's page learns of it live (through the console's own snapshot, which a tenant-less operator may
    read) and says what changed and by whom; B's cancel, pressed on the old view, asks first (dismissed: nothing is
    sent, the task stays paused). B acknowledges, then resumes it on the current version: accepted, no 409."""
    from django.apps import apps
    from django.contrib.auth.models import Group
    from django.db import connection, connections
    from playwright.sync_api import sync_playwright

    from steering_app.models import SteeringCommand
    from tests.web_support import WebProcess

    # The `operators` group as its migration makes it (a transactional test's flush emptied auth_group).
    importlib.import_module("steering_app.migrations.0003_auditors_and_operators_groups").create_groups(
        apps, SimpleNamespace(connection=connection))
    for username in ("op-anna", "op-bruno"):
        operator = get_user_model().objects.create_user(username, password=PASSWORD, is_staff=True)
        operator.groups.add(Group.objects.get(name="operators"))  # and no tenant: the console serves every tenant
    web = WebProcess(tmp_path, env={"STATIC_ROOT": collected_static(tmp_path), "SESSION_COOKIE_SECURE": "false",
                                    "CSRF_COOKIE_SECURE": "false"})
    workers("console-worker")
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps",
                       input={"steps": 40, "sleep_ms": 300, "effect": False}).task
    task_path = f"/admin/tasks_app/task/{task.id}/change/"
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    errors, snapshots, dialogs = [], [], []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            tab_a = login(browser, web, "op-anna", task_path, errors)
            tab_b = login(browser, web, "op-bruno", task_path, errors)
            tab_b.on("response", lambda response: snapshots.append(response.status)
                     if "/snapshot/" in response.url else None)
            wait_for(tab_b, "document.getElementById('console-progress').value > 0", task=task, web=web)
            seen = tab_b.input_value("#console-steer input[name=expected_version]")

            tab_a.fill("#console-steer input[name=reason]", "tab A: pause")
            tab_a.click("#console-steer button[value=pause]")
            tab_a.wait_for_url(web.url(task_path))
            wait_for(tab_a, "document.querySelector('[data-field=status]').textContent === 'paused'", task=task,
                     web=web)

            # B, still open on the old view, is told what changed and by whom; its form keeps the version B saw.
            wait_for(tab_b, "!document.querySelector('[data-field=changed]').hidden", task=task, web=web)
            changed = tab_b.inner_text("[data-field=changed]")
            assert "pause by user:op-anna" in changed and "changed since you looked" in changed, changed
            assert tab_b.input_value("#console-steer input[name=expected_version]") == seen
            wait_for(tab_b, "document.querySelector('[data-field=status]').textContent === 'paused'", task=task,
                     web=web)

            # Pressing a button on the old view asks first; dismissed, nothing is sent.
            tab_b.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            tab_b.fill("#console-steer input[name=reason]", "tab B: cancel on the old view")
            tab_b.click("#console-steer button[value=cancel]", no_wait_after=True)
            tab_b.wait_for_timeout(500)
            assert len(dialogs) == 1 and "changed since you looked" in dialogs[0], dialogs
            assert not SteeringCommand.objects.filter(task_id=task.id, type="cancel").exists()
            assert Task.objects.get(id=task.id).status == "paused"

            # Acknowledged, B acts on the current state: accepted, and the task runs on.
            tab_b.click("[data-field=changed] button")
            assert int(tab_b.input_value("#console-steer input[name=expected_version]")) > int(seen)
            tab_b.fill("#console-steer input[name=reason]", "tab B: resume, having seen the pause")
            tab_b.click("#console-steer button[value=resume]")
            tab_b.wait_for_url(web.url(task_path))
            assert "accepted at version" in tab_b.inner_text(".messagelist")
            wait_for(tab_b, "['working', 'completed'].includes("
                            "document.querySelector('[data-field=status]').textContent)", task=task, web=web)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            tab_b.screenshot(path=str(ARTIFACTS / "console-two-tabs.png"), full_page=True)
            browser.close()
            # The ORM reads above ran inside Playwright's greenlet, which Django gives connections of their own: close
            # them here, or the test database could not be dropped at the end of the session.
            connections.close_all()
    finally:
        web.stop()

    assert errors == []
    assert snapshots and set(snapshots) == {200}, snapshots  # a tenant-less operator reads the console's snapshot
    commands = list(SteeringCommand.objects.filter(task_id=task.id).order_by("new_version")
                    .values_list("type", "requested_by"))
    assert commands == [("pause", "user:op-anna"), ("resume", "user:op-bruno")], commands


def test_it_keeps_the_list_and_every_part_of_the_task_page_live_at_1366_px(tenant, workers, tmp_path, monkeypatch):
    """At a 1,366 px wide window: the list fits without scrolling sideways, and a task created after it loaded
    appears in it without a reload. The task's page then fills its steps, timeline and ledger while the worker runs
    (re-read from the panel, never reloaded), filters its event tail by type, and writes each event that arrived live
    with the very line and kind of time the server writes for it at load."""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    from tests.web_support import WebProcess

    get_user_model().objects.create_superuser("browser-live", password=PASSWORD)
    web = WebProcess(tmp_path, env={"STATIC_ROOT": collected_static(tmp_path), "SESSION_COOKIE_SECURE": "false",
                                    "CSRF_COOKIE_SECURE": "false"})
    workers("console-worker")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    errors = []
    rows = "Array.from(document.querySelectorAll('#console-events tbody tr[data-type]')).map(r => " \
           "[r.cells[0].textContent, r.cells[2].textContent, r.cells[3].textContent])"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": 1366, "height": 900})
            page = context.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.set_default_timeout(20_000)
            page.goto(web.url("/admin/login/?next=/admin/tasks_app/task/"))
            page.fill("#id_username", "browser-live")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(web.url("/admin/tasks_app/task/"))
            page.evaluate("window.consoleNotReloaded = true")

            task = task_create(tenant=tenant, owner=None, workflow="demo_steps",
                               input={"steps": 40, "sleep_ms": 150}).task
            wait_for(page, f"document.querySelector('.console-status[data-task-id=\"{task.id}\"]') !== null",
                     task=task, web=web)
            assert page.evaluate("window.consoleNotReloaded === true")  # it appeared in the list as it was
            # No sideways scrolling: neither the page nor the list's own scroll box (the admin's .results).
            assert page.evaluate("document.documentElement.scrollWidth") <= 1366
            assert page.evaluate("(box => box.scrollWidth <= box.clientWidth)(document.querySelector('.results'))")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "console-list-1366.png"))

            page.goto(web.url(f"/admin/tasks_app/task/{task.id}/change/"))
            page.evaluate("window.consoleNotReloaded = true")
            loaded = page.evaluate("document.querySelectorAll('[data-live=steps] tr').length")
            wait_for(page, "document.querySelectorAll('[data-live=steps] td').length > 7 * 8", task=task, web=web)
            wait_for(page, "document.querySelectorAll('#console-timeline .console-step').length >= 8", task=task,
                     web=web)
            wait_for(page, "document.querySelector('[data-live=effects]').textContent.includes('succeeded')",
                     task=task, web=web)
            wait_for(page, "document.querySelector('[data-field=status]').textContent === 'completed'", task=task,
                     web=web, timeout=30_000)
            wait_for(page, "document.querySelectorAll('[data-live=steps] tr').length === 20", task=task, web=web)
            assert page.evaluate("window.consoleNotReloaded === true") and loaded < 20

            page.select_option("[data-field=event-type]", "progress")
            shown = page.evaluate("Array.from(document.querySelectorAll('#console-events tbody tr')).filter(r => "
                                  "!r.hidden).map(r => r.dataset.type)")
            assert shown and set(shown) == {"progress"}, shown
            page.select_option("[data-field=event-type]", "")

            live = {seq: (at, what) for seq, at, what in page.evaluate(rows)}
            fresh = context.new_page()
            fresh.goto(web.url(f"/admin/tasks_app/task/{task.id}/change/"))
            rendered = {seq: (at, what) for seq, at, what in fresh.evaluate(rows)}
            both = set(live) & set(rendered)
            assert len(both) >= 10, (live, rendered)
            for seq in both:
                assert live[seq][1] == rendered[seq][1], (seq, live[seq], rendered[seq])  # the same line
                assert live[seq][0].endswith(" UTC") and rendered[seq][0].endswith(" UTC")  # one clock
            page.screenshot(path=str(ARTIFACTS / "console-task-live.png"), full_page=True)
            browser.close()
            connections.close_all()
    finally:
        web.stop()

    assert errors == []


def test_it_writes_an_agents_text_live_and_replaces_it_with_the_committed_answer_at_1366_px(
        tenant, settings, scripted_model, tmp_path, monkeypatch):
    """An agent task waits for a person's answer; its page, 1,366 px wide, shows the conversation so far without
    scrolling sideways. The model's text of the next turn arrives as llm.delta items (live only) and is written into
    the "writing" bubble as it comes; once the turn commits, the committed answer takes its place, re-read from the
    panel — the page never reloaded. (The engine runs in this process against the scripted model.)"""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    from steering_app.services import steering_submit
    from tasks_app.streaming import live_publish
    from tests.engine_support import configure, drive
    from tests.scripted_model_support import unique_key
    from tests.web_support import WebProcess

    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1"})
    key = unique_key("browser")
    scripted_model.script(key, [{"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which colour?"}}]},
                                {"content_from": "last_tool_result", "content": "The colour is "}])
    task = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": f"Pick a colour ({key})",
                                                                           "servers": []}).task
    assert drive(task.id)[-1] == "input_required"
    get_user_model().objects.create_superuser("browser-agent", password=PASSWORD)
    web = WebProcess(tmp_path, env={"STATIC_ROOT": collected_static(tmp_path), "SESSION_COOKIE_SECURE": "false",
                                    "CSRF_COOKIE_SECURE": "false"})
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    errors = []
    bubble = "document.querySelector('[data-field=writing]')"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.set_default_timeout(20_000)
            page_url = web.url(f"/admin/tasks_app/task/{task.id}/change/")
            page.goto(web.url(f"/admin/login/?next=/admin/tasks_app/task/{task.id}/change/"))
            page.fill("#id_username", "browser-agent")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(page_url)
            page.evaluate("window.consoleNotReloaded = true")
            assert "Asks a person: Which colour?" in page.inner_text("#console-conversation")
            assert page.evaluate("document.documentElement.scrollWidth") <= 1366
            wait_for(page, "!document.querySelector('[data-field=live]').hidden", task=task, web=web)  # subscribed

            for piece in ("The colour ", "is te"):
                live_publish(task_id=task.id, type="llm.delta", data={"turn": 2, "text": piece})
            wait_for(page, f"{bubble}.innerText.includes('The colour is te')", task=task, web=web)
            assert page.is_visible("[data-field=writing]") and "writing" in page.inner_text("[data-field=writing]")

            waiting = Task.objects.get(id=task.id)
            steering_submit(task=waiting, command_type="provide_input", payload={"waitId": waiting.wait["waitId"],
                                                                                 "value": "teal"},
                            expected_version=waiting.state_version, requested_by="user:ops", reason="")
            assert drive(task.id)[-1] == "completed"
            wait_for(page, "document.querySelector('[data-live=conversation]').innerText.includes("
                           "'The colour is teal')", task=task, web=web)
            wait_for(page, f"{bubble}.hidden", task=task, web=web)
            assert page.evaluate("window.consoleNotReloaded === true")
            assert page.evaluate("document.documentElement.scrollWidth") <= 1366
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "console-agent-1366.png"), full_page=True)
            browser.close()
            connections.close_all()
    finally:
        web.stop()

    assert errors == []
