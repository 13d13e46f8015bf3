"""Helpers that several test modules used to copy, kept once (issue 38):

- ``tests.support.tasks``: a task through the REST API — ``create``, ``create_row``, ``snapshot``, ``steer`` — and
  ``events_of`` (a task's events of one type, from its chain);
- ``tests.support.model``: the ``model`` fixture, the session's scripted model configured as the runtime's model
  (registered for every module by ``pytest_plugins`` in tests/conftest.py);
- ``tests.support.console``: staff clients for the console and the roles' groups (``staff_in``, ``groups``).

The older shared modules stay where they are, imported as before: tests/engine_support.py (driving run_step in this
process, configure), tests/helpers.py, tests/scripted_model_support.py, tests/worker_support.py and the other
``*_support`` modules.
"""
