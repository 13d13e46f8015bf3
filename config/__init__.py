# config/ holds two things (tests/test_layers.py checks which module is which): the base every app imports
# (problems, json_input, canonical, runtime, rate_limits, ...) and the top-level wiring that imports the apps
# (settings/, urls, asgi, celery, beat, ...). This package runs with every base import, so it loads no wiring:
# the Celery app is loaded by the settings (config/settings/__init__.py), which every process reads first.
#
# What the Celery app's module did on its way here before, this package still does: name the settings, so that a
# module run on its own (`python -m agents_app.screening --corpus`) whose imports reach DRF — which reads the
# settings at import — finds them. Naming them loads nothing.
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
