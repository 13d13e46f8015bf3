"""Fixtures on real PostgreSQL and Redis (the test command points DATABASE_URL / REDIS_URL at them)."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tasks_app.services import api_token_create, tenant_get_or_create


@pytest.fixture
def tenant(db):
    return tenant_get_or_create(slug="acme", name="Acme")


@pytest.fixture
def other_tenant(db):
    return tenant_get_or_create(slug="globex", name="Globex")


def _client_for(tenant, username):
    user = get_user_model().objects.create_user(username=username, password=None)
    _, raw = api_token_create(tenant=tenant, user=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.user = user
    client.raw_token = raw
    return client


@pytest.fixture
def api(tenant):
    """An API client authenticated with a bearer token of tenant `acme`."""
    return _client_for(tenant, "alice")


@pytest.fixture
def other_api(other_tenant):
    """An API client of another tenant, `globex`."""
    return _client_for(other_tenant, "mallory")

