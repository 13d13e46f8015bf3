"""Small helpers shared by tests."""


def create_task(client, body=None, *, key=None, **extra):
    body = body if body is not None else {"workflow": "demo_steps", "input": {"steps": 3}}
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post("/runtime/tasks", body, format="json", **headers, **extra)


def metric_reader(name: str, **labels):
    """A function giving how much the in-process Prometheus sample ``name`` with ``labels`` grew since this call
    (tests run the engine in the test process, whose metrics are the default registry's)."""
    from prometheus_client import REGISTRY

    def value() -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    start = value()
    return lambda: value() - start
