"""Fork from step N: a new task that starts again at step N of another, with a corrected goal or input if asked
(docs/architecture.md §6; the REST call, the admin, the CLI and the MCP tool `fork_task` all come here).

What the fork is made of, all read from the original's committed, immutable history — so forking a running task
needs no pause and takes nothing from the worker that holds it (the original's row is only read):

- its state: the original's state right after step N-1 (engine.restore.state_through: a kept checkpoint and the
  verified step deltas), written as the fork's first checkpoint, so the engine restores it like any other;
- its plan: the original's plan as it stood when step N ran (that plan version's chunks), from N on re-planned by
  the workflow when the goal or the input changes (as adjust_goal would);
- the answers people gave to waits asked before step N (a later answer belongs to a step the fork runs again);
- lineage both ways: the fork's row names the original and the step (Task.forked_from, forked_from_step), the
  original's forks are found by that column, and an audit record on the original names who forked it, when, at
  which step, and the fork.

Effects: those the original made before step N are inherited — their results are in the inherited state, and
their steps never run again, so they are never repeated. Those it made from step N on (any ledger row that may have
happened: started, succeeded or unknown) are listed in the fork's `task.forked` event and its page; the fork's
steps run again under the fork's own keys (a new task id is a new key), and each such effect waits for a person's
approval first (approvalPolicy.repeats, checked by the step context) unless its caller declares a repeat safe — a
downstream tool annotated read-only or idempotent. Effects the original starts after the fork was made are not
repeats: the fork branched before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from checkpoints_app.checkpoints import SCHEMA_VERSION, CheckpointTooLarge, checkpoint_document, checkpoint_serialize
from checkpoints_app.models import Checkpoint, EffectStatus, SideEffect
from config.base.canonical import nul_paths
from config.base.problems import Problem
from tasks_app.db.dispatch import task_dispatch
from tasks_app.engine.decisions import DeadLetter
from tasks_app.engine.plans import PLAN_CHUNK_STEPS, chunk_of, plan_chunks, plan_decode
from tasks_app.engine.restore import state_through
from tasks_app.errors import InputSchemaViolation
from tasks_app.events import chain_events, status_event
from tasks_app.models import PlanChunk, Step, Task, TaskEvent, TaskStatus
from tasks_app.registry import UnknownWorkflow, registry
from tasks_app.streaming import events_publish

FORKED_EVENT = "task.forked"
# What the fork's event and page list of the effects it may repeat (the approvals gate every one regardless).
REPEATS_SHOWN_MAX = 200
_REPEATABLE = (EffectStatus.STARTED, EffectStatus.SUCCEEDED, EffectStatus.UNKNOWN)  # may have happened
_UNSET: Any = object()


class ForkRefused(Problem):
    status_code = 409
    slug = "fork-refused"


@dataclass(frozen=True)
class Repeat:
    """An effect the original made at or after the fork's step: the fork's step runs it again under a new key."""

    step: int
    name: str
    key: str
    status: str

    @property
    def gate(self) -> str:  # approvalPolicy.repeats' entry: the step (same seq in the fork) and the effect's name
        return f"{self.step}:{self.name}"


def fork_point(original: Task, *, from_step: int | None, from_turn: int | None) -> int:
    """The step (seq) the fork starts again at: ``from_step`` as given, or the step that began turn ``from_turn``
    of a workflow that counts turns (Workflow.turn_step: the agent's `think`). Problem if it is out of range."""
    if (from_step is None) == (from_turn is None):
        raise Problem("Give fromStep or fromTurn (one of them).",
                      errors=[{"field": "fromStep", "message": "A step number (1 = the first step)."}])
    if from_turn is not None:
        turn_step = getattr(registry.get(original.workflow_name), "turn_step", None) \
            if original.workflow_name in registry.names() else None
        if turn_step is None:
            raise Problem(f"Workflow {original.workflow_name!r} has no turns; fork it fromStep.",
                          errors=[{"field": "fromTurn", "message": "Use fromStep for this workflow."}])
        seq = (Step.objects.filter(task=original, status=Step.Status.COMMITTED, name=turn_step,
                                   output__turn=from_turn).order_by("seq").values_list("seq", flat=True).first())
        if seq is None:
            raise Problem(f"Task {original.id} has no committed turn {from_turn}.",
                          errors=[{"field": "fromTurn", "message": "A turn the task has begun (its page lists them)."}])
        return seq
    if from_step < 1 or from_step > original.steps_completed + 1:
        raise Problem(f"Task {original.id} has {original.steps_completed} committed steps: fork it at a step from 1 "
                      f"to {original.steps_completed + 1}.",
                      errors=[{"field": "fromStep",
                               "message": f"From 1 to {original.steps_completed + 1} (the next step to run)."}])
    return from_step


def fork_create(*, original: Task, owner, actor: str, from_step: int | None = None, from_turn: int | None = None,
                goal: Any = _UNSET, input: dict | None = None) -> Task:
    """Fork ``original`` (already checked to belong to the caller's tenant) at a step; the new task, queued.

    ``goal``/``input``: the fork's, if given (the input is checked against the workflow's schema); otherwise the
    original's current ones. ``actor``: who asked (user:<name>, token:<prefix>), for the audit trail."""
    from tasks_app.services import admin_action_record, tenant_task_room_check  # (services imports the engine; a leaf)

    try:
        workflow_cls = registry.get(original.workflow_name)
    except UnknownWorkflow:
        raise ForkRefused(f"Workflow {original.workflow_name!r} is not in this deployment's code.") from None
    if not workflow_cls.can_resume(original.workflow_version):
        raise ForkRefused(f"Task {original.id} ran {workflow_cls.name} version {original.workflow_version}; this "
                          f"code is version {workflow_cls.version} and does not declare it compatible.")
    seq = fork_point(original, from_step=from_step, from_turn=from_turn)
    new_goal = original.goal if goal is _UNSET else goal
    new_input = original.input if input is None else input
    nul_fields = nul_paths(new_input, "input") + nul_paths(new_goal, "goal")
    if nul_fields:
        raise Problem("Text may not contain the NUL character (\\u0000).",
                      errors=[{"field": field, "message": "Contains a NUL character (\\u0000); remove it."}
                              for field in nul_fields])
    if input is not None:
        errors = workflow_cls.input_errors(new_input) or workflow_cls.tenant_errors(new_input, tenant=original.tenant)
        if errors:
            raise InputSchemaViolation(f"The input does not match the schema of workflow {workflow_cls.name!r}.",
                                       errors=errors)
    changed = goal is not _UNSET or input is not None

    # -- read the original's past (committed rows: nothing here changes under us) ---------------------------------
    try:
        state = state_through(original.id, seq - 1)
    except DeadLetter as broken:
        raise ForkRefused(f"The history of task {original.id} up to step {seq - 1} does not verify "
                          f"({broken.reason}: {broken.message}).") from None
    step_row = (Step.objects.filter(task=original, seq=seq, status=Step.Status.COMMITTED)
                .values_list("plan_version", "step_index").first())
    if step_row is None:  # the next step to run: where the original's cursor stands (read after its row)
        current = Task.objects.filter(id=original.id).values_list("plan_version", "next_step_index",
                                                                  "steps_completed").get()
        if current[2] >= seq:  # it committed step `seq` since the caller read it: read that step after all
            step_row = Step.objects.filter(task=original, seq=seq).values_list("plan_version", "step_index").get()
        else:
            step_row = current[:2]
    plan_version, index = step_row
    names, prefix_len = _plan_from(original, plan_version=plan_version, index=index)
    repeats = [Repeat(step=step, name=name, key=key, status=status) for step, name, key, status in
               SideEffect.objects.filter(task=original, step_seq__gte=seq, status__in=_REPEATABLE)
               .order_by("step_seq", "key").values_list("step_seq", "name", "key", "status")]
    answers = {wait_id: answer for wait_id, answer in (original.answers or {}).items()
               if isinstance(answer, dict) and answer.get("step", seq) < seq}

    # -- the fork --------------------------------------------------------------------------------------------------
    workflow = workflow_cls()
    plan_length = None
    chunks: list[dict] = []
    if names is not None:
        prefix, rest = names[:prefix_len], names[prefix_len:]
        if changed:
            rest = _replanned(workflow, goal=new_goal, input=new_input, variables=state.variables, remaining=rest)
        chunks = plan_chunks(prefix + rest, first_chunk=chunk_of(index))
        plan_length = index + len(rest)
    state.next_step, state.plan_version, state.steering_cursor = index, 1, 0
    policy = dict(original.approval_policy or {})
    policy.pop("repeats", None)  # (a fork of a fork: only its own original's effects are this fork's repeats)
    if repeats:
        policy["repeats"] = list(dict.fromkeys(repeat.gate for repeat in repeats))  # (in step order, once each)
    fork = Task(
        tenant=original.tenant, owner=owner, workflow_name=workflow_cls.name, workflow_version=workflow_cls.version,
        agent_identity="" if actor.startswith("user:") else actor,  # (a person's fork: the owner is who)
        input=new_input, goal=new_goal, priority=original.priority, budget_steps=original.budget_steps,
        budget_cost=original.budget_cost, budget_tokens=original.budget_tokens,
        budget_on_exhausted=original.budget_on_exhausted, approval_policy=policy or None,
        checkpoint_policy=original.checkpoint_policy, tool_policy=original.tool_policy, answers=answers or None,
        steps_completed=seq - 1, next_step_index=index, plan_length=plan_length, forked_from=original,
        forked_from_step=seq, progress=min(1.0, index / plan_length) if plan_length else 0.0,
    )
    checkpoint = None
    if seq > 1:
        document = checkpoint_document(task_id=fork.id, sequence=1, state=state)
        try:
            payload, checksum = checkpoint_serialize(document, max_bytes=settings.RUNTIME.checkpoint.max_bytes)
        except CheckpointTooLarge as too_large:
            raise ForkRefused(f"The state at step {seq - 1} is too large for a checkpoint: {too_large}") from None
        checkpoint = Checkpoint(task_id=fork.id, sequence=1, schema_version=SCHEMA_VERSION, payload=payload,
                                checksum=checksum, size_bytes=len(payload.encode()))
        fork.checkpoint_sequence, fork.checkpoint_at = 1, Now()
    inherited = SideEffect.objects.filter(task=original, step_seq__lt=seq, status=EffectStatus.SUCCEEDED).count()
    events, fork.event_seq, fork.event_head_hash = chain_events(fork.id, [
        status_event(TaskStatus.QUEUED, f"Queued: forked from task {original.id} at step {seq}"),
        (FORKED_EVENT, {
            "from": str(original.id), "fromStep": seq, "goalChanged": goal is not _UNSET,
            "inputChanged": input is not None, "requestedBy": actor,
            "inherited": {"steps": seq - 1, "effects": inherited},
            "repeats": [{"step": r.step, "name": r.name, "key": r.key, "status": r.status}
                        for r in repeats[:REPEATS_SHOWN_MAX]],
            "repeatsCount": len(repeats)}),
    ], seq=0, head="")
    fork.hint_at = Now()  # a hint is sent at commit (task_create's rule: hint_at marks one as pending)
    with transaction.atomic():
        tenant_task_room_check(tenant=original.tenant)  # a fork is a stored task like any other
        fork.save(force_insert=True)
        TaskEvent.objects.bulk_create(events)
        if checkpoint is not None:
            checkpoint.save(force_insert=True)
        PlanChunk.objects.bulk_create([PlanChunk(task_id=fork.id, plan_version=1, chunk=chunk["chunk"],
                                                 steps=chunk["steps"]) for chunk in chunks])
        workflow_cls.fork_inherit(original_id=original.id, fork_id=fork.id, variables=state.variables)
        admin_action_record(actor=actor, action="fork", obj=original,
                            message=f"Forked at step {seq} as task {fork.id}"
                                    + (" with a new goal" if goal is not _UNSET else "")
                                    + (" with a new input" if input is not None else "")
                                    + f"; {len(repeats)} effects from step {seq} on may run again, after approval.")
        transaction.on_commit(lambda: task_dispatch(fork.id, priority=fork.priority))
        transaction.on_commit(lambda: events_publish(task_id=fork.id, tenant_id=fork.tenant_id, events=events))
    fork.refresh_from_db()
    return fork


def _plan_from(original: Task, *, plan_version: int, index: int) -> tuple[list[str] | None, int]:
    """(the step names of plan ``plan_version`` from the start of the chunk holding ``index``, how many of them come
    before ``index``); (None, 0) when the original stored no plan yet (a fork at step 1 of a task that never ran:
    the fork plans for itself, as a new task does)."""
    first = chunk_of(index)
    rows = (PlanChunk.objects.filter(task=original, plan_version=plan_version, chunk__gte=first)
            .order_by("chunk").values_list("steps", flat=True))
    names = [name for steps in rows for name in plan_decode(steps)]
    if not names:
        if index == 0:
            return None, 0
        raise ForkRefused(f"Task {original.id} has no stored plan at step index {index}.")
    return names, index - first * PLAN_CHUNK_STEPS


def _replanned(workflow, *, goal, input, variables, remaining: list[str]) -> list[str]:
    try:
        names = workflow.replan(goal, input, dict(variables), remaining=list(remaining))
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError(f"replan() must return a list of step names, got {type(names).__name__}")
        unknown = sorted(set(names) - set(workflow.steps))
        if unknown:
            raise ValueError(f"replan() named {unknown[:5]}, which are not steps of {workflow.name}")
    except Exception as error:  # the workflow's own bug: the fork is refused, saying why
        raise ForkRefused(f"The workflow could not re-plan for the new goal: {type(error).__name__}: "
                          f"{str(error)[:300]}") from None
    return names


def fork_lineage(task: Task) -> dict:
    """Both directions, for a task's page: {forkedFrom: {taskId, fromStep} | None, forks: [{taskId, fromStep,
    status, createdAt}]} (the newest 50 forks; one indexed read)."""
    forks = list(Task.objects.filter(forked_from=task).order_by("-created_at")
                 .values("id", "forked_from_step", "status", "created_at")[:50])
    return {
        "forkedFrom": ({"taskId": str(task.forked_from_id), "fromStep": task.forked_from_step}
                       if task.forked_from_id else None),
        "forks": [{"taskId": str(row["id"]), "fromStep": row["forked_from_step"], "status": row["status"],
                   "createdAt": row["created_at"]} for row in forks],
    }


def fork_repeats(task: Task) -> list[dict]:
    """The effects a fork may repeat, as its `task.forked` event lists them (empty for a task that is no fork)."""
    if not task.forked_from_id:
        return []
    event = TaskEvent.objects.filter(task=task, type=FORKED_EVENT).values_list("data", flat=True).first()
    return list((event or {}).get("repeats") or [])


