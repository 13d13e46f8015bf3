"""The plan cursor of a slice (engine/slice.py): where the task is in its plan — its length, the chunk of step names
the next step is in, and a plan made in this slice that its first commit stores.

The plan's version is part of the task's state (``state.plan_version``, in every checkpoint), so it is passed in,
never held here. Reading a chunk is the one statement (through the store, as every engine read); everything else is
pure. A slice reads the plan's chunks as it crosses into them, once per PLAN_CHUNK_STEPS steps, so neither the claim
nor a step grows with the plan's length (engine/plans.py).
"""

from __future__ import annotations

import copy

from tasks_app.db import store
from tasks_app.engine.decisions import DeadLetter, TaskFails
from tasks_app.engine.plans import PLAN_CHUNK_STEPS, chunk_names, chunk_of, chunk_step_name, plan_chunks, plan_decode
from tasks_app.engine.steps import error_message
from tasks_app.registry import Workflow


class PlanCursor:
    """The plan as one slice holds it: ``length`` steps (None: not made yet), ``chunk`` (the step names of chunk
    ``chunk_no``, as stored) and ``unstored`` (the chunks of a plan made in this slice, until a commit stores them)."""

    def __init__(self, *, task_id, length: int | None, chunk: list | None, next_index: int):
        self.task_id = task_id
        self.length = length
        self.chunk = chunk
        self.chunk_no = chunk_of(next_index) if chunk is not None else None
        self.unstored: list[dict] | None = None  # made in this slice; stored with the first commit

    def make(self, workflow: Workflow, *, goal, input, variables: dict) -> None:
        """The workflow's plan() for a task that has none yet; TaskFails if it returns no valid plan."""
        try:
            names = workflow.plan(goal, input, copy.deepcopy(variables))
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"plan() must return a list of step names, got {type(names).__name__}")
        except Exception as error:  # the workflow's own bug or missing data: the task fails, visibly
            raise TaskFails({"type": type(error).__name__, "message": error_message(error), "step": "(plan)",
                             "attempt": 1}) from None
        unknown = sorted(set(names) - set(workflow.steps))
        if unknown:
            raise TaskFails({"type": "InvalidPlan", "step": "(plan)", "attempt": 1,
                             "message": f"plan() named {unknown[:5]}, which are not @step methods of "
                                        f"{workflow.name}"})
        self.unstored = plan_chunks(names)
        self.length = len(names)
        self.chunk, self.chunk_no = (self.unstored[0]["steps"], 0) if names else ([], None)

    def check_steps(self, steps: list | None, workflow: Workflow, *, next_step: int) -> None:
        """DeadLetter if a stored chunk is missing or names steps this code's workflow no longer defines."""
        if steps is None:
            raise DeadLetter("plan_mismatch", f"the task's plan has no stored steps at index {next_step}")
        missing = sorted(chunk_names(steps) - set(workflow.steps))
        if missing:
            raise DeadLetter("plan_mismatch", f"the task's plan has steps {missing} that workflow "
                                              f"{workflow.name} {workflow.version} no longer defines")

    def step_name(self, index: int, workflow: Workflow, *, plan_version: int) -> str:
        """The name of step ``index`` (the next step), reading its chunk if the cursor crosses into it."""
        chunk = chunk_of(index)
        if chunk != self.chunk_no:  # crossing into the next chunk: once per PLAN_CHUNK_STEPS steps
            if self.unstored is not None:
                steps = self.unstored[chunk]["steps"]
            else:
                steps = store.plan_chunk(self.task_id, plan_version=plan_version, chunk=chunk)
                self.check_steps(steps, workflow, next_step=index)
            self.chunk, self.chunk_no = steps, chunk
        return chunk_step_name(self.chunk, index)

    def stored(self) -> None:
        """A commit stored the plan made in this slice."""
        self.unstored = None

    def around(self, cursor: int, *, plan_version: int) -> tuple[list[str], list[str]]:
        """(the names before ``cursor`` in its chunk, the names from ``cursor`` to the end) of the current plan."""
        first_chunk = chunk_of(cursor)
        if self.unstored is not None:
            rows = [(c["chunk"], c["steps"]) for c in self.unstored if c["chunk"] >= first_chunk]
        else:
            rows = store.plan_chunks_from(self.task_id, plan_version=plan_version, chunk=first_chunk)
        names = [name for _, steps in rows for name in plan_decode(steps)]
        offset = cursor - first_chunk * PLAN_CHUNK_STEPS
        return names[:offset], names[offset:]

    @staticmethod
    def replanned(workflow: Workflow, *, goal, input, variables: dict, remaining: list[str]) -> list[str]:
        """The workflow's replan() of the rest, checked; raises if it returns no valid plan (the caller refuses the
        command that asked for it, not the task)."""
        names = workflow.replan(goal, input, copy.deepcopy(variables), remaining=list(remaining))
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"replan() must return a list of step names, got {type(names).__name__}")
        unknown = sorted(set(names) - set(workflow.steps))
        if unknown:
            raise ValueError(f"replan() named {unknown[:5]}, which are not @step methods of {workflow.name}")
        return names

    def adjusted(self, *, length: int, chunks: list[dict], first_chunk: int) -> None:
        """A re-plan was written (fenced, with its command's record): the cursor follows the new plan."""
        self.length = length
        self.unstored = None
        self.chunk, self.chunk_no = (chunks[0]["steps"], first_chunk) if chunks else ([], first_chunk)
