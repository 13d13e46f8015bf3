import pytest

from tasks_app.registry import Workflow, WorkflowRegistry, registry


def test_it_discovers_the_shipped_workflows_from_installed_apps(api):
    assert "demo_steps" in registry.names()
    listed = {w["name"]: w for w in api.get("/runtime/workflows").json()}
    assert listed["demo_steps"]["inputSchema"]["required"] == ["steps"]


def test_it_refuses_a_workflow_with_an_invalid_schema():
    class Broken(Workflow):
        name = "broken"
        description = "has a bad schema"
        input_schema = {"type": "objekt"}

    with pytest.raises(TypeError, match="invalid input_schema"):
        WorkflowRegistry().register(Broken)


def test_it_refuses_two_workflows_with_one_name():
    local = WorkflowRegistry()

    class A(Workflow):
        name = "same"
        description = "a"

    class B(Workflow):
        name = "same"
        description = "b"

    local.register(A)
    with pytest.raises(ValueError, match="registered twice"):
        local.register(B)
