"""python manage.py dead_letters list | effects TASK_ID | retry TASK_ID [--effect KEY=applied[:RESULT_JSON]]…
                                 [--effect KEY=not_applied]… | abandon TASK_ID   (retry/abandon: [--as USERNAME]
                                 [--reason TEXT])

Who decides (tasks_app.access): with --as USERNAME the command acts as that person, held to the one access rule
exactly as the console holds them — retrying or abandoning is steering (Action.STEER: an operator's), in their
tenant only (another tenant's task is "no task", as an unknown id). Without --as it acts as the deployment
(access.SYSTEM: whoever runs it holds the deployment's shell), recorded as cli:<OS login>. list and effects read
as the deployment."""

import getpass
import json

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from tasks_app import access
from tasks_app.engine import dead_letters
from tasks_app.models import Task


def effect_answer(text: str) -> tuple[str, dead_letters.EffectAnswer]:
    """KEY=applied[:RESULT_JSON] or KEY=not_applied (keys contain ':', so the answer follows the last '=')."""
    key, sep, answer = text.rpartition("=")
    result_text = None
    if answer.startswith("applied:") or answer == "applied":
        answer, _, result_text = answer.partition(":")
    if not sep or not key or answer not in ("applied", "not_applied"):
        raise CommandError(f"--effect {text!r}: write KEY=applied[:RESULT_JSON] or KEY=not_applied")
    try:
        result = json.loads(result_text) if result_text else None
    except ValueError as error:
        raise CommandError(f"--effect {text!r}: the result is not JSON ({error})") from None
    return key, dead_letters.EffectAnswer(applied=answer == "applied", result=result)


def acting_as(username: str | None) -> access.Actor:
    """The actor the command is held to: the person --as names, else the deployment itself (access.SYSTEM)."""
    if username is None:
        return access.SYSTEM
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no account {username!r}: --as names an account of this deployment (see the admin's "
                           "users), or leave it out to be recorded as your OS login")
    return access.actor_for_user(user)


def decided_task(actor: access.Actor, task_id) -> Task:
    """The task ``task_id`` if ``actor`` may retry or abandon it (the rule: its tenant, then steering)."""
    try:
        return access.task_for(actor, access.Action.STEER, task_id)
    except (access.AccessNotFound, ValidationError):  # (ValidationError: not a task id at all)
        raise CommandError(f"no task {task_id}") from None
    except access.AccessDenied as refused:
        raise CommandError(f"{actor.name} may not retry or abandon dead letters: {refused.detail}") from None


def decider(username: str | None) -> str:
    """The actor a decision is recorded under: user:<name> for an account (the console's naming, so the audit's actor
    filter finds the same person's decisions made either way), else cli:<OS login> — never an anonymous one."""
    if username is None:
        return f"cli:{getpass.getuser()}"
    if not get_user_model().objects.filter(username=username).exists():
        raise CommandError(f"no account {username!r}: --as names an account of this deployment (see the admin's "
                           "users), or leave it out to be recorded as your OS login")
    return f"user:{username}"


class Command(BaseCommand):
    help = ("List dead-lettered tasks, show a task's effects of unknown outcome, retry one from its last good "
            "checkpoint (answering for each such effect), or abandon it as failed. Acts as the deployment "
            "(tasks_app.access.SYSTEM), or with --as as that person, held to their role.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        effects = sub.add_parser("effects")
        effects.add_argument("task_id")
        retry = sub.add_parser("retry")
        retry.add_argument("task_id")
        retry.add_argument("--effect", action="append", default=[], metavar="KEY=ANSWER",
                           help="the answer for one effect of unknown outcome, after checking the remote system: "
                                "KEY=applied[:RESULT_JSON] (the step receives RESULT_JSON as its result) or "
                                "KEY=not_applied (the step calls it again with the same key); once per effect")
        abandon = sub.add_parser("abandon")
        abandon.add_argument("task_id")
        for decision in (retry, abandon):
            decision.add_argument("--as", dest="as_user", metavar="USERNAME",
                                  help="who decides: an account of this deployment, held to its role as in the console "
                                       "(retrying and abandoning need the operator role, in the account's tenant) "
                                       "and recorded as user:USERNAME in the audit trail; without it the command "
                                       "acts as the deployment, recorded as cli:<your OS login>")
            decision.add_argument("--reason", default="", help="why (kept with the decision in the audit trail)")

    def handle(self, *args, action, **options):
        who = decider(options.get("as_user"))
        actor = acting_as(options.get("as_user"))
        try:
            if action in ("retry", "abandon"):
                decided_task(actor, options["task_id"])
            if action == "list":
                tasks = list(dead_letters.dead_letters(actor=actor)[:200])
                for task in tasks:
                    reason = (task.error or {}).get("reason", "?")
                    self.stdout.write(f"{task.id}  {task.workflow_name:20} {reason:28} {task.status_message}")
                self.stdout.write(f"{len(tasks)} dead-lettered task(s)" + (" (first 200)" if len(tasks) == 200 else ""))
            elif action == "effects":
                for effect in dead_letters.dead_letter_open_effects(task_id=options["task_id"]):
                    self.stdout.write(f"{effect.key}  {effect.status:8} step {effect.step_seq}  {effect.name}")
            elif action == "retry":
                answers = dict(effect_answer(text) for text in options["effect"])
                task = dead_letters.dead_letter_retry(task_id=options["task_id"], answers=answers, requested_by=who,
                                                      reason=options["reason"])
                self.stdout.write(f"{task.id} is {task.status}; a worker resumes it from its last good checkpoint")
            else:
                task = dead_letters.dead_letter_abandon(task_id=options["task_id"], requested_by=who,
                                                        reason=options["reason"] or "abandoned from the command line")
                self.stdout.write(f"{task.id} abandoned: {task.status}")
        except dead_letters.DeadLetterError as error:
            raise CommandError(str(error)) from None
        except Task.DoesNotExist:
            raise CommandError(f"no task {options.get('task_id')}") from None
