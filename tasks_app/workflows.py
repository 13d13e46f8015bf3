"""Workflows shipped with the runtime (discovered like any app's workflows.py)."""

from tasks_app.examples import demo_steps, document_review  # noqa: F401  (importing registers them)
