"""The agent: an LLM loop as a durable, steerable workflow (docs/agents.md, docs/architecture.md §11).

Each turn is two steps of the engine, so each is committed before the next begins:

- `think`: one model request — the instructions and the goal, the conversation so far, the tools this task may be shown
  (the gateway's view: agents_app.gateway.catalogue.tools_offered) — streamed (its text published live as `llm.delta`,
  never stored), then the model's message stored (agents_app.transcript) and its usage counted. The step commits the
  message's reference before any tool it asked for runs: a crash after that commit never calls the model again for the
  turn (money and determinism); a crash during the call calls it again (a model call has no side effect; the attempt is
  counted). An answer without a tool call ends the plan (ctx.end_plan): the task completes with it.
- `act`: the tool calls that message asked for, in order, each through ctx.tool — policy, host check, schema,
  ledger, approvals and output screening apply — so the model's output never bypasses policy: a tool it was not
  shown, invented, denied, or arguments its schema refuses become an error result the model reads (and an event),
  never a call. Built in: `finish(result)` ends the task with that result, `ask_human(question, schema?)` waits for a
  person (their answer is the tool's result, in the next request). A loop — the same call with the same arguments
  `agent.loop_repeats` times — is not called again: the task asks a person to let it go on or stop it.

Steering lands between the steps (the engine's safe points): pause, resume, cancel, kill as for any task;
adjust_goal is told to the model in its next request (and is in the audit chain as plan.adjusted); provide_input
answers ask_human; approve / reject answer a gated tool — a rejection is a result the model reads and can act on.

Subclass Agent (and @register it under a name of your own) to fix the instructions, the servers or the tools;
`instructions()`, `servers()` and `extra_tools()` / `call_extra_tool()` are the hooks.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from typing import Any

from django.conf import settings
from django.utils.functional import classproperty

from agents_app import llm, selectors, transcript
from agents_app.gateway.call import model_host_check
from agents_app.gateway.catalogue import task_facts, tools_offered
from agents_app.gateway.errors import ToolError
from agents_app.models import ToolServer
from config.base import json_input
from checkpoints_app.models import Recovery
from tasks_app.engine.waits import EffectAbandoned, EffectRejected, ExternalWait
from tasks_app.observability import metrics
from tasks_app.redaction import redact_json
from tasks_app.registry import Workflow, register, step
from tasks_app.streaming import live_publish

FINISH, ASK_HUMAN = "finish", "ask_human"
_FUNCTION_NAME = re.compile(r"[^A-Za-z0-9_-]")
TOOL_RESULT_MAX_CHARS = 20_000  # what one tool result may put in front of the model (the rest is cut, saying so)
DELTA_EVERY_SECONDS = 0.1  # live text is published in pieces at most this often
BASE_INSTRUCTIONS = (
    "You are an agent working towards a goal a person set. Use the tools offered to you; each call is made once and "
    "recorded. When the goal is reached, call `finish` with the result (or answer without calling a tool). If you "
    "need something only a person can give — a decision, a missing fact, a permission — call `ask_human`. A tool "
    "result that says a call was denied, refused or rejected means that way is closed: choose another."
)
BUILTIN_TOOLS = [
    {"type": "function", "function": {
        "name": FINISH,
        "description": "End the task: the goal is reached (or cannot be). `result` is what it produced.",
        "parameters": {"type": "object", "properties": {"result": {"description": "The task's result (any JSON)."}},
                       "required": ["result"]}}},
    {"type": "function", "function": {
        "name": ASK_HUMAN,
        "description": "Ask a person and wait for their answer (minutes or days). `schema` (JSON Schema) shapes the "
                       "answer; without it the answer is text.",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"},
                                                        "schema": {"type": "object"}},
                       "required": ["question"]}}},
]
# When the conversation would outgrow this share of the model's context window, the turns before the last KEEP_TURNS
# are summarised (one recorded model call) and the summary stands in for them in every request after.
SUMMARISE_AT = 0.75
KEEP_TURNS = 2
SUMMARY_INSTRUCTIONS = ("You summarise an agent's work so far for the agent itself: what was tried, what each tool "
                        "returned that still matters, what people said, what is decided and what is left. Keep "
                        "names, numbers and identifiers exactly. Plain text.")
SUMMARY_PROMPT = "Summarise the conversation so far, given below as JSON messages."
SUMMARY_HEADING = "Summary of the earlier turns (the originals are kept for audit):"
LOOP_SCHEMA = {"type": "object", "required": ["decision"], "additionalProperties": False,
               "properties": {"decision": {"enum": ["continue", "stop"],
                                           "description": "continue: the agent goes on (told not to repeat the "
                                                          "call); stop: the task completes here."}}}


def function_name(server: str, tool: str) -> str:
    """A tool's name as the model sees it: `server__tool` (Chat Completions names allow letters, digits, '_', '-'
    and at most 64 characters; a longer one is cut and made unique by a digest)."""
    name = f"{server}__{_FUNCTION_NAME.sub('_', tool)}"
    if len(name) > 64:
        name = name[:55] + "_" + hashlib.sha256(f"{server}.{tool}".encode()).hexdigest()[:8]
    return name


def goal_text(goal: Any, input: dict) -> str:
    """The goal as the model reads it: the task's goal once set (adjust_goal sets {"text", "parameters"}), else the
    input's."""
    if isinstance(goal, dict) and goal.get("text"):
        return str(goal["text"])
    if isinstance(goal, str) and goal:
        return goal
    return str(input.get("goal", ""))


def result_text(result: dict) -> str:
    """A CallToolResult as the model reads it: its text (structured content as JSON when it has no text), bounded."""
    parts = [item.get("text", "") for item in result.get("content") or [] if item.get("type") == "text"]
    text = "\n".join(part for part in parts if part)
    if not text and result.get("structuredContent") is not None:
        text = json.dumps(result["structuredContent"], ensure_ascii=False)
    if not text:
        text = json.dumps({k: v for k, v in result.items() if k != "_meta"}, ensure_ascii=False)
    if result.get("isError"):
        text = f"The tool reported an error: {text}"
    if len(text) > TOOL_RESULT_MAX_CHARS:
        text = text[:TOOL_RESULT_MAX_CHARS] + f"\n[… {len(text) - TOOL_RESULT_MAX_CHARS} more characters not shown]"
    return text


MODEL_WAIT_MAX_SECONDS = 30.0  # the longest park between two asks of a model that does not answer


def model_unavailable_wait(ctx, unavailable: llm.ModelUnavailable) -> BaseException:
    """A model that still did not answer after the client's retries (down, overloaded, a stream broken off): wait
    for it without a worker — the think step parks and asks again, after half as long as it has waited so far (1 s
    to 30 s) — while the wait stays within model.unavailable_wait_seconds; past it, the ModelUnavailable itself (the
    step's retries, then the task fails). A model call has no side effect, so asking again is always safe; what an
    hour-long run must not do is fail on a minute's outage of its endpoint.

    How long it has waited is counted from the task's newest event on the database's clock (its last step's commit,
    a resume, a recovery): a park writes none, so the count survives the parks and any worker's crash, and no
    worker's clock is trusted. The time the turn's request ran before it failed counts as waiting too."""
    budget = settings.RUNTIME.model.unavailable_wait_seconds
    waited = selectors.task_seconds_since_last_event(task_id=ctx.task_id)
    if waited >= budget:
        if budget:
            unavailable.args = (f"{unavailable}; waited about {waited:.0f} s for it "
                                f"(model.unavailable_wait_seconds: {budget:g})",)
        return unavailable
    seconds = min(MODEL_WAIT_MAX_SECONDS, max(1.0, waited / 2), budget - waited)
    return ExternalWait(seconds, f"Waiting for the model: {unavailable}; asking again in {seconds:.0f} s")


class _LiveText:
    """The model's text as it streams, published to the task's subscribers in pieces (never stored)."""

    def __init__(self, task_id, turn: int):
        self.task_id, self.turn = task_id, turn
        self.pending: list[str] = []
        self.sent_at = 0.0
        self.offset = 0  # characters published before the pending ones (0 again: the turn's call started over)
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            self.pending.append(text)
            if time.monotonic() - self.sent_at >= DELTA_EVERY_SECONDS:
                self._flush()

    def close(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            text = "".join(self.pending)
            live_publish(task_id=self.task_id, type="llm.delta",
                         data={"turn": self.turn, "offset": self.offset, "text": text})
            self.pending, self.sent_at, self.offset = [], time.monotonic(), self.offset + len(text)


@register
class Agent(Workflow):
    name = "agent"
    version = "1"
    description = ("An LLM agent that works towards a goal with your tenant's MCP tools: each model call recorded "
                   "once, each tool call through the policy gateway and the ledger, people in the loop (ask_human, "
                   "approvals, adjust_goal).")
    mcp_task_support = "required"
    on_budget_exhausted = classproperty(lambda cls: settings.RUNTIME.agent.on_budget)  # wait or fail, as configured
    mcp_annotations = {"title": "Run an agent", "readOnlyHint": False, "destructiveHint": True,
                       "idempotentHint": False, "openWorldHint": True}
    input_schema = {
        "type": "object",
        "required": ["goal"],
        "additionalProperties": False,
        "properties": {
            "goal": {"type": "string", "minLength": 1, "maxLength": 20_000, "description": "What the agent is to do."},
            "instructions": {"type": "string", "maxLength": 50_000,
                             "description": "How to go about it (added to the built-in instructions)."},
            "model": {"type": "string", "minLength": 1, "maxLength": 200,
                      "description": "The model's name on the deployment's endpoint (default: model.name)."},
            "servers": {"type": "array", "maxItems": 50, "uniqueItems": True,
                        "items": {"type": "string", "minLength": 1, "maxLength": 63},
                        "description": "The tool servers whose tools the model is shown (default: all of the "
                                       "tenant's; the tool policy applies either way)."},
            "maxTurns": {"type": "integer", "minimum": 1, "maximum": 1000,
                         "description": "Model calls at most (agent.max_turns caps it)."},
        },
    }

    turn_step = "think"  # a fork may start again at a turn (fromTurn): the think step that began it

    @classmethod
    def fork_inherit(cls, *, original_id, fork_id, variables: dict) -> None:
        # The inherited state refers to the conversation's messages by digest; they are the original's rows.
        transcript.messages_copy(original_id, fork_id, transcript.refs_in(variables))

    # -- hooks for a subclass -------------------------------------------------------------------------------------
    def instructions(self, input: dict) -> str:
        extra = input.get("instructions")
        return BASE_INSTRUCTIONS + (f"\n\n{extra}" if extra else "")

    def servers(self, input: dict) -> list[str] | None:
        return input.get("servers")

    # -- the plan -------------------------------------------------------------------------------------------------
    @classmethod
    def tenant_errors(cls, data: Any, *, tenant) -> list[dict[str, str]]:
        errors = []
        if llm.endpoint_get(data.get("model"), tenant_id=tenant.id) is None:
            errors.append({"field": "input.model", "message": llm.NOT_CONFIGURED_HELP})
        named = data.get("servers") or []
        known = set(ToolServer.objects.filter(tenant=tenant, name__in=named).values_list("name", flat=True))
        errors += [{"field": f"input.servers.{index}",
                    "message": f"This tenant has no tool server {name!r} (manage.py tool_servers list)."}
                   for index, name in enumerate(named) if name not in known]
        return errors

    def plan(self, goal, input, state):
        turns = min(input.get("maxTurns") or settings.RUNTIME.agent.max_turns, settings.RUNTIME.agent.max_turns)
        return ["think", "act"] * turns  # most end earlier: the step that ends the loop ends the plan

    def result(self, state):
        return state.get("result")

    # -- think: one model call ------------------------------------------------------------------------------------
    @step
    def think(self, ctx):
        state = ctx.state
        turn = state.get("turns", 0) + 1
        goal = goal_text(ctx.goal, ctx.input)
        endpoint = llm.endpoint_get(ctx.input.get("model"), tenant_id=task_facts(ctx)["tenant_id"])
        if endpoint is None:
            raise llm.ModelNotConfigured(llm.NOT_CONFIGURED_HELP)
        if endpoint.tenant_owned:
            model_host_check(ctx, endpoint.base_url)  # (a tenant's own endpoint: its host is policy's)
        if turn == 1:
            opening = [{"role": "system", "content": self.instructions(ctx.input)}, {"role": "user", "content": goal}]
            state["goal_seen"] = goal
            history = opening
        else:
            opening = []
            since = self._answers_since(ctx)  # (they answer the last turn: kept with it)
            if state.get("result") is not None:  # a person stopped it (a loop): no model call
                self._append(ctx, turn - 1, since)
                ctx.end_plan()
                return {"turn": turn - 1, "stopped": True}
            if goal != state.get("goal_seen"):
                # adjust_goal: the model is told in this request; the change itself is in the chain (plan.adjusted).
                since.append({"role": "user", "content": f"A person changed the goal. The goal is now: {goal}"})
                state["goal_seen"] = goal
            self._append(ctx, turn - 1, since)
            history = self._history(ctx, turn - 1)
            if self._too_long(ctx, endpoint, history):
                history = self._summarised(ctx, endpoint, turn)
        offered = tools_offered(ctx, self.servers(ctx.input))
        functions = {function_name(row.name, spec["name"]): [row.name, spec["name"]] for row, spec in offered}
        tools = BUILTIN_TOOLS + [
            {"type": "function", "function": {"name": function_name(row.name, spec["name"]),
                                              "description": (spec.get("description") or "")[:1024],
                                              "parameters": spec.get("inputSchema") or {"type": "object"}}}
            for row, spec in offered]
        live = _LiveText(ctx.task_id, turn)
        try:
            reply = llm.chat(endpoint, messages=history, tools=tools, on_delta=live)
        except llm.ModelUnavailable as unavailable:
            raise model_unavailable_wait(ctx, unavailable) from None
        finally:
            live.close()
        refs = transcript.messages_store(ctx.task_id, [*opening, reply.message])
        state[f"m{turn:04d}"] = refs  # this turn's messages (the request's new ones and the answer), by reference
        state["turns"] = turn
        state["functions"] = functions  # the names the model was shown this turn (act calls only these)
        state["answer"] = refs[-1]  # the model's message, whose tool calls act makes (by reference: they may be long)
        state["last_prompt_tokens"] = reply.prompt_tokens  # (how long the conversation is, as the model counts)
        state["tokens_in"] = state.get("tokens_in", 0) + reply.prompt_tokens
        state["tokens_out"] = state.get("tokens_out", 0) + reply.completion_tokens
        cost = reply.cost(endpoint)
        metrics.model_used(model=endpoint.metrics_label, tenant=task_facts(ctx)["tenant__slug"],
                           tokens_in=reply.prompt_tokens, tokens_out=reply.completion_tokens, cost=cost)
        ctx.spend(cost, tokens=reply.prompt_tokens + reply.completion_tokens)
        ctx.events.append(("llm.message", {
            "turn": turn, "model": endpoint.model, "finish": reply.finish_reason,
            "tokensIn": reply.prompt_tokens, "tokensOut": reply.completion_tokens, "cost": str(cost),
            "toolCalls": [call["name"] for call in reply.tool_calls],
            "content": redact_json((reply.message.get("content") or "")[:2000]), "ref": refs[-1]}))
        ctx.progress(min(0.99, turn / max(len(self.plan(ctx.goal, ctx.input, {})) // 2, 1)),
                     f"turn {turn}: " + (", ".join(call["name"] for call in reply.tool_calls) or "answered"))
        if not reply.tool_calls:
            state["result"] = {"answer": reply.message.get("content"), "turns": turn}
            ctx.end_plan()
        return {"turn": turn, "toolCalls": len(reply.tool_calls)}

    # -- act: the tool calls the model asked for ------------------------------------------------------------------
    @step
    def act(self, ctx):
        state = ctx.state
        turn = state["turns"]
        config = settings.RUNTIME.agent
        answers: list[dict] = []
        finished = False
        answer, = transcript.messages_load(ctx.task_id, [state["answer"]])
        calls = [{"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
                 for call in answer.get("tool_calls") or []]
        for index, call in enumerate(calls):
            def answer(text: str, call=call) -> None:
                answers.append({"role": "tool", "tool_call_id": call["id"], "content": text})

            if finished:
                answer("Not made: the agent finished before this call.")
                continue
            if index >= config.max_tool_calls_per_turn:
                answer(f"Not made: at most {config.max_tool_calls_per_turn} tool calls per turn.")
                continue
            try:
                # (the model's text, read under config.base.json_input's rules: 10,000 levels of brackets raised
                # RecursionError in the step, a JsonInputError is a ValueError — answered to the model below)
                arguments = json_input.loads(call["arguments"] or "{}")
                if not isinstance(arguments, dict):
                    raise ValueError("not an object")
            except ValueError as bad:
                answer(f"Not made: the arguments are not a JSON object ({bad}).")
                ctx.events.append(("tool.denied", {"tool": call["name"], "rule": "arguments are not a JSON object"}))
                continue
            if call["name"] == FINISH:
                state["result"] = {"result": arguments.get("result"), "turns": turn}
                finished = True
                answer("Finished.")
                continue
            if call["name"] == ASK_HUMAN:
                if state.get("asking"):
                    answer("Not asked: one question per turn; ask again after the answer.")
                    continue
                wait = f"ask_human_{turn}"
                schema = arguments.get("schema") if isinstance(arguments.get("schema"), dict) else {"type": "string"}
                ctx.wait_for_input(wait, schema, str(arguments.get("question") or "The agent asks for your input."))
                state["asking"] = {"call": call["id"], "wait": wait}
                continue  # (its answer is the tool's result, in the next request)
            target = (state.get("functions") or {}).get(call["name"])
            if target is None:
                answer(f"Not made: there is no tool {call['name']!r} among those offered to you.")
                ctx.events.append(("tool.denied", {"tool": call["name"], "rule": "not offered to the model"}))
                continue
            # One state key per distinct call (not one dict changed in place, which every step's delta would carry
            # whole: a long agent's step rows would grow with all the calls it ever made).
            fingerprint = "seen." + hashlib.sha256(json.dumps([call["name"], arguments],
                                                              sort_keys=True).encode()).hexdigest()[:24]
            made_before = state.get(fingerprint, 0)
            if made_before + 1 >= config.loop_repeats:
                answer(f"Not made: the same call with the same arguments was made {made_before} times already; a "
                       f"person is asked whether to go on.")
                if not ctx.wait_request:
                    ctx.wait_for_input(f"loop_{turn}", LOOP_SCHEMA,
                                       f"The agent called {'.'.join(target)} with the same arguments "
                                       f"{config.loop_repeats} times. Let it go on, or stop it here?")
                    state["looping"] = {"wait": f"loop_{turn}", "fingerprint": fingerprint}
                continue
            state[fingerprint] = made_before + 1
            answer(self._call_tool(ctx, target[0], target[1], arguments))
        self._append(ctx, turn, answers)
        if finished:
            ctx.end_plan()
        return {"turn": turn, "answered": len(answers)}

    def _call_tool(self, ctx, server: str, tool: str, arguments: dict) -> str:
        """One tool call through the gateway; what the model is told. A call the gateway refuses to make (denied,
        unknown, arguments invalid, server not reachable or refusing) is an error the model reads — with its
        event — and the loop goes on; an unknown outcome is the engine's to decide (it propagates)."""
        try:
            return result_text(ctx.tool(server, tool, arguments))
        except ToolError as refused:
            ctx.events.extend(refused.events)
            return f"Not made: {refused} ({refused.reason})."
        except EffectRejected as rejected:
            said = f": {rejected.reason}" if rejected.reason else ""
            return f"A person rejected this call{said}. Choose another way."
        except EffectAbandoned:
            return "Whether this call happened is not known, and a person chose to abandon it: do not rely on it."

    # -- the transcript --------------------------------------------------------------------------------------------
    def _history(self, ctx, through_turn: int) -> list[dict]:
        """What the model reads: the opening (instructions, goal), the summary of the turns it replaces if there is
        one, then every turn after it."""
        state = ctx.state
        summary = state.get("summary")  # {"ref", "through"}: turns 1..through summarised
        if summary is None:
            refs = [ref for turn in range(1, through_turn + 1) for ref in state.get(f"m{turn:04d}", [])]
            return transcript.messages_load(ctx.task_id, refs)
        after = range(summary["through"] + 1, through_turn + 1)
        refs = [*state["m0001"][:2], summary["ref"], *(ref for turn in after for ref in state.get(f"m{turn:04d}", []))]
        return transcript.messages_load(ctx.task_id, refs)

    def _too_long(self, ctx, endpoint: llm.Endpoint, history: list[dict]) -> bool:
        """Whether the next request would outgrow SUMMARISE_AT of the model's context window: the last request's
        size as the model counted it, plus what was added since (4 characters a token)."""
        counted = ctx.state.get("last_prompt_tokens") or 0
        added = sum(len(json.dumps(message)) for message in history[-8:]) // 4  # (the newest, roughly)
        return counted + added >= endpoint.context_window * SUMMARISE_AT and ctx.state.get("turns", 0) > KEEP_TURNS

    def _summarised(self, ctx, endpoint: llm.Endpoint, turn: int) -> list[dict]:
        """Summarise the older turns in a model call of their own, recorded in the ledger (an effect: a re-run of this
        step after a failure reuses it; one cut off by a crash is made again — it has no side effect); the summary is
        a message of the transcript and replaces those turns in every request from now on. The originals stay, by
        reference, in the state and the transcript rows (audit)."""
        state = ctx.state
        through = turn - 1 - KEEP_TURNS  # the last KEEP_TURNS turns stay as they are
        previous = state.get("summary")
        if through < 1 or (previous and previous["through"] >= through):
            return self._history(ctx, turn - 1)
        older = self._history(ctx, through)[2:]  # (the opening stays as it is)
        goal = goal_text(ctx.goal, ctx.input)
        request = [{"role": "system", "content": SUMMARY_INSTRUCTIONS},
                   {"role": "user", "content": f"{SUMMARY_PROMPT} The goal: {goal}\n\n"
                                               + json.dumps(older, ensure_ascii=False)}]

        def summarise(_key: str) -> dict:
            reply = llm.chat(endpoint, messages=request)
            metrics.model_used(model=endpoint.metrics_label, tenant=task_facts(ctx)["tenant__slug"],
                               tokens_in=reply.prompt_tokens, tokens_out=reply.completion_tokens,
                               cost=reply.cost(endpoint))
            return {"content": reply.message.get("content") or "", "tokensIn": reply.prompt_tokens,
                    "tokensOut": reply.completion_tokens, "cost": str(reply.cost(endpoint))}

        # A summary asked again changes nothing outside (it costs a model call): its rule is repeat, recorded on its
        # ledger row, so an unknown outcome is decided alike whether its step meets it again or goes past it.
        made = ctx.effect(f"summary:{through}", summarise, recovery=Recovery.REPEAT)
        ctx.spend(made["cost"])
        state["tokens_in"] = state.get("tokens_in", 0) + made["tokensIn"]
        state["tokens_out"] = state.get("tokens_out", 0) + made["tokensOut"]
        ref = transcript.messages_store(ctx.task_id, [{"role": "user", "content": f"{SUMMARY_HEADING}\n"
                                                                                   f"{made['content']}"}])[0]
        state["summary"] = {"ref": ref, "through": through}
        ctx.events.append(("llm.summary", {"through": through, "ref": ref, "tokensIn": made["tokensIn"],
                                           "tokensOut": made["tokensOut"]}))
        return self._history(ctx, turn - 1)

    def _append(self, ctx, turn: int, messages: list[dict]) -> None:
        if messages:
            refs = transcript.messages_store(ctx.task_id, messages)
            ctx.state[f"m{turn:04d}"] = [*ctx.state.get(f"m{turn:04d}", []), *refs]

    def _answers_since(self, ctx) -> list[dict]:
        """What people answered since the last turn, as the messages the model reads."""
        state = ctx.state
        messages = []
        asking = state.get("asking")
        if asking:
            value = ctx.answers.get(asking["wait"])
            messages.append({"role": "tool", "tool_call_id": asking["call"],
                             "content": value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)})
            state["asking"] = None
        looping = state.get("looping")
        if looping:
            decision = (ctx.answers.get(looping["wait"]) or {}).get("decision")
            if decision == "stop":
                state["result"] = {"stopped": "a person stopped the agent: it repeated a call", "turns": state["turns"]}
            else:
                state[looping["fingerprint"]] = 0
                messages.append({"role": "user", "content": "A person let you go on. Do not repeat the same call "
                                                            "with the same arguments: try another way."})
            state["looping"] = None
        return messages
