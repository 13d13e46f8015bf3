"""Downstream tasks (MCP Tasks): a call the server answered with a task is waited for without a worker
(downstream_result), the questions it asks relayed to a person and their answers back (relay_question; a 2025-11-25
server's, relay_legacy_question), and those our ended tasks no longer wait for cancelled by the reaper
(downstream_tasks_release)."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import F
from django.db.models.functions import Now

from agents_app import outbound, selectors
from agents_app.gateway.catalogue import credential_value, endpoint
from agents_app.gateway.errors import ToolError
from agents_app.hosts import HostVerdict, host_check_for_tenant
from agents_app.models import DownstreamTask, ToolServer
from config.base.lazy_imports import lazy_module
from tasks_app.engine import waits
from tasks_app.engine.effects import effect_key

if TYPE_CHECKING:
    from tasks_app.engine.context import StepContext

# The MCP SDK, loaded by the first ask of a downstream task (config/base/lazy_imports.py: a worker that never calls a
# tool does not pay its import).
mcp_client = lazy_module("agents_app.mcp_client")
logger = logging.getLogger(__name__)


def downstream_result(ctx: StepContext, row: ToolServer, name: str, handle: dict, where: HostVerdict, *,
                      effect_name: str) -> dict:
    """The server answered the call with a task (MCP Tasks): its id is in the ledger (the call's recorded result), so
    it is never created again. Ask how it stands: finished → its result is the call's; still running → the step
    waits without a worker (ExternalWait) and asks again after the server's pollInterval."""
    url, host = endpoint(row, where)
    interval = max((handle.get("pollIntervalMs") or 2000) / 1000, 1.0)
    key = effect_key(ctx.task_id, ctx.step_seq, effect_name)
    # (an index row, not the truth: the ledger holds the handle; this lets the reaper cancel it if our task ends)
    DownstreamTask.objects.get_or_create(task_id=ctx.task_id, effect_key=key,
                                         defaults={"server": row, "downstream_id": handle["taskId"]})
    try:
        task = mcp_client.run(mcp_client.task_get(url, handle["taskId"], token=credential_value(row),
                                                  timeout=min(row.timeout_seconds, 30), host=host,
                                                  mode=row.protocol, policy=outbound.policy_for_tenant(row.tenant_id)))
    except mcp_client.ToolCallError as failed:  # asking is always safe to repeat: ask again later
        raise waits.ExternalWait(interval, f"Waiting for {name} (downstream task {handle['taskId']}): "
                                     f"{failed.detail}; asking again") from None
    status = task.get("status")
    if status in ("completed", "failed", "cancelled"):
        DownstreamTask.objects.filter(task_id=ctx.task_id, effect_key=key).update(
            state=DownstreamTask.State.FINISHED, updated_at=Now())
    if status == "completed" and task.get("result") is not None:
        return task["result"]
    if status in ("failed", "cancelled"):
        error = task.get("error") or {}
        text = f"The downstream task {handle['taskId']} on {row.name} {status}"
        if error.get("message"):
            text += f": {error['message']}"
        return {"content": [{"type": "text", "text": text}], "isError": True,
                "_meta": {mcp_client.DOWNSTREAM_TASK_META: {**handle, "status": status}}}
    interval = max((task.get("pollIntervalMs") or handle.get("pollIntervalMs") or 2000) / 1000, 1.0)
    if status == "input_required" and task.get("inputRequests"):
        relay_question(ctx, row, name, handle["taskId"], task["inputRequests"], url=url, host=host)
    if status == "input_required" and handle.get("era") == mcp_client.LEGACY_VERSION:
        finished = relay_legacy_question(ctx, row, name, handle["taskId"], key, url=url, host=host)
        if finished is not None:
            DownstreamTask.objects.filter(task_id=ctx.task_id, effect_key=key).update(
                state=DownstreamTask.State.FINISHED, updated_at=Now())
            return finished
    shown = f" ({task['statusMessage']})" if task.get("statusMessage") else ""
    raise waits.ExternalWait(interval, f"Waiting for {name}: downstream task {handle['taskId']} is {status}{shown}")


def relay_question(ctx: StepContext, row: ToolServer, name: str, downstream_id: str, requests: dict, *, url: str,
                   host: str | None) -> None:
    """A downstream task asks for input: the first question it asks becomes our task's input wait (the operator sees
    it in the console, REST and our own MCP inputRequests); once answered, the answer goes to the downstream task
    (tasks/update) and the step waits for it again. Only form elicitations can be relayed; anything else (sampling,
    roots, a URL elicitation) leaves the task waiting, its status message saying so."""
    key = sorted(requests)[0]
    request = requests[key] or {}
    params = request.get("params") or {}
    if request.get("method", "elicitation/create") != "elicitation/create" or "requestedSchema" not in params:
        raise waits.ExternalWait(5, f"Waiting for {name}: downstream task {downstream_id} asks for "
                              f"{request.get('method', 'input')}, which cannot be relayed to a person here")
    wait = waits.downstream_question_wait(task_id=ctx.task_id, step_seq=ctx.step_seq, plan_version=ctx.plan_version,
                                          tool=name, downstream_task=downstream_id, request_key=key,
                                          message=str(params.get("message", "")), schema=params["requestedSchema"])
    answer = ctx.answer_for(wait["waitId"])
    if answer is None:
        raise waits.QuestionRequired(wait)  # our task waits for a person (input_required)
    try:
        mcp_client.run(mcp_client.task_update(url, downstream_id, {key: {"action": "accept",
                                                                         "content": answer.get("value")}},
                                              token=credential_value(row), timeout=min(row.timeout_seconds, 30),
                                              host=host, mode=row.protocol,
                                              policy=outbound.policy_for_tenant(row.tenant_id)))
    except mcp_client.ToolCallError as failed:  # refused (already answered?) or not reached: ask again soon
        raise waits.ExternalWait(2, f"Waiting for {name}: the answer to downstream task {downstream_id} was not taken "
                              f"({failed.detail}); asking again") from None
    raise waits.ExternalWait(1, f"Waiting for {name}: answered downstream task {downstream_id}'s question")


def relay_legacy_question(ctx: StepContext, row: ToolServer, name: str, downstream_id: str, key: str, *, url: str,
                          host: str | None) -> dict | None:
    """A 2025-11-25 downstream task waiting for input asks its question only on a tasks/result stream: take it from
    there (mcp_client.legacy_question) and keep it on the DownstreamTask row; it becomes our task's input wait like a
    2026 one. Once a person answered, the answer goes back as the JSON-RPC response to that very request
    (mcp_client.legacy_answer), in the session it was asked in. A request the server no longer knows (expired, its
    session gone) is asked for again: the same question is the same wait (its key is the question's content and how
    many questions were answered before), so the person's answer is used, not asked for twice.
    Returns the downstream result when the task finished meanwhile (tasks/result answered it), else raises a wait."""
    row_of = DownstreamTask.objects.filter(task_id=ctx.task_id, effect_key=key)
    index = row_of.values("question", "questions_answered").first() or {"question": None, "questions_answered": 0}
    question = index["question"]
    timeout = min(row.timeout_seconds, 30)
    if question is None:
        try:
            got = mcp_client.run(mcp_client.legacy_question(url, downstream_id, token=credential_value(row),
                                                            timeout=timeout + mcp_client.QUESTION_WINDOW_SECONDS,
                                                            host=host,
                                                            policy=outbound.policy_for_tenant(row.tenant_id)))
        except mcp_client.ToolCallError as failed:  # asking is safe to repeat
            raise waits.ExternalWait(2, f"Waiting for {name}: downstream task {downstream_id} needs input; its "
                                        f"question could not be read ({failed.detail}); asking again") from None
        if "result" in got:
            return got["result"]
        if "error" in got:
            message = (got["error"] or {}).get("message") or "failed"
            return {"content": [{"type": "text", "text": f"The downstream task {downstream_id} on {row.name} failed: "
                                                         f"{message}"}], "isError": True}
        if "question" not in got:
            raise waits.ExternalWait(5, f"Waiting for {name}: downstream task {downstream_id} needs input but asked "
                                        f"nothing on tasks/result; asking again")
        question = got["question"]
        row_of.update(question=question, updated_at=Now())
    params = {k: v for k, v in (question.get("params") or {}).items() if k != "_meta"}
    if "requestedSchema" not in params:
        raise waits.ExternalWait(30, f"Waiting for {name}: downstream task {downstream_id} asks for input that cannot "
                                     f"be relayed to a person here ({params.get('mode', 'not a form')})")
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    wait = waits.downstream_question_wait(task_id=ctx.task_id, step_seq=ctx.step_seq, plan_version=ctx.plan_version,
                                          tool=name, downstream_task=downstream_id,
                                          request_key=f"{digest}:{index['questions_answered']}",
                                          message=str(params.get("message", "")), schema=params["requestedSchema"])
    answer = ctx.answer_for(wait["waitId"])
    if answer is None:
        raise waits.QuestionRequired(wait)  # our task waits for a person (input_required)
    try:
        mcp_client.run(mcp_client.legacy_answer(url, question["id"], {"action": "accept",
                                                                     "content": answer.get("value")},
                                                session=question.get("session"), token=credential_value(row),
                                                timeout=timeout, host=host,
                                                policy=outbound.policy_for_tenant(row.tenant_id)))
    except mcp_client.NotSent as failed:
        raise waits.ExternalWait(2, f"Waiting for {name}: the answer to downstream task {downstream_id} could not be "
                                    f"sent ({failed.detail}); trying again") from None
    except mcp_client.ToolCallError as failed:
        # Not taken (the request is gone there) or not known: take the question again; it is the same wait, so the
        # answer already given is sent to it — never a person asked twice for one question.
        logger.warning("%s: downstream task %s did not take the answer to its question (%s); asking for it again",
                       name, downstream_id, failed.detail)
        row_of.update(question=None, updated_at=Now())
        raise waits.ExternalWait(1, f"Waiting for {name}: the answer to downstream task {downstream_id} was not taken "
                                    f"({failed.detail}); asking for its question again") from None
    row_of.update(question=None, questions_answered=F("questions_answered") + 1, updated_at=Now())
    raise waits.ExternalWait(1, f"Waiting for {name}: answered downstream task {downstream_id}'s question")


# -- the reaper's sweep: downstream tasks nobody waits for any more -----------------------------------------------
RELEASE_BATCH = 20
ENDED_STATUSES = ("cancelled", "failed", "dead_lettered")


def downstream_tasks_release() -> int:
    """Cancel downstream the tasks our ended tasks (cancelled, failed, dead-lettered) no longer wait for; run by the
    reaper (registered in agents_app.apps). Each is asked once: state cancel_sent whatever the answer (a task that
    had finished meanwhile refuses the cancel, which is fine). Slow I/O with no lock or transaction held."""
    open_rows = list(DownstreamTask.objects.filter(state=DownstreamTask.State.OPEN, task__status__in=ENDED_STATUSES)
                     .select_related("server")[:RELEASE_BATCH])
    for row in open_rows:
        server = row.server
        tenant_policy = server and selectors.tenant_tool_policy_get(tenant_id=server.tenant_id)
        where = server and host_check_for_tenant(server.url, config_policy=settings.RUNTIME.tools,
                                                 tenant_policy=tenant_policy)
        if server is not None and where.allowed:  # (a host refused now is not connected to, even to cancel)
            try:
                mcp_client.run(mcp_client.task_cancel(server.url, row.downstream_id, token=credential_value(server),
                                                      timeout=min(server.timeout_seconds, 10), mode=server.protocol,
                                                      policy=outbound.tenant_policy(tenant_policy)))
            except (mcp_client.ToolCallError, ToolError) as failed:
                detail = getattr(failed, "detail", str(failed))
                logger.info("downstream task %s on %s: cancel not taken (%s)", row.downstream_id, server.name,
                            detail)
        DownstreamTask.objects.filter(id=row.id, state=DownstreamTask.State.OPEN).update(
            state=DownstreamTask.State.CANCEL_SENT, updated_at=Now())
    return len(open_rows)
