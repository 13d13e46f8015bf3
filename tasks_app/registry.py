"""The workflow registry and the API workflow authors write against.

A workflow declares a name, description, version and input JSON Schema (validated when a task is created),
a ``plan(goal, input, state)`` returning the ordered step names, and one method per step name decorated
with ``@step``. Workflows live in each installed app's ``workflows.py`` and are found at start-up.

    @register
    class Review(Workflow):
        name = "review"; description = "…"; version = "1"; input_schema = {…}

        def plan(self, goal, input, state):
            return ["load"] + ["classify"] * 20 + ["publish"]

        @step
        def load(self, ctx): ctx.state["docs"] = …

        @step(costly=True)          # forces a checkpoint after it
        def classify(self, ctx): …

        @step(max_attempts=5)
        def publish(self, ctx): ctx.effect("publish_report", send, reconcile=ask_remote)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

if TYPE_CHECKING:
    from checkpoints_app.ledger import EffectOutcome

# What a task does when a budget is spent (Workflow.on_budget_exhausted; Task.budget_on_exhausted: "" or one of them).
BUDGET_FAIL, BUDGET_WAIT = "fail", "wait"
BUDGET_POLICIES = (BUDGET_FAIL, BUDGET_WAIT)


class UnknownWorkflow(LookupError):
    pass


# The tool gateway (agents_app.gateway) registers itself here when its app loads: ctx.tool() hands each call to it.
# tasks_app cannot import the layer above it; the gateway is a port it is given, not a module it knows.
ToolExecutor = Callable[..., Any]
_tool_executor: ToolExecutor | None = None


def tool_executor_register(executor: ToolExecutor | None) -> None:
    global _tool_executor
    _tool_executor = executor


def tool_executor() -> ToolExecutor:
    if _tool_executor is None:
        raise RuntimeError("ctx.tool() needs the tool gateway: add agents_app to INSTALLED_APPS")
    return _tool_executor


# Does a task's tenant have a downstream tool server of this name? The agent layer answers (its ToolServer rows are
# above tasks_app) and registers the answer when its app loads; without it, no tenant has any.
_tool_server_lookup: Callable[..., bool] | None = None


def tool_server_lookup_register(lookup: Callable[..., bool] | None) -> None:
    global _tool_server_lookup
    _tool_server_lookup = lookup


def tool_server_exists(task_id, name: str) -> bool:
    return _tool_server_lookup is not None and bool(_tool_server_lookup(task_id=task_id, name=name))


# Sweeps of the layers above that the reaper runs with its own (agents_app: cancel the downstream tasks of tasks
# that ended). Each returns a count for the reaper's log; one that fails is logged and does not stop the others.
_reaper_sweeps: dict[str, Callable[[], int]] = {}


def reaper_sweep_register(name: str, sweep: Callable[[], int]) -> None:
    _reaper_sweeps[name] = sweep


def reaper_sweeps() -> dict[str, Callable[[], int]]:
    return dict(_reaper_sweeps)


class ToolTimeout(Exception):
    """Raise from a step (or let ctx.effect(timeout=…) raise it) when a tool call timed out. It is retried
    up to step_retry.tool_timeout_attempts times and every attempt's diagnostics are kept in the task's error.
    ``why``: why the call's outcome is unknown (checkpoints_app.models.UnknownWhy: timed_out, dropped_after_send,
    answer_unusable), kept on its ledger row and told to a person asked whether it happened."""

    def __init__(self, message: str = "", *, why: str = "timed_out"):
        super().__init__(message)
        self.why = why


def step(fn: Callable | None = None, *, costly: bool = False, max_attempts: int | None = None,
         timeout: float | None = None):
    """Mark a workflow method as a step. ``costly``: checkpoint right after it (expensive to redo).
    ``max_attempts`` overrides step_retry.max_attempts for this step; ``timeout`` (seconds) overrides
    step_timeout_seconds: an attempt still running after it is abandoned and counted as a failed attempt."""

    def mark(function: Callable) -> Callable:
        function._runtime_step = {"costly": costly, "max_attempts": max_attempts, "timeout": timeout}
        return function

    return mark(fn) if fn is not None else mark


class Workflow:
    """Base class of a workflow. Subclass it in ``<app>/workflows.py`` and decorate the class with @register."""

    name: ClassVar[str]
    description: ClassVar[str]
    version: ClassVar[str] = "1"
    # Versions whose in-flight tasks this code may resume (their step names mean the same here).
    compatible_versions: ClassVar[frozenset[str]] = frozenset()
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    # The parameters adjust_goal may set (JSON Schema, checked at submission); none unless a workflow names some.
    goal_parameters_schema: ClassVar[dict[str, Any]] = {"type": "object", "additionalProperties": False}
    # As an MCP tool (mcp_bridge): whether a call runs as a task — "optional" (a task for a client that declared the
    # tasks extension, a bounded foreground wait otherwise), "required" (only as a task) or "forbidden" (always in the
    # foreground) — and the tool's annotations (readOnlyHint, destructiveHint, idempotentHint, openWorldHint, title).
    mcp_task_support: ClassVar[str] = "optional"
    mcp_annotations: ClassVar[dict[str, Any]] = {}
    # A conformance fixture (mcp_bridge/fixtures, MCP_CONFORMANCE_FIXTURES=1): a tool only the fixture tenant sees.
    mcp_fixture: ClassVar[bool] = False
    # Gather input in the foreground first (SEP-2322 rounds), then run as a task for a client with the tasks
    # extension; and the client capabilities a call needs (e.g. {"sampling"}: -32021 for a client without them).
    mcp_input_first: ClassVar[bool] = False
    # What the workflow is to MCP: a "tool" (the default), a "prompt" (prompts/get runs it; its result is the
    # GetPromptResult, its arguments are mcp_prompt_arguments), a "resource" (resources/read runs it with
    # {"uri", "params"}; its result is the ReadResourceResult; mcp_resource names its uri or uriTemplate, name,
    # description, mimeType) or a "completion" (completion/complete runs it with {"ref", "argument", "context"}; its
    # result is {"values": [...]}).
    mcp_kind: ClassVar[str] = "tool"
    mcp_prompt_arguments: ClassVar[list[dict[str, Any]]] = []
    mcp_resource: ClassVar[dict[str, Any]] = {}
    mcp_client_capabilities: ClassVar[frozenset[str]] = frozenset()
    # When one of a task's budgets (budget.maxSteps, maxCost, maxTokens) is spent, at the safe point before its next
    # step: "fail" (the task fails with BudgetExhausted) or "wait" (input_required, a budget wait, until an operator
    # raises the budget with set_budget). A task's budget.onExhausted overrides it. Read each time the engine asks,
    # so a django.utils.functional.classproperty may follow a setting (the agent's follows agent.on_budget).
    on_budget_exhausted: ClassVar[str] = "fail"
    # The step that begins a turn, for a workflow that works in turns (the agent's `think`; its output carries
    # {"turn": n}): a fork may then be asked fromTurn instead of fromStep (tasks_app.forks). None: no turns.
    turn_step: ClassVar[str | None] = None
    steps: ClassVar[dict[str, dict]]
    _validator: ClassVar[Draft202012Validator]
    _goal_parameters_validator: ClassVar[Draft202012Validator]

    def plan(self, goal: Any, input: dict, state: dict) -> list[str]:
        """The ordered step names still to run. Default: every @step method once, in definition order."""
        return list(self.steps)

    def replan(self, goal: Any, input: dict, state: dict, *, remaining: list[str]) -> list[str]:
        """The steps still to run after adjust_goal changed the goal: the plan from the cursor on (the steps done
        stay done). ``remaining`` is what the current plan still holds. Default: unchanged — the steps that read
        the goal (ctx.goal, goal_parameters) see the new one."""
        return remaining

    def result(self, state: dict) -> Any:
        """The task's result, from the final state. Default: state["result"] if set."""
        return state.get("result")

    def mcp_result(self, result: Any, artifacts: list[dict]) -> dict | None:
        """The MCP CallToolResult of a completed task ({"content": [...], "structuredContent": ..., "isError": ...}),
        or None for the default: the result as JSON text and structuredContent, a resource link per artifact
        (``artifacts``: [{"name", "uri", "mimeType", "bytes"}]). A tool error is a completed task whose result says
        so with ``"isError": True``."""
        return None

    def reconcile_effect(self, *, name: str, key: str, input: dict) -> EffectOutcome | None:
        """Did the effect ``name`` with idempotency key ``key`` land? Asked (tasks_app.engine.effects.decide) for an
        effect whose rule is ``reconcile`` when a worker died (or a call timed out) after starting it — when its step
        meets it again without a hook of its own, and when the task goes past it (the step took another path on its
        re-run, or the task is being cancelled or failed). Defining it gives every effect of the workflow that rule.
        Return EffectOutcome.was_applied(result) or .not_applied(); None means nobody can tell: a person decides,
        once the call can no longer land."""
        return None

    @classmethod
    def tenant_errors(cls, data: Any, *, tenant) -> list[dict[str, str]]:
        """What makes valid ``data`` unusable for this tenant (checked at create, after the schema): e.g. the agent's
        model, which the tenant or the deployment must configure. Same shape as input_errors. Default: none."""
        return []

    @classmethod
    def input_errors(cls, data: Any) -> list[dict[str, str]]:
        """Every way ``data`` fails the input schema, as [{"field": "input.x", "message": ...}], in path order."""
        errors = []
        for error in sorted(cls._validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
            path = ".".join(["input", *map(str, error.absolute_path)])
            if error.validator == "required" and isinstance(error.instance, dict):
                for missing in [p for p in error.validator_value if p not in error.instance]:
                    errors.append({"field": f"{path}.{missing}", "message": "This field is required."})
                continue
            errors.append({"field": path, "message": error.message})
        return errors

    @classmethod
    def goal_parameters_errors(cls, data: Any) -> list[dict[str, str]]:
        return [{"field": ".".join(["payload", "parameters", *map(str, error.absolute_path)]), "message": error.message}
                for error in cls._goal_parameters_validator.iter_errors(data)]

    @classmethod
    def fork_inherit(cls, *, original_id, fork_id, variables: dict) -> None:
        """A fork of one of this workflow's tasks is being created (tasks_app.forks, inside its transaction): copy
        what the inherited ``variables`` refer to that is kept per task outside the state (the agent's transcript
        messages). Default: nothing — the state is all there is."""

    @classmethod
    def can_resume(cls, version: str) -> bool:
        return version == cls.version or version in cls.compatible_versions


class WorkflowRegistry:
    def __init__(self) -> None:
        self._workflows: dict[str, type[Workflow]] = {}

    def register(self, cls: type[Workflow]) -> type[Workflow]:
        name = getattr(cls, "name", None)
        if not name or not isinstance(name, str):
            raise TypeError(f"{cls.__qualname__} needs a `name`")
        if not getattr(cls, "description", None):
            raise TypeError(f"workflow {name!r} needs a `description` (MCP clients show it as the tool's)")
        if name in self._workflows and self._workflows[name] is not cls:
            raise ValueError(f"workflow {name!r} is registered twice ({self._workflows[name].__module__}, "
                             f"{cls.__module__})")
        try:
            Draft202012Validator.check_schema(cls.input_schema)
        except SchemaError as error:
            raise TypeError(f"workflow {name!r} has an invalid input_schema: {error.message}") from error
        cls._validator = Draft202012Validator(cls.input_schema)
        try:
            Draft202012Validator.check_schema(cls.goal_parameters_schema)
        except SchemaError as error:
            raise TypeError(f"workflow {name!r} has an invalid goal_parameters_schema: {error.message}") from error
        cls._goal_parameters_validator = Draft202012Validator(cls.goal_parameters_schema)
        if cls.mcp_task_support not in ("forbidden", "optional", "required"):
            raise TypeError(f"workflow {name!r}: mcp_task_support is forbidden, optional or required")
        if cls.mcp_kind not in ("tool", "prompt", "resource", "completion"):
            raise TypeError(f"workflow {name!r}: mcp_kind is tool, prompt, resource or completion")
        if cls.on_budget_exhausted not in BUDGET_POLICIES:
            raise TypeError(f"workflow {name!r}: on_budget_exhausted is one of {', '.join(BUDGET_POLICIES)}")
        cls.steps = {
            attr: value._runtime_step
            for klass in reversed(cls.__mro__) for attr, value in vars(klass).items()
            if callable(value) and hasattr(value, "_runtime_step")
        }
        self._workflows[name] = cls
        return cls

    def get(self, name: str) -> type[Workflow]:
        try:
            return self._workflows[name]
        except KeyError:
            raise UnknownWorkflow(name) from None

    def names(self) -> list[str]:
        return sorted(self._workflows)

    def all(self) -> list[type[Workflow]]:
        return [self._workflows[name] for name in self.names()]


registry = WorkflowRegistry()
register = registry.register


def budget_policy(workflow: type[Workflow] | None, override: str = "") -> str:
    """What a task does when one of its budgets is spent ("fail" or "wait"): its own budget.onExhausted if it set
    one, else its workflow's on_budget_exhausted ("fail" for a workflow this code no longer has)."""
    if override in BUDGET_POLICIES:
        return override
    policy = workflow.on_budget_exhausted if workflow is not None else BUDGET_FAIL
    return policy if policy in BUDGET_POLICIES else BUDGET_FAIL


def goal_parameters(goal: Any) -> dict:
    """The workflow-defined parameters of a goal ({"text": …, "parameters": {…}} once adjust_goal set some)."""
    parameters = goal.get("parameters") if isinstance(goal, dict) else None
    return parameters if isinstance(parameters, dict) else {}
