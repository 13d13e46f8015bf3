import pytest
from django.core.exceptions import ImproperlyConfigured

from config.base.runtime import load_runtime_config


def test_it_loads_the_shipped_configuration():
    config = load_runtime_config()

    assert (config.lease_seconds, config.heartbeat_seconds, config.max_recoveries) == (30, 10, 3)
    assert (config.checkpoint.every_steps, config.checkpoint.max_interval_seconds) == (10, 60)


def test_it_lets_the_environment_override_a_key(monkeypatch):
    monkeypatch.setenv("RUNTIME_LEASE_SECONDS", "45")
    monkeypatch.setenv("RUNTIME_CHECKPOINT__EVERY_STEPS", "4")

    config = load_runtime_config()

    assert config.lease_seconds == 45.0 and config.checkpoint.every_steps == 4


@pytest.mark.parametrize("text, key", [
    ("lease_seconds: soon\n", "lease_seconds"),
    ("max_recoveries: -1\n", "max_recoveries"),
    ("checkpoint:\n  every_steps: 0\n", "checkpoint.every_steps"),
    ("checkpoint:\n  evry_steps: 5\n", "checkpoint.evry_steps"),
    ("lease_seconds: 30\nheartbeat_seconds: 20\n", "heartbeat_seconds"),
    ("step_retry:\n  max_attempts: true\n", "step_retry.max_attempts"),
    ("slice_secs: 1\n", "slice_secs"),
    ("examples:\n  document_review:\n    publish_server: Reports.v2\n", "examples.document_review.publish_server"),
])
def test_it_refuses_invalid_configuration_naming_the_key(tmp_path, text, key):
    path = tmp_path / "runtime.yaml"
    path.write_text(text)

    with pytest.raises(ImproperlyConfigured, match=f"`{key}`"):
        load_runtime_config(path)


def test_it_lets_the_environment_name_document_reviews_publish_server_or_none(monkeypatch):
    assert load_runtime_config().examples.document_review.publish_server == "reports"  # the shipped default

    monkeypatch.setenv("RUNTIME_EXAMPLES__DOCUMENT_REVIEW__PUBLISH_SERVER", "404")
    assert load_runtime_config().examples.document_review.publish_server == "404"  # a name, though YAML reads 404
    monkeypatch.setenv("RUNTIME_EXAMPLES__DOCUMENT_REVIEW__PUBLISH_SERVER", "null")
    assert load_runtime_config().examples.document_review.publish_server is None  # always the outbox file


def test_it_refuses_an_invalid_environment_override(monkeypatch):
    monkeypatch.setenv("RUNTIME_MAX_RECOVERIES", "many")

    with pytest.raises(ImproperlyConfigured, match="`max_recoveries`"):
        load_runtime_config()


def test_it_stops_a_process_at_start_on_invalid_configuration(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "runtime.yaml"
    path.write_text("lease_seconds: 0\n")
    result = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True, text=True,
                            env={**os.environ, "RUNTIME_CONFIG_FILE": str(path)})

    assert result.returncode != 0
    assert "runtime configuration `lease_seconds`: must be seconds ≥ 1" in result.stderr


def test_it_refuses_a_transaction_pooler_without_a_session_url_and_takes_it_with_one():
    """Failover's session-level locks cannot live in a transaction pool (docs/failover.md): DATABASE_POOLER=transaction
    without DATABASE_SESSION_URL stops the process at start, saying what to set; with it, prepared statements and
    server-side cursors are off for the pooled alias and the locks get an alias of their own."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "DATABASE_POOLER": "transaction"}
    env.pop("DATABASE_SESSION_URL", None)
    refused = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True, text=True, env=env)
    assert refused.returncode != 0
    assert "DATABASE_POOLER=transaction needs DATABASE_SESSION_URL" in refused.stderr

    show = ("import json, django; django.setup(); from django.conf import settings as s; d = s.DATABASES; "
            "print(json.dumps([d['default']['OPTIONS'].get('prepare_threshold', 'unset'), "
            "d['default'].get('DISABLE_SERVER_SIDE_CURSORS'), sorted(d), d['session']['NAME']]))")
    taken = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True,
                           env={**env, "DATABASE_SESSION_URL": "postgres://postgres@127.0.0.1:5432/direct",
                                "DJANGO_SETTINGS_MODULE": "config.settings"})
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert json.loads(taken.stdout.strip().splitlines()[-1]) == [None, True, ["default", "session"], "direct"]
