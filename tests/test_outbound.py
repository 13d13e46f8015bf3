"""The one outbound connector (agents_app.outbound), tested with the attacker's tools (issue 37, findings 2, 3, 7 and
the CIMD address form of 9): an /etc/hosts entry flipped between an allowed and a refused address while real workers
list and call tools; a model endpoint answering 307 towards a refused service; a tool answer far past its cap; the
tool list read from the admin's "Call a tool" page, tool_spec and tools_refresh at a refused address; the page's
texts for closed, filtered and open ports; IPv6 forms of a loopback address as a Client ID Metadata Document URL.

The refused address is a listener of the test's on 127.0.0.2: loopback has the whole 127/8, and the deployment's
tools.allowed_hosts lists 127.0.0.1 (and ::1, localhost) only — so the allowed server and the refused one are both
local, on the same port, told apart only by the address a name resolves to. The listener counts every connection,
whatever it carries: the guarantee is 0 of any kind.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import socketserver
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import CommandError, call_command

from agents_app.gateway.catalogue import server_get, tool_spec, tools_offered, tools_refresh
from agents_app.gateway.errors import ToolError
from agents_app.models import TenantModel, ToolServer
from tasks_app.models import TERMINAL_STATUSES, Task
from tasks_app.services import task_create
from tests.engine_support import configure, create_engine_task, drive
from tests.tool_server_support import SCRIPT, running_tool_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

REFUSED_HOST = "127.0.0.2"
REFUSED_BODY = "refused-service-body-7f3a9c"  # what the refused service answers: must never reach a tenant


# -- the attacker's listeners ------------------------------------------------------------------------------------------
class Listener:
    """A TCP listener on ``host`` that records every connection (the bytes of its request head) and answers any HTTP
    request with ``status`` and REFUSED_BODY: the service the policy refuses."""

    def __init__(self, host: str = REFUSED_HOST, port: int = 0, *, status: int = 500):
        seen = self.connections = []
        body = REFUSED_BODY.encode()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                seen.append(b"")
                self.request.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = self.request.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    seen[-1] = data
                    self.request.sendall(b"HTTP/1.1 %d Oops\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                                         b"Connection: close\r\n\r\n%s" % (status, len(body), body))

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def refused_listener():
    listener = Listener()
    yield listener
    listener.close()


class HostsEntry:
    """A line of /etc/hosts for a unique name, its address rewritten in place (one pwrite of the same length: a
    reader never sees the line half written); removed at the end. The tests run as root in their container."""

    def __init__(self, address: str):
        self.name = f"flip-{uuid.uuid4().hex[:10]}.attacker.test"
        line = f"{address} {self.name}\n"
        with open("/etc/hosts", "a") as hosts:
            hosts.write(line)
        self.offset = os.path.getsize("/etc/hosts") - len(line)
        self.flips = 0

    def point_at(self, address: str) -> None:
        fd = os.open("/etc/hosts", os.O_WRONLY)
        try:
            os.pwrite(fd, address.encode(), self.offset)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def flipping(self, first: str, second: str, every: float = 0.015):
        """Point the name at ``first`` and ``second`` in turn every ``every`` seconds, until the block ends (then at
        ``first``)."""
        stop = threading.Event()

        def flip():
            while not stop.wait(every):
                self.flips += 1
                self.point_at(second if self.flips % 2 else first)

        thread = threading.Thread(target=flip, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.point_at(first)

    def remove(self) -> None:
        with open("/etc/hosts") as hosts:
            kept = [line for line in hosts if self.name not in line]
        with open("/etc/hosts", "w") as hosts:
            hosts.writelines(kept)


@pytest.fixture
def hosts_entry():
    if not os.access("/etc/hosts", os.W_OK):
        pytest.skip("/etc/hosts is not writable here: the flip needs the system resolver's own file")
    made = []

    def make(address: str) -> HostsEntry:
        made.append(HostsEntry(address))
        return made[-1]

    yield make
    for entry in made:
        entry.remove()


def resolves_to(name: str, address: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)[0][4][0] != address:
        assert time.monotonic() < deadline, f"{name} does not resolve to {address}"
        time.sleep(0.01)


ANY_HOST = f"""
import runpy, sys
sys.path.insert(0, {str(SCRIPT.parent.parent)!r})
from mcp.server import transport_security
# The example server, bound to loopback, takes only loopback Host headers (the SDK's DNS-rebinding guard: 421);
# here its clients name it by the flipping name.
transport_security.TransportSecurityMiddleware._validate_host = lambda self, host: bool(host)
sys.argv[0] = {str(SCRIPT)!r}
runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
"""


def any_host_script(directory):
    path = directory / "tool_server_any_host.py"
    path.write_text(ANY_HOST)
    return path


# -- 1. the /etc/hosts flip while real workers list and call tools (finding 2) ----------------------------------------
@pytest.mark.slow
def test_it_sends_nothing_to_a_refused_address_while_a_name_flips_under_sixty_tasks_on_real_workers(
        tenant, workers, tmp_path, refused_listener, hosts_entry):
    """60 mcp_tool tasks, each against a server row of its own (so each reads the tool list: discovery and
    tools/list, then the call), every row's URL the same flipping name: allowed (127.0.0.1, the example tool server)
    and refused (127.0.0.2, the listener, same port) in turn every 15 ms. Whatever each task ends as, the refused
    address receives nothing: every connection resolves once, is checked, and dials the address checked."""
    entry = hosts_entry("127.0.0.1")
    with running_tool_server(tmp_path, port=refused_listener.port, script=any_host_script(tmp_path)) as server:
        resolves_to(entry.name, "127.0.0.1")
        rows = [ToolServer.objects.create(tenant=tenant, name=f"flip{n}", timeout_seconds=5,
                                          url=f"http://{entry.name}:{refused_listener.port}/mcp") for n in range(60)]
        pool = [workers(f"flip-worker-{n}", concurrency=2) for n in range(2)]
        with entry.flipping("127.0.0.1", REFUSED_HOST):
            tasks = [create_engine_task(tenant, "mcp_tool", server=row.name, tool="lookup", arguments={"key": "k"})
                     for row in rows]
            deadline = time.monotonic() + 120
            while Task.objects.filter(id__in=[t.id for t in tasks]).exclude(status__in=TERMINAL_STATUSES).exists():
                assert time.monotonic() < deadline, "the 60 tasks did not end within 120 s"
                time.sleep(0.1)
        for worker in pool:
            worker.stop()
        ended = list(Task.objects.filter(id__in=[t.id for t in tasks]).values_list("status", "error"))
        lookups = server.calls(tool="lookup", event="received")

    assert refused_listener.connections == [], refused_listener.connections[:3]  # 0 requests of any kind
    assert entry.flips > 100  # (the name did flip, all along)
    completed = [status for status, _ in ended if status == "completed"]
    assert completed and len(lookups) >= len(completed)  # the allowed server served the tasks that completed
    for status, error in ended:  # the others were refused before anything was sent, saying so
        assert status == "completed" or error["reason"] in ("tool_denied", "tool_unavailable"), error


# -- 2. the model endpoint's 307 (finding 3) --------------------------------------------------------------------------
class Redirecting(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint on an allowed address that answers every request 307 to ``Redirecting.to``."""

    to = ""
    seen: list[str] = []

    def do_POST(self):
        Redirecting.seen.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(307)
        self.send_header("Location", Redirecting.to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_it_follows_no_redirect_of_a_tenants_model_endpoint_and_relays_no_body(tenant, settings, refused_listener,
                                                                                 monkeypatch):
    for name in ("MODEL_BASE_URL", "MODEL_NAME", "MODEL_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    configure(settings, model={"base_url": None, "name": None, "max_retries": 0, "unavailable_wait_seconds": 0})
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    Redirecting.to = f"http://{REFUSED_HOST}:{refused_listener.port}/v1/chat/completions"
    Redirecting.seen = []
    try:
        TenantModel.objects.create(tenant=tenant, base_url=f"http://127.0.0.1:{endpoint.server_address[1]}/v1",
                                   name="their-model")
        task = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": "hi", "servers": []}).task
        drive(task.id, calls=5, until_done=False)
    finally:
        endpoint.shutdown()
        endpoint.server_close()

    task.refresh_from_db()
    told = f"{task.status_message} {task.error}"
    assert Redirecting.seen  # the allowed endpoint was asked …
    assert refused_listener.connections == []  # … and its redirect never followed
    assert REFUSED_BODY not in told
    assert task.status == "failed" and "307" in told and "redirect" in told, told


# -- 3. a tool answer far past its cap (finding 7) --------------------------------------------------------------------
class BigAnswers(BaseHTTPRequestHandler):
    """Just enough of a 2025-11-25 MCP server (initialize, tools/list) whose one tool answers with a JSON body of
    ANSWER_BYTES, streamed in 64 KiB pieces with no length, counting what it managed to send before the reader went;
    and a model endpoint whose streamed reply is as long."""

    protocol_version = "HTTP/1.1"
    ANSWER_BYTES = 50 * 1024 * 1024
    sent: list[int] = []

    def _json(self, payload: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self._json(b"", 405)

    def do_DELETE(self):
        self._json(b"", 405)

    def do_POST(self):
        import json

        if self.path.endswith("/chat/completions"):  # a model endpoint whose one streamed reply never ends
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return self._stream(b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "', tail=b'"}}]}\n\n',
                                content_type="text/event-stream")
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "big", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "dump", "inputSchema": {"type": "object"},
                                 "annotations": {"readOnlyHint": True}}]}
        elif method == "tools/call":
            head = b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"' % json.dumps(ident).encode()
            return self._stream(head, tail=b'"}]}}')
        else:
            return self._json(json.dumps({"jsonrpc": "2.0", "id": ident,
                                          "error": {"code": -32601, "message": "no"}}).encode())
        self._json(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode())

    def _stream(self, head: bytes, tail: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.end_headers()
        sent, piece = 0, b"x" * 65536
        try:
            self.wfile.write(head)
            while sent < self.ANSWER_BYTES:
                self.wfile.write(piece)
                sent += len(piece)
            self.wfile.write(tail)
        except OSError:
            pass
        finally:
            BigAnswers.sent.append(sent)
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def big_server():
    BigAnswers.sent = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), BigAnswers)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _cap(settings, **caps) -> None:
    try:
        configure(settings, **caps)
    except TypeError:
        pass  # (before the connector these keys did not exist: the test then shows the answer read whole)


def test_it_cuts_a_tool_answer_at_its_cap_and_fails_the_call_saying_so(tenant, settings, big_server):
    cap = 1024 * 1024
    _cap(settings, tools={"max_answer_bytes": cap}, model={"max_answer_bytes": cap})
    configure(settings, step_retry={"backoff_seconds": 0, "backoff_max_seconds": 0})
    ToolServer.objects.create(tenant=tenant, name="big", protocol="legacy", timeout_seconds=20,
                              url=f"http://127.0.0.1:{big_server.server_address[1]}/mcp")
    task = create_engine_task(tenant, "mcp_tool", server="big", tool="dump", arguments={})

    drive(task.id, calls=10, until_done=False)

    task.refresh_from_db()
    assert task.status == "failed", (task.status, task.status_message)
    assert "tools.max_answer_bytes" in task.error["message"] and "cut off" in task.error["message"]
    # Each try's answer was cut near the cap: what the server got out before its reader went is the cap plus what
    # the sockets buffer on the way, far from the 50 MiB it had to say.
    assert BigAnswers.sent and max(BigAnswers.sent) < 12 * 1024 * 1024, BigAnswers.sent

    # The model's kind the same, through the openai SDK (the connector's synchronous client)
    from agents_app import llm

    BigAnswers.sent = []
    endpoint = llm.Endpoint(base_url=f"http://127.0.0.1:{big_server.server_address[1]}/v1", model="m",
                            credential=None, context_window=8192, timeout_seconds=20, max_retries=0, prices=None)
    with pytest.raises(llm.ModelError, match="model.max_answer_bytes"):
        llm.chat(endpoint, messages=[{"role": "user", "content": "hi"}])
    deadline = time.monotonic() + 5
    while not BigAnswers.sent and time.monotonic() < deadline:
        time.sleep(0.02)
    assert BigAnswers.sent and BigAnswers.sent[0] < 12 * 1024 * 1024, BigAnswers.sent


# -- 4. the tool list at a refused address; the "Call a tool" page's texts; CIMD forms (findings 2 and 9) -------------
def test_it_reads_no_tool_list_at_a_refused_address_from_tools_refresh_tool_spec_or_the_call_page(
        tenant, admin_client, refused_listener, hosts_entry, step_context):
    entry = hosts_entry(REFUSED_HOST)
    resolves_to(entry.name, REFUSED_HOST)
    by_address = ToolServer.objects.create(tenant=tenant, name="direct", timeout_seconds=5,
                                           url=f"http://{REFUSED_HOST}:{refused_listener.port}/mcp")
    by_name = ToolServer.objects.create(tenant=tenant, name="named", timeout_seconds=5,
                                        url=f"http://{entry.name}:{refused_listener.port}/mcp",
                                        tools=[{"name": "lookup", "inputSchema": {"type": "object"}}])

    with pytest.raises(ToolError):
        tools_refresh(by_address)
    with pytest.raises(ToolError):  # (a stale list: read again, by name)
        tool_spec(server_get(tenant_id=tenant.id, name="named"), "lookup")
    page = admin_client.get(f"/admin/agents_app/toolserver/{by_name.pk}/call/")
    with pytest.raises(CommandError, match="refused"):  # (manage.py tool_servers check)
        call_command("tool_servers", "check", "direct", "--tenant", tenant.slug)
    offered = tools_offered(step_context(), None)  # the agent's offer: a refused host offers nothing

    assert refused_listener.connections == []
    assert page.status_code == 200 and offered == []  # (not even the list the row kept)
    by_address.refresh_from_db()
    assert by_address.tools is None  # nothing stored


def _warning(page) -> str:
    text = page.content.decode()
    found = re.search(r'<li class="warning">(.*?)</li>', text, re.S)
    assert found, text[:3000]
    return found.group(1).strip()


def test_it_tells_closed_filtered_and_open_ports_apart_on_no_page(tenant, admin_client):
    """The "Call a tool" page as a port scanner: a closed port, a filtered one (its accept queue full: the SYN is
    dropped) and one open to something that is not MCP read the same on the page."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
    filtered = socket.socket()
    filtered.bind(("127.0.0.1", 0))
    filtered.listen(0)
    queue = [socket.create_connection(filtered.getsockname(), timeout=1)]
    with contextlib.suppress(OSError):
        for _ in range(3):
            queue.append(socket.create_connection(filtered.getsockname(), timeout=0.5))
    open_ = Listener("127.0.0.1", status=404)
    try:
        said = {}
        for state, port in (("closed", closed.getsockname()[1]), ("filtered", filtered.getsockname()[1]),
                            ("open", open_.port)):
            row = ToolServer.objects.create(tenant=tenant, name=f"port-{state}", timeout_seconds=1,
                                            url=f"http://127.0.0.1:{port}/mcp")
            said[state] = _warning(admin_client.get(f"/admin/agents_app/toolserver/{row.pk}/call/")) \
                .replace(row.name, "NAME")
    finally:
        open_.close()
        for sock in (closed, filtered, *queue):
            sock.close()

    assert said["closed"] == said["filtered"] == said["open"], said
    assert "could not be reached" in said["closed"]


@pytest.mark.parametrize("client_id", [
    "https://[::127.0.0.1]:8443/client.json",  # IPv4-compatible: what the attacker sent
    "https://[::ffff:127.0.0.1]:8443/client.json",  # IPv4-mapped
    "https://[::ffff:0:7f00:1]:8443/client.json",  # IPv4-translated (SIIT)
    "https://[2002:7f00:1::1]:8443/client.json",  # 6to4 of 127.0.0.1
    "https://[64:ff9b::a9fe:a9fe]/client.json",  # NAT64 of 169.254.169.254 (cloud metadata)
    "https://[::1]/client.json",
    "https://127.0.0.1/client.json",
])
def test_it_refuses_a_client_id_metadata_document_at_any_form_of_a_refused_address(client_id):
    from oauth2_provider.cimd import CIMDError

    from mcp_bridge.oauth.cimd import MetadataFetcher

    with pytest.raises(CIMDError, match="public"):
        MetadataFetcher().fetch(client_id)

