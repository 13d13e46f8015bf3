"""Steering commands: the durable queue of what people asked a task to do (ARCHITECTURE §6).

A command's place in its task's queue is ``new_version``: the task's ``state_version`` its submission moved to
(one compare-and-set per submission, so versions are dense and ordered per task). Whether it was applied or
rejected, when and why, is not a column here but an event in the task's hash chain (``steering.applied`` /
``steering.rejected``), written in the same fenced statement as the change it caused; the task's
``steering_cursor`` is the newest version decided. So a command can never be applied without its record, or
recorded without being applied, whatever crashes in between.
"""

from django.db import models
from django.db.models.functions import Now

from config.base.json_input import StoredJSONField  # (reads back a value of any depth)
from tasks_app.ids import uuid7
from tasks_app.models import Task


class CommandType(models.TextChoices):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    ADJUST_GOAL = "adjust_goal"
    PROVIDE_INPUT = "provide_input"
    SET_PRIORITY = "set_priority"
    APPROVE = "approve"
    REJECT = "reject"
    KILL = "kill"  # operators only (permission steering_app.kill_task): stop without waiting for the running step
    SET_BUDGET = "set_budget"  # {maxSteps?, maxCost?, maxTokens?}: a number, or null to remove that budget


class SteeringCommand(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)  # the commandId
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steering_commands")
    type = models.CharField(max_length=20, choices=CommandType.choices)
    payload = StoredJSONField(default=dict, blank=True)
    expected_version = models.BigIntegerField(null=True, blank=True)  # None: a shorthand without a version check
    old_version = models.BigIntegerField()
    new_version = models.BigIntegerField()
    requested_by = models.CharField(max_length=200)  # "user:alice" or "token:art_abc123…" (the token's prefix)
    reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            # The queue's order, and the handler's read: WHERE task_id = $1 AND new_version > $cursor ORDER BY
            # new_version (also serves the task's history, newest first).
            models.UniqueConstraint(fields=["task", "new_version"], name="steering_version_unique_per_task"),
            models.CheckConstraint(condition=models.Q(type__in=CommandType.values), name="steering_type_valid"),
        ]
        permissions = [("kill_task", "Can kill a task: stop it without waiting for its running step")]

    def __str__(self) -> str:
        return f"{self.type} v{self.new_version} on {self.task_id}"
