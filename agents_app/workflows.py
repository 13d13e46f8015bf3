"""The built-in `mcp_tool` workflow: one durable downstream tool call, made from the REST API, the admin or an MCP
client — input {"server", "tool", "arguments"}, result the tool's CallToolResult (isError included)."""

from tasks_app.registry import Workflow, register, step


@register
class McpTool(Workflow):
    name = "mcp_tool"
    version = "1"
    description = ("Call one tool of one of your tenant's downstream MCP servers, once: through the policy gateway, "
                   "with an idempotency key, recorded in the ledger (docs/tools.md).")
    input_schema = {
        "type": "object",
        "required": ["server", "tool"],
        "additionalProperties": False,
        "properties": {
            "server": {"type": "string", "minLength": 1, "maxLength": 63, "description": "A tool server's name."},
            "tool": {"type": "string", "minLength": 1, "maxLength": 128, "description": "The tool's name."},
            "arguments": {"type": "object", "description": "The tool's arguments (its inputSchema decides)."},
        },
    }

    def plan(self, goal, input, state):
        return ["call"]

    @step
    def call(self, ctx):
        ctx.state["result"] = ctx.tool(ctx.input["server"], ctx.input["tool"], ctx.input.get("arguments") or {})

    def result(self, state):
        return state.get("result")


from agents_app import agent  # noqa: E402, F401 — registers the built-in `agent` workflow
