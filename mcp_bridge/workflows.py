"""Workflows of the MCP bridge: none of its own; the conformance fixture pack only when MCP_CONFORMANCE_FIXTURES=1
(found at start-up by tasks_app's autodiscovery of ``workflows`` modules, in web processes and workers alike)."""

from django.conf import settings

if settings.MCP_CONFORMANCE_FIXTURES:
    from mcp_bridge.fixtures import workflows  # noqa: F401  (registers the fixtures)
