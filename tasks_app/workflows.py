"""Workflows shipped with the runtime (discovered like any app's workflows.py)."""

from tasks_app.registry import Workflow, register


@register
class DemoSteps(Workflow):
    """N steps that each sleep and write one effect: for tests and benchmarks."""

    name = "demo_steps"
    description = "Runs `steps` steps; each sleeps `sleep_ms` and writes `payload_bytes` of state. For tests and benchmarks."
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {
            "steps": {"type": "integer", "minimum": 1, "maximum": 100_000, "description": "How many steps to run."},
            "sleep_ms": {"type": "integer", "minimum": 0, "maximum": 600_000, "default": 0,
                         "description": "Milliseconds each step sleeps (simulated tool latency)."},
            "payload_bytes": {"type": "integer", "minimum": 0, "maximum": 65_536, "default": 0,
                              "description": "Bytes of state each step writes."},
        },
        "required": ["steps"],
        "additionalProperties": False,
    }
