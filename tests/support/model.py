"""The ``model`` fixture: the session's scripted model (tests/scripted_model_support.py, the ``scripted_model``
fixture in tests/conftest.py) configured as the runtime's model, "scripted-1", priced 2 and 8 per million tokens in
and out. A plugin module (``pytest_plugins`` in tests/conftest.py), so that every module may ask for it."""

import pytest

from tests.engine_support import configure


@pytest.fixture
def model(settings, scripted_model):
    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1", "prices": {"scripted-1": (2, 8)}})
    return scripted_model
