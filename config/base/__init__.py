"""config's base: the helpers every app imports (problem details, bounded JSON, canonical JSON, the runtime
configuration, rate limits, negotiation, the admin's base classes, lazy imports, the ASGI helpers the apps'
edges use). It imports no app and no wiring: tests/test_layers.py checks it."""
