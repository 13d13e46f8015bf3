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



@pytest.fixture
def external_root(settings, tmp_path):
    """The example workflows' 'external systems' (effects log, outbox) write here, outside PostgreSQL."""
    settings.EXTERNAL_ROOT = tmp_path / "external"
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.EXTERNAL_ROOT


@pytest.fixture(scope="session", autouse=True)
def _empty_test_broker():
    """Tests own the broker database (deploy/dev.py test points REDIS_URL at database 15): start it empty."""
    import redis
    from django.conf import settings as django_settings

    if not django_settings.REDIS_URL.endswith("/15"):
        return  # not the test database: never flush someone's queues
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    client.flushdb()
    client.close()
