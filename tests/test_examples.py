"""The README's complete workflow (examples/greeting/workflows.py) is the text the README shows, and it runs: its
wait is answered, its effect happens once, its result is what the README says; EXTRA_APPS installs it."""

import re

import pytest

from steering_app.services import steering_submit
from tasks_app.models import Task
from tasks_app.services import task_create
from tests.embedded_support import ROOT
from tests.engine_support import drive
from tests.web_support import call

EXAMPLE = ROOT / "examples" / "greeting" / "workflows.py"


def test_it_shows_in_the_readme_exactly_the_example_that_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Writing a workflow"):]
    shown = re.search(r"```python\n(.*?)```", section, re.S).group(1)

    assert shown == EXAMPLE.read_text()


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_example_to_its_result_through_its_wait_with_its_effect_once(tenant, external_root):
    from examples.greeting import workflows  # registers `greeting` (installed apps' workflows.py load at start-up)

    task = task_create(tenant=tenant, owner=None, workflow="greeting", input={"name": "Ada"}).task
    assert drive(task.id)[-1] == "input_required"
    task.refresh_from_db()
    assert task.wait["prompt"] == "Send 'Hello, Ada!'? Answer with the text to send."

    steering_submit(task=task, command_type="provide_input", expected_version=task.state_version,
                    payload={"waitId": task.wait["waitId"], "value": {"text": "Hello, Ada, welcome!"}},
                    reason="", requested_by="user:test")
    drive(task.id)

    task = Task.objects.get(id=task.id)
    sent = list(workflows.outbox().iterdir())
    assert task.status == "completed" and len(sent) == 1 and sent[0].read_text() == "Hello, Ada, welcome!"
    assert task.result == {"sent": "Hello, Ada, welcome!", "file": sent[0].name}
    assert sent[0].name == f"{task.id}:3:send_greeting.txt"  # the ledger's key: task:step:effect
    assert external_root == workflows.outbox().parent


@pytest.mark.django_db(transaction=True)
def test_it_installs_the_example_with_extra_apps_as_the_readme_says(web, api):
    server = web(EXTRA_APPS="examples.greeting")

    status, _, listed = call(server.url("/runtime/workflows"), api.raw_token)

    assert status == 200 and "greeting" in {workflow["name"] for workflow in listed}
