"""The tool gateway: every downstream MCP tool call a workflow makes (ctx.tool, the mcp_tool workflow, the agent
loop) goes through `tool_call` (call.py), in this order (docs/tools.md):

1. the server, by name, among the task's tenant's (ToolServer); the tool, from the server's tool list (read again
   when the tool is missing from it or the list is older than TOOLS_FRESH_SECONDS);
2. the policy, decided at the moment of the call — a policy changed mid-task applies to the next call — and the
   server's host, resolved and checked before any connection (agents_app.policy);
3. the arguments against the tool's inputSchema, before anything is sent;
4. the call, as an effect of the ledger (ctx.effect): its key `<task>:<step>:<server>.<tool>:<n>` committed as
   `started` before the request and sent with it (_meta and the Idempotency-Key header); the token read from the
   environment by its credential's name at this moment, never stored or logged;
5. an unknown outcome (the worker died mid-call, no answer in time) decided by the rule the call's ledger row
   records when it starts (tool_recovery → tasks_app.engine.effects.decide): readOnlyHint, idempotentHint or a
   server that honours the key → called again with the same key; otherwise the caller's `reconcile` hook, else the
   workflow's, else a person — after the call's deadline only (the task never calls it again blindly);
6. the result (isError included: a tool's own failure is a result, not an exception), screened before the
   workflow sees it (agents_app.screening), recorded with the step.

A request that never reached the server (connection refused, a 502/503/504/429 in front of it, its concurrency cap
full) is tried again here, a few times with backoff: nothing can be duplicated by that. Still not reached, the step
lets go of its worker and waits (ExternalWait, backoff 1 s … 30 s) and calls again — a restart or a deploy of the
server is ridden out — until `tools.unreachable_wait_seconds` has been waited, then fails with tool_unavailable.
A denied call never reaches the server: the step fails at once (no retry: it would be denied again) with
`tool_denied` naming the rule, and a `tool.denied` event.

Where each part lives (nothing is re-exported here: import from the module):

- errors.py      ToolError and its kinds (denied, unknown, arguments invalid, unavailable, refused, credential
                 missing or not granted, result rejected), and the tool.denied event;
- catalogue.py   1, 3: the servers and their tools — the server by name, how it is reached (URL, credential, era),
                 its tool list read and kept, the arguments against a tool's schema, its recovery rule, the tools
                 a model is offered, the calls the ledger holds;
- call.py        2, 4, 5: tool_call — the policy and host decision, the call and its tries while nothing was sent, a
                 server not reached waited for; a tenant's model endpoint's host check;
- downstream.py  a downstream task waited for, its questions relayed, and cancelled by the reaper once nobody waits;
- results.py     6: a result kept by reference when large, and screened before the workflow sees it.
"""
