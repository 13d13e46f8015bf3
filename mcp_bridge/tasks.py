"""mcp_bridge's Celery tasks (found by the app's autodiscovery); thin: the work is in mcp_bridge.oauth.cleanup."""

from celery import shared_task


@shared_task(name="runtime.oauth_cleanup", ignore_result=True)
def oauth_cleanup() -> None:
    """Remove expired OAuth tokens, grants and CIMD clients (scheduled by django-celery-beat: the "runtime: clear
    expired OAuth tokens" periodic task, made by mcp_bridge migration 0002)."""
    from mcp_bridge.oauth.cleanup import oauth_expired_clear

    oauth_expired_clear()
