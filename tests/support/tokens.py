"""The ``tenant_token`` fixture (a plugin module: ``pytest_plugins`` in tests/conftest.py): a maker of a tenant and a
bearer token of a member of it, as a client of the REST API, the event streams or the MCP endpoint holds one.

    tenant, token = tenant_token("acme")                      # every scope (tasks:read, tasks:write, steer)
    _, reader = tenant_token("acme", scopes=("tasks:read",))  # the same member, another token

The member is ``<slug>-agent``, made once per tenant and reused; each call makes a new token."""

import pytest
from django.contrib.auth import get_user_model

from tasks_app.models import TOKEN_SCOPES, TenantMembership
from tasks_app.services import api_token_create, tenant_get_or_create


@pytest.fixture
def tenant_token(transactional_db):
    def make(slug: str, scopes=TOKEN_SCOPES, *, name: str = "mcp"):
        tenant = tenant_get_or_create(slug=slug, name=slug)
        user, _ = get_user_model().objects.get_or_create(username=f"{slug}-agent")
        TenantMembership.objects.get_or_create(user=user, tenant=tenant)
        return tenant, api_token_create(tenant=tenant, user=user, name=name, scopes=scopes)[1]

    return make
