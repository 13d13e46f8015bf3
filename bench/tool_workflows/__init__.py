"""The workflows of bench/tool_calls.py, as a Django app the benchmark's own processes install (EXTRA_APPS): a bare
effect, an effect that makes one loopback HTTP POST, and one downstream MCP tool call per step."""
