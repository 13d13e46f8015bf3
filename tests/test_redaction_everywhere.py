"""A secret that a step writes through ctx.log(), passes to an effect as arguments and gets back in its result
never appears in events, log lines, the live stream or the console's pages (the rendered bytes are searched)."""

import io
import logging

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from steering_app.services import steering_submit
from tasks_app.models import Task, TaskEvent, TenantMembership
from tasks_app.services import api_token_create, task_create, tenant_get_or_create
from tests import workflows
from tests.engine_support import configure, drive
from tests.support.streams import sse
from tests.web_support import WebProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

SECRET = "ghp_" + "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LmNb"
CUSTOMER = "ACME-12345678"


def pages_of(task, client) -> dict[str, str]:
    base = f"/admin/tasks_app/task/{task.id}"
    paths = [f"{base}/change/", f"{base}/history/events/", f"{base}/history/effects/", f"{base}/history/steps/",
             f"{base}/steer/", f"{base}/steer/wait/", "/admin/tasks_app/task/",
             f"/admin/audit/events/?task={task.id}", f"/admin/audit/commands/?task={task.id}"]
    pages = {}
    for path in paths:
        response = client.get(path)
        assert response.status_code in (200, 302), (path, response.status_code)
        pages[path] = response.content.decode()
    return pages


def test_it_keeps_a_step_s_secret_out_of_events_the_stream_and_every_console_page(tenant, settings, tmp_path):
    configure(settings, redaction={"keys": ("api_key", "token", "session"), "patterns": (r"\bACME-[0-9]{8}\b",)})
    workflows.SCRIPTS["leak"] = {0: [{"do": "leak", "secret": SECRET}, {"do": "set", "key": "customer",
                                                                        "value": "x"}]}
    task = task_create(tenant=tenant, owner=None, workflow="scripted", input={"script": "leak", "steps": 1}).task
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("op", password=None))

    drive(task.id)  # stops before the effect: it needs approval, and the wait shows its arguments
    waiting = Task.objects.get(id=task.id)
    assert waiting.status == "input_required" and waiting.wait["effect"]["arguments"]["api_key"] == "[redacted]"
    before = pages_of(task, operator)
    steering_submit(task=waiting, command_type="approve", payload={"waitId": waiting.wait["waitId"]},
                    expected_version=waiting.state_version, reason=f"customer {CUSTOMER} asked",
                    requested_by="user:op")
    drive(task.id)
    assert Task.objects.get(id=task.id).status == "completed"
    after = pages_of(task, operator)

    events = [(type_, str(data)) for type_, data in TaskEvent.objects.filter(task=task).values_list("type", "data")]
    assert any("calling the CRM with token=[redacted]" in data for _, data in events)  # the log line, masked
    assert [(type_, data) for type_, data in events if SECRET in data or CUSTOMER in data] == []
    for path, page in [*before.items(), *after.items()]:
        assert SECRET not in page, path
        assert CUSTOMER not in page, path

    user = get_user_model().objects.create_user("viewer")
    TenantMembership.objects.create(user=user, tenant=tenant)
    token = api_token_create(tenant=tenant, user=user, name="sse")[1]
    server = WebProcess(tmp_path, env={"RUNTIME_REDACTION__PATTERNS": r"['\bACME-[0-9]{8}\b']"})
    try:
        stream = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token, last_event_id=0)
        raw = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token)
    finally:
        server.stop()
    text = str(stream.events) + str(raw.events)
    assert stream.events[-1]["event"] == "terminal" and "calling the CRM" in text
    assert SECRET not in text and CUSTOMER not in text


def test_it_redacts_log_lines_through_the_configured_handlers(settings):
    configure(settings, redaction={"keys": ("token",), "patterns": (r"\bACME-[0-9]{8}\b",)})
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "filters", None))
    captured = io.StringIO()
    previous = handler.setStream(captured)
    try:
        logging.getLogger("tasks_app.engine.slice").warning("calling with token=%s for %s", SECRET, CUSTOMER)
        try:
            raise ValueError(f"remote said: Authorization: Bearer {SECRET}")
        except ValueError:
            logging.getLogger("tasks_app.engine.slice").exception("step failed")
    finally:
        handler.setStream(previous)

    written = captured.getvalue()
    assert "calling with token=[redacted]" in written and "step failed" in written and "ValueError" in written
    assert SECRET not in written and CUSTOMER not in written


def test_it_puts_the_redaction_filter_on_the_handlers_a_celery_worker_installs():
    from celery.signals import after_setup_logger

    from config.celery import _redact_worker_logs

    assert any(receiver() is _redact_worker_logs for _, receiver in after_setup_logger.receivers)
    worker_logger = logging.getLogger("celery-worker-like")
    captured = io.StringIO()
    worker_logger.addHandler(logging.StreamHandler(captured))  # as Celery's setup does, on the root logger
    worker_logger.propagate = False
    _redact_worker_logs(logger=worker_logger)
    worker_logger.warning("token=%s", SECRET)

    assert SECRET not in captured.getvalue() and "[redacted]" in captured.getvalue()


@pytest.fixture
def tenant(transactional_db):
    return tenant_get_or_create(slug="acme", name="Acme")


def test_it_writes_each_django_log_record_once_through_the_redacting_handler(settings):
    """Django's own console handler (on with DEBUG) and mail_admins are not on the "django" logger: its records go
    to the root handler only, which redacts — the development server wrote every 4xx twice, once unredacted."""
    settings.DEBUG = True
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "filters", None))
    captured = io.StringIO()
    previous = handler.setStream(captured)
    try:
        logging.getLogger("django.request").warning("Conflict: /runtime/tasks/x/steering token=%s", SECRET)
    finally:
        handler.setStream(previous)

    assert logging.getLogger("django").handlers == []  # nothing of Django's own, which would write it again
    assert captured.getvalue().count("Conflict: /runtime/tasks/x/steering") == 1
    assert SECRET not in captured.getvalue()
