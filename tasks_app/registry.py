"""The workflow registry: what a task can run, found in each installed app's ``workflows.py``.

A workflow declares a name, a description, a version and the JSON Schema of its input; the input of every
task is validated against it when the task is created, so a bad input never becomes a task.
"""

from __future__ import annotations

from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError


class UnknownWorkflow(LookupError):
    pass


class Workflow:
    """Base class of a workflow declaration. Subclass it in ``<app>/workflows.py`` and decorate with @register."""

    name: ClassVar[str]
    description: ClassVar[str]
    version: ClassVar[str] = "1"
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    _validator: ClassVar[Draft202012Validator]

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
