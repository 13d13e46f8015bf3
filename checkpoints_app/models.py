"""Checkpoints and the side-effect ledger: everything recovery reads (ARCHITECTURE §5).

Rows reference tasks by a string FK ('tasks_app.Task'), so this app imports nothing from the apps above it.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Checkpoint(models.Model):
    """Rebuildable business state of a task at a step boundary; recovery = latest good checkpoint + deltas.

    ``payload`` is the whole checkpoint document (see checkpoints_app.checkpoints for its schema) and
    ``checksum`` the sha256 of its canonical JSON, verified on every load.
    """

    # No database foreign key and no task_id index: see TASK_CHILD in tasks_app.models (why); the unique
    # (task, sequence) constraint serves a task's checkpoints.
    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="checkpoints",
                             db_constraint=False, db_index=False)
    sequence = models.IntegerField()
    schema_version = models.SmallIntegerField()
    # Canonical JSON text, stored as text so the bytes verified are exactly the bytes checksummed (jsonb would
    # re-render numbers and key order).
    payload = models.TextField()
    checksum = models.CharField(max_length=64)
    size_bytes = models.IntegerField()
    # Set by an operator's retry when this checkpoint failed verification: recovery skips it from then on.
    quarantined = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "sequence"], name="checkpoint_sequence_unique")]

    def __str__(self) -> str:
        return f"{self.task_id} checkpoint {self.sequence}"


class EffectStatus(models.TextChoices):
    STARTED = "started"  # recorded (committed) before the call: a crash leaves this behind
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the call raised; it may be tried again with the same key
    UNKNOWN = "unknown"  # started by a worker that died; the outcome needs reconciling


class UnknownWhy(models.TextChoices):
    """Why an effect's outcome is unknown, as a person asked about it is told."""

    WORKER_DIED = "worker_died"  # its worker stopped mid-call: the row was still `started` when met again
    TIMED_OUT = "timed_out"  # no answer within the timeout it was sent with
    DROPPED_AFTER_SEND = "dropped_after_send"  # the connection broke after sending, no answer came
    # The server answered, but the answer cannot be used (an HTTP 5xx, a malformed or too deep body): the exchange is
    # over, so nothing more can land — its deadline closes at once.
    ANSWER_UNUSABLE = "answer_unusable"


class Recovery(models.TextChoices):
    """How an effect's unknown outcome is decided (issue 38): recorded on its ledger row when it starts, so an effect
    met again in its step and one left open by a dead worker are decided alike (tasks_app.engine.effects.decide),
    never by re-reading a tool list or parsing a name. Whatever it is, a person answers when nothing else can — after
    the call's deadline only."""

    REPEAT = "repeat"  # read-only (the tool's readOnlyHint): calling it again changes nothing
    REPEAT_WITH_KEY = "repeat_with_key"  # idempotent (idempotentHint), or a server that honours the key
    RECONCILE = "reconcile"  # the workflow's reconcile hook asks the remote side; it may not tell: then a person
    PERSON = "person"  # nothing can tell but a person


class SideEffect(models.Model):
    """One external effect, executed at most once per key ``task:step:effect`` (the Idempotency-Key sent out)."""

    # Execute-once: one row per key, the primary key (a second EFFECT_BEGIN of a key fails on it). The key embeds
    # its task and step, so (task, step_seq, key) is unique per key, and the same index serves "a task's
    # effects" and "the effects of the step in flight" (the claim's open-effect read: step_seq > steps_completed).
    # Nothing indexes `status`, so recording an outcome changes no indexed column and is an in-place (HOT)
    # update; a partial index on open effects made each of those updates write every index again. A surrogate id
    # would add an index entry (and its WAL) to every effect.
    pk = models.CompositePrimaryKey("task", "step_seq", "key")
    key = models.CharField(max_length=300)  # f"{task_id}:{step_seq}:{name}" (tasks_app.engine.effects.effect_key)
    # No database foreign key, no index of its own: see TASK_CHILD in tasks_app.models.
    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="side_effects",
                             db_constraint=False, db_index=False)
    step_seq = models.IntegerField()
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=EffectStatus.choices)
    lease_epoch = models.BigIntegerField()  # the lease under which the last attempt started
    attempts = models.SmallIntegerField(default=1)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(db_default=Now())  # when the call (or its last restart) was sent
    finished_at = models.DateTimeField(null=True, blank=True)
    # When the call can no longer land: started_at + the timeout it was sent with + effects.
    # unknown_outcome_margin_seconds, all on the database's clock (set by EFFECT_BEGIN and a restart). Null: the call
    # had no bound. Before it passes, nobody is asked whether the call happened (tasks_app.engine.effects).
    deadline = models.DateTimeField(null=True, blank=True)
    # Why the outcome became unknown (UnknownWhy), kept from the first time it did until the call is started again.
    unknown_why = models.CharField(max_length=20, null=True, blank=True)
    # How an unknown outcome of this effect is decided (Recovery), set when it starts. Null: a row from before rules
    # were recorded — decided as PERSON (the safe side).
    recovery = models.CharField(max_length=20, null=True, blank=True)
    # Where the person is asked: True, on the task ("did this happen?", input_required); False, through the dead
    # letters (the same question on the dead letter's retry).
    asks = models.BooleanField(null=True, blank=True)
    # What a person deciding needs, as the call was made: {"server", "tool", "arguments" (redacted, bounded),
    # "annotations", "timeoutSeconds"} (a tool call), {"arguments"} (any other effect). Never a credential.
    about = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=EffectStatus.values), name="sideeffect_status"),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"
