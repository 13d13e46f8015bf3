"""The benchmark's floor: a plain Celery chain with no durability, the cheapest way Celery can run N-step work.

Our durable runtime is compared against this. Each task is a chain of `steps` links of one task, `floor.step`,
which appends a line to a file (the stand-in external effect, so duplicate effects can be counted) and, on the
last link, records the completion time in the Redis hash `floor:done`. No Django, no database, no result backend.

Environment (both must be set before this module is imported, in the driver and in the worker):
    FLOOR_BROKER_URL  a Redis URL, e.g. redis://127.0.0.1:6379/12; also holds `floor:done`
    FLOOR_EFFECTS     the effects file, one line `<task_id>:<index> <epoch seconds>` per step run

Worker (started by the caller, cwd = the project root):
    celery -A bench.floor worker -Q floor -n floor1@%h --pool prefork --concurrency 4 --loglevel WARNING \
        --without-gossip --without-mingle --without-heartbeat

Driver (in-process): reset(), then create() + wait() + results() for an open loop, or closed_loop().

Smoke test (starts its own worker with concurrency 2; FLOOR_BROKER_URL defaults to redis://127.0.0.1:6379/12,
FLOOR_EFFECTS to a temporary file; exits non-zero if any task was lost):
    python -m bench.floor smoke
"""

from __future__ import annotations

import base64
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import redis
from celery import Celery, chain
from celery.signals import worker_init

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "floor"
DONE_KEY = "floor:done"
SMOKE_BROKER_URL = "redis://127.0.0.1:6379/12"

if __name__ == "__main__":
    # `python -m bench.floor smoke` may run with nothing set, and the app below reads the broker URL at import.
    # The worker it starts inherits these through the environment.
    os.environ.setdefault("FLOOR_BROKER_URL", SMOKE_BROKER_URL)
    if "FLOOR_EFFECTS" not in os.environ:
        _effects_fd, os.environ["FLOOR_EFFECTS"] = tempfile.mkstemp(prefix="floor-effects-", suffix=".log")
        os.close(_effects_fd)

app = Celery("bench_floor", broker=os.environ["FLOOR_BROKER_URL"])
app.conf.update(
    # Nothing reads a task's return value; completions go to `floor:done` instead.
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    # Its own queue, so it never shares one with the runtime's `celery` queue on the same Redis db.
    task_default_queue=QUEUE,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    # Acks (early) and prefetch are left at Celery's defaults on purpose: the floor is Celery as it comes.
)

_done_store: tuple[int, redis.Redis] | None = None


@worker_init.connect
def _agent_sdks_imported(**kwargs):
    """WA (bench/compare.py): the agent loop's SDKs imported once, before the pool forks, as DBOS's workers import
    them at start — not on each pool process's first turn, inside the measured window."""
    if os.environ.get("AGENT_MODEL_URL"):
        import bench.peers.agent_turn  # noqa: F401


def done_store() -> redis.Redis:
    """The Redis client for `floor:done`, made on first use in each process: a prefork child must not reuse a
    connection its parent opened before the fork."""
    global _done_store
    if _done_store is None or _done_store[0] != os.getpid():
        _done_store = (os.getpid(), redis.Redis.from_url(os.environ["FLOOR_BROKER_URL"], decode_responses=True))
    return _done_store[1]


def effects_path() -> Path:
    return Path(os.environ["FLOOR_EFFECTS"])


@app.task(name="floor.step")
def step(task_id: str, index: int, steps: int, payload: str = "", sleep_ms: int = 0) -> None:
    # `payload` is the state a link hands on (bench/compare.py's W1-big: 32 KB in every message, as a chain
    # carrying its state would); `sleep_ms` lengthens the step so that a SIGKILL lands mid-step (W3).
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    # Open, write, close on every step: the effect is out of the worker's hands once the call returns, as an
    # external effect would be. One short write in append mode is not interleaved with other processes' lines.
    with open(effects_path(), "a") as effects:
        effects.write(f"{task_id}:{index} {time.time():.6f}\n")
    if index == steps - 1:
        done_store().hset(DONE_KEY, task_id, time.time())


@app.task(name="floor.agent_turn")
def agent_turn(messages: list, task_id: str, turn: int, turns: int) -> list:
    """One turn of an agent as a chain carries it (bench/compare.py's WA): ask the model with the conversation so far,
    make the tool call it asked for (bench/peers/agent_turn.py), hand the longer conversation to the next link (the
    chain's messages grow with it). The answer without a tool call is the agent's last: its completion time goes to
    `floor:done`; each turn appends an effect line, as `step` does."""
    from bench.peers import agent_turn as loop

    answer = loop.ask(messages)
    more = loop.act(messages, answer, f"{task_id}:{turn}")
    with open(effects_path(), "a") as effects:
        effects.write(f"{task_id}:{turn} {time.time():.6f}\n")
    if not more or turn == turns - 1:
        done_store().hset(DONE_KEY, task_id, time.time())
    return messages


def create_agents(keys: list[str], turns: int) -> dict[str, float]:
    """One chain of `turns` agent_turn links per conversation key (the first link gets the opening messages, each
    next one the conversation its predecessor returns); {task_id: epoch seconds just before it was sent}."""
    from bench.peers import agent_turn as loop

    created: dict[str, float] = {}
    for key in keys:
        task_id = f"floor-agent-{uuid4().hex}"
        links = [agent_turn.s(loop.first_messages(key), task_id, 0, turns),
                 *(agent_turn.s(task_id, turn, turns) for turn in range(1, turns))]
        created[task_id] = time.time()
        chain(*links).apply_async()
    return created


def fresh_text(size: int) -> str:
    """`size` characters of random base64: what no compressor shrinks (TOAST and the broker would squeeze a run of
    one letter to nothing)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size] if size else ""


def reset() -> None:
    """Forget earlier runs: no completions, no effects."""
    done_store().delete(DONE_KEY)
    effects_path().write_text("")


def create(n: int, steps: int, *, payload_bytes: int = 0, sleep_ms: int = 0) -> dict[str, float]:
    """Send n chains of `steps` links; return {task_id: epoch seconds just before it was sent}."""
    task_ids = [f"floor-{uuid4().hex}" for _ in range(n)]
    # Build every signature before the first send, so building them is not counted in any task's latency. A payload
    # is fresh, incompressible text per link, as a step's new state would be.
    chains = [chain(step.si(task_id, index, steps, fresh_text(payload_bytes), sleep_ms) for index in range(steps))
              for task_id in task_ids]
    created: dict[str, float] = {}
    for task_id, task_chain in zip(task_ids, chains):
        created[task_id] = time.time()
        task_chain.apply_async()
    return created


def wait(created: dict[str, float], timeout: float) -> None:
    """Return once every task in `created` has completed; raise RuntimeError after `timeout` seconds otherwise."""
    pending = list(created)
    deadline = time.monotonic() + timeout
    while True:
        done_times = done_store().hmget(DONE_KEY, pending)
        pending = [task_id for task_id, done_at in zip(pending, done_times) if done_at is None]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{len(pending)} of {len(created)} floor tasks not done after {timeout} s")
        time.sleep(0.02)


def results(created: dict[str, float]) -> dict[str, Any]:
    """What happened to the tasks in `created`.

    completed, lost        tasks with / without a completion in `floor:done`
    created_first          epoch s of the first send; completed_last: of the last completion (None if none)
    latencies_ms           sorted, per completed task: sent -> last step done
    first_step_ms          sorted, per task: sent -> its first step's effect
    effects                effect lines of these tasks; duplicate_effects: lines beyond one per task:index
    """
    task_ids = list(created)
    done_times = dict(zip(task_ids, done_store().hmget(DONE_KEY, task_ids))) if task_ids else {}
    completed_at = {task_id: float(done_at) for task_id, done_at in done_times.items() if done_at is not None}

    effect_lines = 0
    distinct_effects: set[str] = set()
    first_step_at: dict[str, float] = {}
    with open(effects_path()) as effects:
        for line in effects:
            effect, _, at = line.rstrip("\n").rpartition(" ")
            task_id, _, index = effect.rpartition(":")
            if task_id not in created:
                continue
            effect_lines += 1
            distinct_effects.add(effect)
            if index == "0":  # a duplicated first step keeps its earliest run
                first_step_at[task_id] = min(float(at), first_step_at.get(task_id, float("inf")))

    return {
        "completed": len(completed_at),
        "lost": len(created) - len(completed_at),
        "created_first": min(created.values(), default=None),
        "completed_last": max(completed_at.values(), default=None),
        "latencies_ms": sorted((done_at - created[task_id]) * 1000 for task_id, done_at in completed_at.items()),
        "first_step_ms": sorted((at - created[task_id]) * 1000 for task_id, at in first_step_at.items()),
        "effects": effect_lines,
        "duplicate_effects": effect_lines - len(distinct_effects),
    }


def closed_loop(n: int, steps: int, timeout: float = 30) -> dict[str, Any]:
    """Run n tasks one after another, each sent only once the previous one is done; return results() for them."""
    created: dict[str, float] = {}
    for _ in range(n):
        one = create(1, steps)
        created.update(one)
        wait(one, timeout)
    return results(created)


def _start_worker(concurrency: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "celery", "-A", "bench.floor", "worker", "-Q", QUEUE, "-n", "floor1@%h",
        "--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    # Its own session, so stopping it reaches the prefork children too; its output goes to our stderr, keeping
    # stdout for the JSON.
    return subprocess.Popen(command, cwd=ROOT, env=dict(os.environ), stdout=sys.stderr, start_new_session=True)


def _wait_until_consuming(worker: subprocess.Popen, timeout: float = 30) -> None:
    """Block until a client on the broker's db is blocked in BRPOP: a worker that is taking messages."""
    broker = done_store()
    db = broker.connection_pool.connection_kwargs.get("db", 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"floor worker exited with code {worker.returncode} before consuming")
        if any(client.get("cmd") == "brpop" and int(client.get("db", -1)) == int(db)
               for client in broker.client_list()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"floor worker not consuming after {timeout} s")


def _stop_worker(worker: subprocess.Popen) -> None:
    if worker.poll() is not None:
        return
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """results() without its long lists: each becomes its length and median."""
    summary = {}
    for key, value in result.items():
        if isinstance(value, list):
            summary[f"{key}_count"] = len(value)
            summary[f"{key}_p50"] = round(statistics.median(value), 3) if value else None
        else:
            summary[key] = value
    return summary


def _smoke() -> int:
    import json

    worker = _start_worker(concurrency=2)
    try:
        _wait_until_consuming(worker)
        reset()
        created = create(20, 5)
        try:
            wait(created, timeout=60)
        except RuntimeError as error:  # report what did finish; the lost count below fails the run
            print(error, file=sys.stderr)
        open_loop = results(created)
        closed = closed_loop(3, 5)
    finally:
        _stop_worker(worker)
    print(json.dumps({"broker": os.environ["FLOOR_BROKER_URL"], "effects_file": os.environ["FLOOR_EFFECTS"],
                      "open_loop_20x5": _summary(open_loop), "closed_loop_3x5": _summary(closed)}, indent=2))
    return 1 if open_loop["lost"] or closed["lost"] else 0


if __name__ == "__main__":
    if sys.argv[1:] != ["smoke"]:
        sys.exit("usage: python -m bench.floor smoke")
    sys.exit(_smoke())
