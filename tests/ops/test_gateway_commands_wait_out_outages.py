"""``logbroker schemas``, ``topics --server`` and ``audit --windows --server`` wait out gateways
that answer 503 (``Retry-After``) or cannot be reached, for ``--gateway-retry`` seconds, then
exit 4 in one line; a 4xx is never asked again, and a request whose answer was lost is asked
again without doing twice what it does (a schema registered once)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess, free_port, logbroker_cmd
from tests.schemas.conftest import ORDER_V1
from tests.scripted_http import LoopbackServer, running

_UNAVAILABLE = json.dumps(
    {"error": "partition_unavailable", "reason": "partition 0 of the registry has no owner"}
).encode()
_BAD = json.dumps({"error": "bad_request", "reason": "scripted refusal"}).encode()


class _Front(LoopbackServer):
    """A stand-in before a real gateway: the n-th request is answered as ``script[n]`` says
    (``503``: 503 ``partition_unavailable`` with ``Retry-After: 1``; ``400``; ``lost``:
    forwarded to the gateway, then the connection closed with no answer), and ``then`` (the
    same words, or ``forward``) once the script is done."""

    def __init__(self, upstream: str, script: list[str], then: str = "forward") -> None:
        self.upstream = httpx.Client(base_url=upstream, timeout=60)
        self.script = list(script)
        self.then = then
        self.seen: list[str] = []
        self.lock = threading.Lock()
        super().__init__(_FrontHandler)


class _FrontHandler(BaseHTTPRequestHandler):
    server: _Front
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.seen.append(f"{self.command} {self.path}")
            action = self.server.script.pop(0) if self.server.script else self.server.then
        if action == "503":
            self._answer(503, _UNAVAILABLE, {"Retry-After": "1"})
            return
        if action == "400":
            self._answer(400, _BAD, {})
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host",)}
        answer = self.server.upstream.request(
            self.command, self.path, content=body, headers=headers
        )
        if action == "lost":
            self.close_connection = True  # done on the gateway; its answer never arrives
            return
        self._answer(answer.status_code, answer.content, {})

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, *args: object) -> None:
        """Quiet: the tests read what the command says."""


@pytest.fixture
def front(gateway: GatewayProcess) -> Iterator[Callable[..., _Front]]:
    """Factory: ``front(script, then="forward")``, a :class:`_Front` before ``gateway``,
    answering until the test ends."""
    with contextlib.ExitStack() as stack:

        def _make(script: list[str], then: str = "forward") -> _Front:
            made = stack.enter_context(running(_Front(gateway.url, script, then)))
            stack.callback(made.upstream.close)
            return made

        yield _make


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(logbroker_cmd(*args), capture_output=True, text=True, timeout=120)


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "orders.avsc"
    path.write_text(json.dumps(ORDER_V1))
    return path


def _versions(gateway: GatewayProcess) -> list[int]:
    doc = httpx.get(f"{gateway.url}/v1/schemas/orders", timeout=30).json()
    return [v["version"] for v in doc["versions"]]


def test_a_register_answered_503_twice_waits_and_registers(
    gateway: GatewayProcess, front: Callable[..., _Front], schema_file: Path
) -> None:
    gw = front(["503", "503"])
    done = _run("schemas", "register", "--server", gw.url, "orders", str(schema_file))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("orders: registered as version 1, id ")
    assert gw.seen == ["POST /v1/schemas/orders/versions"] * 3
    waiting = [line for line in done.stderr.splitlines() if "waiting for a gateway" in line]
    assert len(waiting) == 1 and "503 partition_unavailable" in waiting[0], done.stderr
    assert _versions(gateway) == [1]


def test_a_register_whose_answer_was_lost_is_asked_again_and_registers_one_version(
    gateway: GatewayProcess, front: Callable[..., _Front], schema_file: Path
) -> None:
    gw = front(["lost"])
    done = _run("schemas", "register", "--server", gw.url, "orders", str(schema_file))
    assert done.returncode == 0, done.stderr
    assert gw.seen == ["POST /v1/schemas/orders/versions"] * 2
    assert "already registered (perhaps by this command" in done.stdout
    assert "as version 1" in done.stdout
    assert _versions(gateway) == [1]


def test_gateways_that_stay_unavailable_exit_4_in_one_line_once_the_bound_passed(
    gateway: GatewayProcess, front: Callable[..., _Front], schema_file: Path
) -> None:
    gw = front([], then="503")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    started = time.monotonic()
    done = _run(
        "schemas", "register", "--server", f"{dead},{gw.url}", "--gateway-retry", "3",
        "orders", str(schema_file),
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 4, done.stderr
    assert 3 <= took < 30, took  # the bound, plus a slow machine's start of the command
    last = done.stderr.splitlines()[-1]
    assert last.startswith("logbroker schemas: no gateway answered POST /v1/schemas/orders/")
    assert "within 3 s (--gateway-retry)" in last and "unreachable" in last and "503" in last
    assert len(done.stderr.splitlines()) == 2, done.stderr  # said once that it waits, once why
    assert len(gw.seen) >= 2  # asked again, honouring Retry-After: 1 (not a busy loop)
    assert len(gw.seen) <= 5, gw.seen
    assert _versions_or_none(gateway) is None


def _versions_or_none(gateway: GatewayProcess) -> list[int] | None:
    answer = httpx.get(f"{gateway.url}/v1/schemas/orders", timeout=30)
    return None if answer.status_code == 404 else [v["version"] for v in answer.json()["versions"]]


def test_a_4xx_after_a_503_is_not_asked_again(
    gateway: GatewayProcess, front: Callable[..., _Front], schema_file: Path
) -> None:
    gw = front(["503", "400"])
    done = _run("schemas", "register", "--server", gw.url, "orders", str(schema_file))
    assert done.returncode == 2, done.stderr
    assert "scripted refusal" in done.stderr
    assert len(gw.seen) == 2


def test_the_next_gateway_of_server_answers_when_the_first_is_down(
    gateway: GatewayProcess, schema_file: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    done = _run("schemas", "register", "--server", f"{dead},{gateway.url}", "orders",
                str(schema_file))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _versions(gateway) == [1]


def test_topics_create_and_describe_wait_out_503(
    gateway: GatewayProcess, front: Callable[..., _Front]
) -> None:
    gw = front(["503", "503"])
    created = _run("topics", "create", "dc1.waited", "--server", gw.url, "--partitions", "2")
    assert created.returncode == 0, created.stderr
    assert "dc1.waited  id=" in created.stdout and "partitions=2" in created.stdout
    gw.script = ["503"]
    described = _run("topics", "describe", "dc1.waited", "--server", gw.url)
    assert described.returncode == 0, described.stderr
    assert "partitions=2" in described.stdout
    assert len(gw.seen) == 5


def test_a_topic_create_whose_answer_was_lost_says_the_lost_attempt_may_have_made_it(
    gateway: GatewayProcess, front: Callable[..., _Front]
) -> None:
    gw = front(["lost"])
    done = _run("topics", "create", "dc1.once", "--server", gw.url)
    assert done.returncode == 2, done.stderr
    assert "409 topic_exists" in done.stderr
    assert "an earlier attempt of this command, whose answer was lost, may have created it" in (
        done.stderr
    )
    names = [t["name"] for t in httpx.get(f"{gateway.url}/v1/topics", timeout=30).json()["topics"]]
    assert names.count("dc1.once") == 1


def test_audit_windows_through_gateways_that_stay_unavailable_exits_4(
    gateway: GatewayProcess, front: Callable[..., _Front], tmp_path: Path
) -> None:
    gw = front([], then="503")
    done = _run(
        "audit", "--windows", "--server", gw.url, "--gateway-retry", "2",
        "--db", str(tmp_path / "audit.db"),
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "no gateway answered GET /v1/audit/windows within 2 s" in done.stderr
    assert len(gw.seen) >= 2


def test_topics_through_gateways_of_two_installations_is_refused_at_its_start(
    gateway: GatewayProcess,
    front: Callable[..., _Front],
    start_gateway: Callable[..., GatewayProcess],
    tmp_path: Path,
) -> None:
    """``--server A,B`` names gateways of one installation: a B of another is refused at the
    command's start, with A healthy (before, nothing was noticed until A failed)."""
    gw = front([])
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    done = _run("topics", "create", "dc1.mixed", "--server", f"{gw.url},{other.url}")
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"logbroker topics: {other.url} belongs to installation "), last
    assert f"{gw.url} to " in last and "one installation" in last, last
    assert gw.seen == ["GET /healthz"]  # asked nothing else
    for url in (gateway.url, other.url):
        listed = httpx.get(f"{url}/v1/topics", timeout=30).json()["topics"]
        assert "dc1.mixed" not in [t["name"] for t in listed]


@pytest.mark.parametrize("command", ["schemas", "audit"])
def test_schemas_and_audit_windows_through_gateways_of_two_installations_are_refused_at_once(
    gateway: GatewayProcess,
    front: Callable[..., _Front],
    start_gateway: Callable[..., GatewayProcess],
    tmp_path: Path,
    command: str,
) -> None:
    """The start's check is the gateway client's: every command through it has it."""
    gw = front([])
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    servers = f"{gw.url},{other.url}"
    if command == "schemas":
        done = _run("schemas", "list", "--server", servers)
    else:
        done = _run("audit", "--windows", "--server", servers, "--db", str(tmp_path / "a.db"))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"logbroker {command}: {other.url} belongs to installation "), last
    assert gw.seen == ["GET /healthz"]


def test_topics_through_another_installation_down_at_the_start_is_refused_before_it_acts(
    gateway: GatewayProcess,
    front: Callable[..., _Front],
    start_gateway: Callable[..., GatewayProcess],
    tmp_path: Path,
) -> None:
    """A B that did not answer at the start is checked when first reached: a create that A
    answers 503 is not carried out by B if B serves another log."""
    gw = front(["forward", "503"])  # A's /healthz answered, the create answered 503
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    with running(_Front(other.url, ["503"])) as late:  # B's /healthz at the start: 503
        done = _run("topics", "create", "dc1.mixed", "--server", f"{gw.url},{late.url}")
        late.upstream.close()
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"logbroker topics: {late.url} belongs to installation "), last
    assert f"{gw.url} to " in last and "one installation" in last, last
    assert gw.seen == ["GET /healthz", "POST /v1/topics"]
    assert late.seen == ["GET /healthz", "GET /healthz"]
    for url in (gateway.url, other.url):
        listed = httpx.get(f"{url}/v1/topics", timeout=30).json()["topics"]
        assert "dc1.mixed" not in [t["name"] for t in listed]
