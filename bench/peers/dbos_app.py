"""DBOS Transact 3.4, the durable peer in bench/compare.py: run only in its own virtualenv (var/venv-dbos, made by
bench/compare.py from bench/peers/requirements-dbos.txt), never imported by the project.

    worker:  DBOS_URL=… EXECUTOR_ID=w1 CONCURRENCY=4 POLL=0.05 EFFECTS=… READY_FILE=… python dbos_app.py worker
    client:  DBOS_URL=… python dbos_app.py client     (JSON lines on stdin → one JSON line per request on stdout)

The workflow is the peers' program of ../shared/reference/peers.md §4, with the two knobs the comparison needs:
`bench_workflow(steps, payload_bytes, sleep_ms)` runs `steps` DBOS steps, each appending "<workflow>:<step>
<epoch s>" to the effects file (the stand-in external effect the harness counts duplicates in), sleeping `sleep_ms`
first (W3: a kill lands mid-step) and returning `payload_bytes` of fresh random text (W1-big: DBOS records every
step's output in operation_outputs, its checkpoint). One queue, `worker_concurrency` per process, polled every
POLL seconds (0.05, as in the baseline anchors: DBOS's default 1.0 s would put ~0.5 s of dispatch into every
task). Recovery on restart needs the same EXECUTOR_ID and application version, so the harness restarts a killed
worker with its old id.

`agent_workflow(key, turns)` is the agent workload's (WA): each turn a model step and a step per tool call it asked
for, as bench/peers/agent_turn.py makes them (AGENT_MODEL_URL, AGENT_TOOL_URL in the environment).

Client requests: {"op": "enqueue", "n": N, "steps": S, "payload_bytes": B, "sleep_ms": M} → {"ids": [...],
"created": [epoch s, ...]}; {"op": "enqueue_agents", "keys": [...], "turns": T} → the same; {"op": "quit"}.
"""

import base64
import json
import os
import signal
import sys
import time
import uuid

import agent_turn  # bench/peers/agent_turn.py (this file's folder is on the path when run as a script)
from dbos import DBOS, DBOSClient, EnqueueOptions

QUEUE = "bench"
WORKFLOW = "bench_workflow"
AGENT_WORKFLOW = "agent_workflow"
APP_VERSION = "bench-1"


def fresh_text(size: int) -> str:
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size] if size else ""


def worker() -> None:
    effects = os.environ["EFFECTS"]
    DBOS(config={"name": "bench", "system_database_url": os.environ["DBOS_URL"],
                 "application_version": APP_VERSION, "executor_id": os.environ["EXECUTOR_ID"],
                 "log_level": "WARNING"})

    @DBOS.step()
    def bench_step(workflow_id: str, index: int, payload_bytes: int, sleep_ms: int):
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        with open(effects, "a") as out:  # one short append: not interleaved with other processes' lines
            out.write(f"{workflow_id}:{index} {time.time():.6f}\n")
        return fresh_text(payload_bytes) if payload_bytes else index

    @DBOS.workflow(name=WORKFLOW)
    def bench_workflow(steps: int, payload_bytes: int = 0, sleep_ms: int = 0) -> int:
        for index in range(steps):
            bench_step(DBOS.workflow_id, index, payload_bytes, sleep_ms)
        return steps

    @DBOS.step()
    def model_step(messages: list) -> dict:
        return agent_turn.ask(messages)

    @DBOS.step()
    def tool_step(function: str, arguments: str, key: str) -> str:
        return agent_turn.call_tool(function, arguments, key)

    @DBOS.workflow(name=AGENT_WORKFLOW)
    def agent_workflow(key: str, turns: int) -> int:
        """WA: an agent of `turns` turns, each a recorded model step, then a recorded step per tool call it asked for
        (bench/peers/agent_turn.py); each turn appends an effect line, as bench_step does."""
        messages = agent_turn.first_messages(key)
        for turn in range(turns):
            answer = model_step(messages)
            messages.append(answer)
            for number, call in enumerate(answer.get("tool_calls") or [], 1):
                content = tool_step(call["function"]["name"], call["function"]["arguments"],
                                    f"{DBOS.workflow_id}:{turn}:{number}")
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
            with open(effects, "a") as out:
                out.write(f"{DBOS.workflow_id}:{turn} {time.time():.6f}\n")
            if not answer.get("tool_calls"):
                break
        return turns

    DBOS.launch()  # re-enqueues this executor's PENDING workflows (same executor id and version)
    DBOS.register_queue(QUEUE, worker_concurrency=int(os.environ.get("CONCURRENCY", "4")),
                        polling_interval_sec=float(os.environ.get("POLL", "0.05")))
    ready = os.environ.get("READY_FILE")
    if ready:
        with open(ready, "w") as out:
            out.write(f"{time.time():.6f}\n")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    DBOS.destroy()


def client() -> None:
    dbos = DBOSClient(system_database_url=os.environ["DBOS_URL"])
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        ids, created = [], []
        if request["op"] == "enqueue_agents":
            for key in request["keys"]:
                created.append(time.time())
                options = EnqueueOptions(workflow_name=AGENT_WORKFLOW, queue_name=QUEUE,
                                         workflow_id=f"a-{uuid.uuid4().hex}", app_version=APP_VERSION)
                ids.append(dbos.enqueue(options, key, request["turns"]).workflow_id)
            print(json.dumps({"ids": ids, "created": created}), flush=True)
            continue
        for _ in range(request["n"]):
            created.append(time.time())
            options = EnqueueOptions(workflow_name=WORKFLOW, queue_name=QUEUE, workflow_id=f"b-{uuid.uuid4().hex}",
                                     app_version=APP_VERSION)
            ids.append(dbos.enqueue(options, request["steps"], request.get("payload_bytes", 0),
                                    request.get("sleep_ms", 0)).workflow_id)
        print(json.dumps({"ids": ids, "created": created}), flush=True)
    dbos.destroy()


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        worker()
    elif sys.argv[1:] == ["client"]:
        client()
    else:
        sys.exit(__doc__)
