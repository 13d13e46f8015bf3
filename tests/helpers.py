"""Small helpers shared by tests."""


def create_task(client, body=None, *, key=None, **extra):
    body = body if body is not None else {"workflow": "demo_steps", "input": {"steps": 3}}
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post("/runtime/tasks", body, format="json", **headers, **extra)
