"""A task's question to a 2025-11-25 client: an ``elicitation/create`` on its ``tasks/result`` stream, and the answer
applied by whichever web process the client POSTs it to (ARCHITECTURE §9, §10: no process remembers anything).

The question. An open wait becomes one form-mode elicitation (mcp_bridge.legacy sends it, with the related-task
``_meta``). 2025-11-25 forms are flat objects of primitive fields, so:
- an input wait whose schema is such an object is asked field for field (only the keywords the spec's primitive
  schemas allow are kept; the answer is still checked against the wait's own schema by the steering service);
  a primitive schema is asked as one field, ``value``; a wait with parts asks its unanswered parts, one field each;
- an approval is the same confirm form as in the 2026 era (``approve``: boolean, the effect's redacted arguments);
- anything else (nested objects, arrays, an ``x-mcp-request`` wait) is not asked: the task's statusMessage says where
  to answer it, as before.

The answer. The request's JSON-RPC id is this module's: ``elicit:`` and, signed with SECRET_KEY (salted, timestamped,
valid MCP_ELICITATION_ANSWER_SECONDS), the task, the wait, the task's stateVersion when it was asked, the parts asked,
the tenant and the principal asked, and the asking stream's nonce. The client POSTs its response to /mcp like any
message; mcp_bridge.asgi hands one with such an id to ``answer_receive`` before the SDK (which would drop it: a
stateless transport awaits no reply). There it becomes steering commands — provide_input (a part each), or
approve / reject — submitted with that stateVersion as expectedVersion, in the principal's name: durable and audited
like any answer, the same path whichever process asked. Answered 202 (the spec's answer to an accepted response).

- accept with a valid answer → applied; the task's own events wake the asking stream, which waits on for the result;
- accept with an answer the wait's schema refuses, or a task that changed since the question (version conflict) →
  nothing applied, the wait stays open, and the asking stream is told (a notice on Redis) to ask again, saying why;
- decline / cancel of an input, or cancel of an approval → the wait stays open and the asking stream ends its
  tasks/result with an error that says so (answer later by calling tasks/result again, or tasks/cancel). A decline
  of an approval is the explicit "no": reject (as an unticked ``approve``);
- a JSON-RPC error (a client that cannot show forms) → the stream stops asking and waits as before;
- a wait answered or replaced meanwhile → nothing to apply (202).
Refused outright (4xx, nothing applied): an id that is not ours or is expired (400), another principal's question
(403), a result that is not an ElicitResult (400; the stream asks again).
"""

from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signing

from mcp_bridge import bridge, mapping
from mcp_bridge.auth import Principal
from steering_app import services as steering
from steering_app.errors import CommandRefused, VersionConflict
from tasks_app import selectors
from tasks_app.engine import waits
from tasks_app.models import Task, TaskStatus
from tasks_app.streaming import notice_publish

logger = logging.getLogger(__name__)

ID_PREFIX = "elicit:"
_SALT = "mcp_bridge.elicitation"
REASON = "answered through an MCP elicitation (2025-11-25 tasks/result)"
# Keywords of the 2025-11-25 primitive schemas (schema.ts: StringSchema, NumberSchema, BooleanSchema, EnumSchema).
_KEPT = {"string": ("title", "description", "minLength", "maxLength", "default", "enum"),
         "number": ("title", "description", "minimum", "maximum", "default"),
         "integer": ("title", "description", "minimum", "maximum", "default"),
         "boolean": ("title", "description", "default")}
_FORMATS = {"email", "uri", "date", "date-time"}
# Notices to the asking stream (Redis only, never stored; a lost one costs a re-ask on the next tasks/result).
REFUSED, DECLINED, UNANSWERABLE = "refused", "declined", "unanswerable"


@dataclass(frozen=True)
class Question:
    """One open wait as a 2025-11-25 form. ``key`` changes when what is to be asked changes (another wait, or fewer
    open parts): the asking stream asks anew then."""

    key: tuple
    kind: str
    parts: tuple[str, ...] | None  # a wait with parts: those asked (one field each)
    wrapper: str | None  # "value": a primitive schema asked as one field
    params: dict  # elicitation/create params, without _meta


def _primitive(schema: Any, description: str | None = None) -> dict | None:
    """The schema as a 2025-11-25 primitive field, or None when it is not one."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    enum = schema.get("enum")
    if kind is None and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        kind = "string"
    if kind not in _KEPT:
        return None
    field = {"type": kind, **{key: schema[key] for key in _KEPT[kind] if key in schema}}
    if "enum" in field and not (isinstance(enum, list) and all(isinstance(v, str) for v in enum)):
        del field["enum"]
    if kind == "string" and schema.get("format") in _FORMATS:
        field["format"] = schema["format"]
    if description and "description" not in field:
        field["description"] = description
    return field


def _form(properties: dict[str, Any], required: list[str]) -> dict | None:
    fields = {name: _primitive(schema) for name, schema in properties.items()}
    if not fields or any(field is None for field in fields.values()):
        return None
    return {"type": "object", "properties": fields, "required": [name for name in required if name in fields]}


def question_for(wait: dict | None) -> Question | None:
    """The open wait as a 2025-11-25 elicitation, or None when it cannot be one (then it is answered elsewhere)."""
    if not wait or wait["kind"] == waits.BUDGET:  # (not a question for the client: an operator raises the budget)
        return None
    if wait["kind"] == waits.APPROVAL:
        params = mapping.input_request(wait, None)["params"]
        return Question(key=(wait["waitId"],), kind=waits.APPROVAL, parts=None, wrapper=None, params=params)
    schema = wait.get("schema") or {}
    if isinstance(schema.get(mapping.MCP_REQUEST), dict):
        return None  # a sampling / roots request, not a form
    wrapper, parts = None, None
    if wait.get("parts"):
        answered = set(wait.get("answeredParts") or ())
        parts = tuple(part for part in wait["parts"] if part not in answered)
        fields = {part: _primitive(wait["parts"][part]["schema"], wait["parts"][part].get("prompt"))
                  for part in parts}
        requested = None if not fields or None in fields.values() else {
            "type": "object", "properties": fields, "required": list(parts)}
    elif schema.get("type") == "object":
        requested = _form(schema.get("properties") or {}, schema.get("required") or [])
    else:
        field = _primitive(schema)
        requested = None if field is None else {"type": "object", "properties": {"value": field},
                                                 "required": ["value"]}
        wrapper = "value"
    if requested is None:
        return None
    params = {"mode": "form", "message": wait["prompt"], "requestedSchema": requested}
    return Question(key=(wait["waitId"], parts), kind=waits.INPUT, parts=parts, wrapper=wrapper, params=params)


def can_ask(task: Task) -> bool:
    return task.status == TaskStatus.INPUT_REQUIRED and question_for(task.wait) is not None


# -- the signed request id -------------------------------------------------------------------------------------------
def request_id(task: Task, question: Question, principal: Principal, nonce: str) -> str:
    sealed = {"t": str(task.id), "w": question.key[0], "v": task.state_version,
              "p": list(question.parts) if question.parts is not None else None,
              "n": str(principal.tenant.id), "a": principal.actor, "q": nonce}
    return ID_PREFIX + signing.dumps(sealed, salt=_SALT, compress=True)


def new_nonce() -> str:
    return secrets.token_hex(8)


def is_answer(message: Any) -> bool:
    """A JSON-RPC response (result or error, no method) to a question of ours, judged by its id's prefix alone."""
    return (isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
            and isinstance(message.get("id"), str) and message["id"].startswith(ID_PREFIX))


def notice_channel(task_id) -> str:
    """The Redis channel the asking streams of one task hear notices on (not the task's event channel, whose
    streams number every item)."""
    return f"mcp-elicitation-{task_id}"


# -- the answer, on whichever process receives it --------------------------------------------------------------------
def _rpc_error(code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


def answer_receive(principal: Principal, message: dict) -> tuple[int, dict | None]:
    """(HTTP status, body) for a client's response to one of our questions (see the module's docstring)."""
    try:
        sealed = signing.loads(message["id"][len(ID_PREFIX):], salt=_SALT,
                               max_age=settings.MCP_ELICITATION_ANSWER_SECONDS)
    except signing.SignatureExpired:
        return 400, _rpc_error(-32600, "This answer's question expired: call tasks/result to be asked again. Nothing "
                                       "was applied.")
    except signing.BadSignature:
        return 400, _rpc_error(-32600, "This response's id is not one this server minted (it failed its integrity "
                                       "check). Nothing was applied.")
    if sealed["n"] != str(principal.tenant.id) or sealed["a"] != principal.actor:
        return 403, _rpc_error(-32600, "This question was asked of another principal: answer it with the token that "
                                       "called tasks/result. Nothing was applied.")
    task = selectors.task_get(tenant=principal.tenant, task_id=uuid.UUID(sealed["t"]))
    if task is None:
        return 202, None  # purged meanwhile: nothing waits for the answer
    if "error" in message:
        _notify(task.id, sealed, UNANSWERABLE, "The client answered the question with an error.")
        return 202, None
    result = message["result"]
    if not isinstance(result, dict) or result.get("action") not in ("accept", "decline", "cancel") \
            or not isinstance(result.get("content", {}), dict | None):
        _notify(task.id, sealed, REFUSED, "The answer was not an ElicitResult.")
        return 400, _rpc_error(-32602, 'The result must be an ElicitResult: {"action": "accept", "content": {…}} '
                                       "(or decline / cancel). Nothing was applied; the question is asked again.")
    _apply(principal, task, sealed, result)
    return 202, None


def _apply(principal: Principal, task: Task, sealed: dict, result: dict) -> None:
    wait = task.wait if task.status == TaskStatus.INPUT_REQUIRED else None
    if not wait or wait["waitId"] != sealed["w"]:
        return  # answered or replaced meanwhile: the asking stream sees the change itself
    action, content = result["action"], result.get("content") or {}
    if wait["kind"] == waits.APPROVAL:
        if action == "cancel":
            return _notify(task.id, sealed, DECLINED, "The approval was dismissed (cancel).", action=action)
        approve = action == "accept" and content.get("approve") is True
        commands = [("approve" if approve else "reject", {"waitId": wait["waitId"]})]
    elif action != "accept":
        return _notify(task.id, sealed, DECLINED, f"The question was {action}d.", action=action)
    else:
        commands = _input_commands(wait, sealed, content)
    version = sealed["v"]
    for command_type, payload in commands:
        command_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{sealed['q']}:{sealed['v']}:{payload.get('part')}")
        try:
            submitted = steering.steering_submit(task=task, command_type=command_type, payload=payload,
                                                 expected_version=version, reason=REASON,
                                                 requested_by=principal.actor, command_id=command_id)
        except (VersionConflict, CommandRefused) as refused:
            if bridge.already_answered(task, payload):
                continue  # answered meanwhile (by another client, the console, or this same response twice)
            why = "The task changed since the question was asked." if isinstance(refused, VersionConflict) \
                else _why(refused)
            return _notify(task.id, sealed, REFUSED, why)
        version = submitted.state_version  # (the next part's command follows this one's)


def _input_commands(wait: dict, sealed: dict, content: dict) -> list[tuple[str, dict]]:
    if sealed["p"] is not None:
        open_parts = set(wait["parts"]) - set(wait.get("answeredParts") or ())
        return [("provide_input", {"waitId": wait["waitId"], "part": part, "value": content.get(part)})
                for part in sealed["p"] if part in open_parts]
    question = question_for(wait)
    value = content.get("value") if question is not None and question.wrapper == "value" else content
    return [("provide_input", {"waitId": wait["waitId"], "value": value})]


def _why(refused: CommandRefused) -> str:
    errors = [f"{str(error.get('field', '')).removeprefix('payload.value').lstrip('.') or 'answer'}: "
              f"{error.get('message')}" for error in (refused.errors or [])]
    return "Your answer was not accepted (" + "; ".join(errors) + ")." if errors else str(refused.detail)


def _notify(task_id, sealed: dict, outcome: str, detail: str, **extra) -> None:
    notice_publish(channel=notice_channel(task_id), type="elicitation",
                   data={"question": sealed["q"], "outcome": outcome, "detail": detail, **extra})
