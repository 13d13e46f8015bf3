"""REST for the agent layer: an agent task's conversation with its model, the tenant's tool servers (thin views over
agents_app.selectors)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from agents_app import selectors
from tasks_app.web.api import PROBLEM_RESPONSE, TASK_ID_PARAMETER, RuntimeApi, _task_or_404

TURNS_PER_PAGE, MAX_TURNS_PER_PAGE = 10, 50


class ToolCallSerializer(serializers.Serializer):
    """A tool call the model asked for, with what came of it (for the OpenAPI schema; the data is
    agents_app.selectors.task_conversation's)."""

    class Meta:
        ref_name = "TranscriptToolCall"

    id = serializers.CharField(help_text="The model's id for the call: the result's toolCallId")
    name = serializers.CharField(help_text="The function the model called: server__tool, or finish / ask_human")
    tool = serializers.CharField(allow_null=True, help_text="server.tool as the policy and the ledger name it, "
                                                            "once the gateway saw the call")
    arguments = serializers.CharField(help_text="The arguments as JSON text, redacted, cut at "
                                                f"{selectors.ARGUMENTS_MAX_CHARS} characters")
    argumentsCut = serializers.IntegerField(help_text="Characters left out of `arguments`")
    outcome = inline_serializer("TranscriptToolOutcome", {
        "status": serializers.CharField(help_text="ok, tool error, task created, denied, rejected, waiting for "
                                                  "approval, not called, finished, answered, waiting for an answer, "
                                                  "pending, or the ledger's status"),
        "detail": serializers.CharField(help_text="The rule that denied it, who rejected it and why, the question "
                                                  "asked, the screening's flag"),
        "key": serializers.CharField(help_text="The ledger key (the idempotency key sent with the call)"),
        "ms": serializers.IntegerField(allow_null=True),
        "ledger": serializers.CharField(help_text="The ledger row's status"),
        "attempts": serializers.IntegerField(allow_null=True),
        "approval": serializers.JSONField(allow_null=True, help_text="{decision (asked | approved | rejected), by, "
                                                                     "reason, at}"),
        "answeredBy": serializers.CharField(help_text="Who answered the question (ask_human)"),
    })
    resultIndex = serializers.IntegerField(allow_null=True, help_text="The `index` of the message holding its "
                                                                      "result")


class MessageSerializer(serializers.Serializer):
    class Meta:
        ref_name = "TranscriptMessage"

    turn = serializers.IntegerField(help_text="The model call this message belongs to (1, 2, …); people's answers "
                                              "and notes belong to the turn they answer")
    index = serializers.IntegerField(help_text="The message's place in the whole conversation (1, 2, …)")
    role = serializers.ChoiceField(choices=["system", "user", "assistant", "tool"])
    kind = serializers.ChoiceField(choices=["instructions", "goal", "note", "answer", "tool_result", "human_answer",
                                            "missing"])
    digest = serializers.CharField(help_text="sha256 of the message: the llm.message event's `ref`")
    content = serializers.CharField(allow_null=True, help_text="Redacted, cut at "
                                                               f"{selectors.CONTENT_MAX_CHARS} characters")
    contentCut = serializers.IntegerField(help_text="Characters left out of `content`")
    toolCalls = ToolCallSerializer(many=True, required=False, help_text="A model answer's tool calls")
    toolCallId = serializers.CharField(required=False, help_text="A result's call")
    usage = serializers.JSONField(required=False, help_text="A model answer's {model, finish, tokensIn, tokensOut, "
                                                            "cost}, from its llm.message event")
    at = serializers.DateTimeField(required=False, help_text="When a model answer was committed")
    questions = serializers.JSONField(required=False, help_text="Questions to people no call asked (a loop: go on "
                                                                "or stop?): [{name, prompt, at, answeredBy, "
                                                                "answeredAt}]")


class TaskTranscriptApi(RuntimeApi):
    class FilterSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TranscriptFilter"

        afterTurn = serializers.IntegerField(min_value=0, required=False, default=0,
                                             help_text="Give the turns after this one (a page's nextAfterTurn)")
        limit = serializers.IntegerField(min_value=1, max_value=MAX_TURNS_PER_PAGE, required=False,
                                         default=TURNS_PER_PAGE,
                                         help_text=f"Turns per page: 1 to {MAX_TURNS_PER_PAGE} (default "
                                                   f"{TURNS_PER_PAGE})")

    @extend_schema(
        operation_id="tasks_transcript", tags=["Agents"], summary="An agent task's conversation",
        description="The messages between an agent task and its model, in order, turn by turn: the instructions "
                    "and the goal, each model answer with its tool calls and what came of each (made and its "
                    "outcome, denied by the policy, waiting for or refused an approval, a question to a person and "
                    "who answered), the results the model read, and the running token and cost counters. Text is "
                    "redacted and bounded. Paged by turn: `afterTurn` and `limit`; follow `nextAfterTurn` (null: "
                    "no more). A task of another workflow answers 409 (not-an-agent-task); another tenant's task "
                    "404. The model's text as it is written is on the task's event stream only (`llm.delta`).",
        parameters=[TASK_ID_PARAMETER, FilterSerializer],
        responses={200: inline_serializer("Transcript", {
            "taskId": serializers.UUIDField(),
            "goal": serializers.CharField(help_text="The goal as the model reads it now (redacted)"),
            "turns": serializers.IntegerField(help_text="Model calls committed so far"),
            "tokensIn": serializers.IntegerField(), "tokensOut": serializers.IntegerField(),
            "cost": serializers.DecimalField(max_digits=20, decimal_places=4, help_text="The task's spend so far"),
            "model": serializers.CharField(help_text="The model of the page's last answer"),
            "afterTurn": serializers.IntegerField(),
            "nextAfterTurn": serializers.IntegerField(allow_null=True),
            "next": serializers.URLField(allow_null=True, help_text="The next page, while there is one"),
            "unreadable": serializers.CharField(required=False, help_text="Why the task's state could not be "
                                                                          "rebuilt (it is dead-lettered for it)"),
            "messages": MessageSerializer(many=True)}),
            400: PROBLEM_RESPONSE, 404: PROBLEM_RESPONSE, 409: PROBLEM_RESPONSE},
    )
    def get(self, request, task_id):
        task = _task_or_404(request, task_id)
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        after, limit = filters.validated_data["afterTurn"], filters.validated_data["limit"]
        conversation = selectors.task_conversation(task=task, after_turn=after, max_turns=limit)
        following = conversation.next_after_turn
        body = {
            "taskId": str(task.id), "goal": conversation.goal, "turns": conversation.turns,
            "tokensIn": conversation.tokens_in, "tokensOut": conversation.tokens_out, "cost": str(conversation.cost),
            "model": conversation.model, "afterTurn": after, "nextAfterTurn": following,
            "next": request.build_absolute_uri(f"/runtime/tasks/{task.id}/transcript?afterTurn={following}"
                                               f"&limit={limit}") if following is not None else None,
            "messages": conversation.messages,
        }
        if conversation.unreadable:
            body["unreadable"] = conversation.unreadable
        return Response(body)


class ToolServerListApi(RuntimeApi):
    @extend_schema(
        operation_id="tool_servers_list", tags=["Agents"], summary="Your tenant's tool servers",
        description="The downstream MCP servers your tenant's tasks may call through the policy gateway: name, URL, "
                    "the protocol version and tools its last check found (null and [] before a first check), and "
                    "the tools enabled for tasks (null: all). Operators add them (`manage.py tool_servers`, admin).",
        responses={200: inline_serializer("ToolServers", {"toolServers": inline_serializer("ToolServer", {
            "name": serializers.CharField(), "url": serializers.URLField(),
            "protocolVersion": serializers.CharField(allow_null=True),
            "tools": serializers.ListField(child=serializers.CharField()),
            "toolsReadAt": serializers.DateTimeField(allow_null=True),
            "enabledTools": serializers.ListField(child=serializers.CharField(), allow_null=True)}, many=True)})},
    )
    def get(self, request):
        return Response({"toolServers": selectors.tool_servers_of(tenant=request.tenant)})
