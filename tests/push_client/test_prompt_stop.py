"""A stopping client does not wait for what is never data: a probe, or an owners' map, still
waiting for a gateway that hangs is left to its thread, and what it finds later is dropped."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from push_client.installations import InstallationSet, InstallationSpec
from push_client.token import BearerToken
from push_client.transport import GatewayClient, TransportStats
from tests.push_client.conftest import (
    Delivered,
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up on an answer is what these tests make: not an error."""


class _HungGateway:
    """Takes connections and reads requests; answers the paths in ``hang`` only once
    ``release`` is set (never, unless a test sets it), the others at once: ``/readyz``
    with 200, writes with ``write_status``.  Notes when each hung request arrived."""

    def __init__(self, hang: tuple[str, ...] = ("/readyz", "/v1/")) -> None:
        self.release = threading.Event()
        self.arrived: list[tuple[float, str]] = []
        self.write_status = 503
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Silent: the test's output is its assertions."""

            def _answer(self, status: int) -> None:
                if self.path.startswith(hang):
                    gateway.arrived.append((time.monotonic(), self.path))
                    gateway.release.wait(30)
                body = b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(200)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._answer(gateway.write_status)

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def probes(self) -> int:
        return sum(1 for _, path in self.arrived if path == "/readyz")

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hung() -> Iterator[_HungGateway]:
    gateway = _HungGateway()
    yield gateway
    gateway.close()


def _wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_closing_installations_with_a_probe_in_flight_takes_under_a_second_and_drops_its_finding(
    hung: _HungGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """``close`` joined the prober for ``2 * probe_timeout_s + 1`` (5 s by default): a
    ``logbroker push`` stopping while an installation that hangs was probed overran its
    shutdown time by that much.  Now it waits at most 0.5 s, and the probe's late answer
    changes nothing and says nothing."""
    installations = InstallationSet(
        [InstallationSpec("dc1", (hung.url,)), InstallationSpec("dc2", ("http://127.0.0.1:9",))],
        probe_interval_s=0.05,
        probe_timeout_s=5.0,
        wake=lambda: None,
    )
    dc1 = installations.members[0]
    installations.mark_down(dc1, f"{hung.url}: ReadTimeout: timed out")
    _wait_for(lambda: hung.probes() >= 1, "a probe of dc1")
    prober = installations._prober
    assert prober is not None
    version = installations.version
    caplog.set_level(logging.INFO, logger="logbroker.push")
    caplog.clear()
    started = time.monotonic()
    installations.close()
    took = time.monotonic() - started
    assert took < 1.0, f"close took {took:.2f} s with a probe in flight"
    # The installation answers now: the probe, left to itself, gets its 200 ...
    hung.release.set()
    prober.join(10)
    assert not prober.is_alive()
    # ... and it is dropped: dc1 stays down, nothing is logged about it.
    assert not dc1.up and installations.version == version
    assert installations.current().name == "dc2"
    assert "up again" not in caplog.text, caplog.text


def test_closing_a_gateway_client_with_a_probe_in_flight_takes_under_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same for the prober of an installation's gateways (it waited up to 5 s)."""
    failing = _HungGateway(hang=("/readyz",))  # writes: 503 at once; probes: no answer
    other = _HungGateway(hang=())
    other.write_status = 200
    stop = threading.Event()
    client = GatewayClient(
        (failing.url, other.url),
        token=BearerToken(None, None),
        stop=stop,
        stats=TransportStats(),
        probe_interval_s=0.05,
    )
    try:
        client.post("/v1/write", b"x", "application/octet-stream")
        assert client.current_server == other.url
        _wait_for(lambda: failing.probes() >= 1, "a probe of the failing gateway")
        prober = client._prober
        assert prober is not None
        caplog.set_level(logging.INFO, logger="logbroker.push")
        caplog.clear()
        started = time.monotonic()
        client.close()
        took = time.monotonic() - started
        assert took < 1.0, f"close took {took:.2f} s with a probe in flight"
        failing.release.set()  # the gateway answers the probe now: too late to count
        prober.join(10)
        assert not prober.is_alive()
        assert [row["server"] for row in client.failing()] == [failing.url]
        assert "answers again" not in caplog.text, caplog.text
    finally:
        stop.set()
        failing.close()
        other.close()


@pytest.mark.slow
def test_push_stopping_while_a_hung_installation_is_probed_exits_within_a_second(
    tmp_path: Path, hung: _HungGateway, start_gateway, start_push
) -> None:
    """``logbroker push`` with dc1 behind a gateway that takes connections and never
    answers: once dc1 is down and probed, SIGTERM during a probe exits within 0.5 s of
    waiting for it plus the process's own stop (about 1 s in all, measured); the probes of the
    installation and of its gateway each held the stop up to their 2 s timeout (2.3 s).  The
    bound here leaves room for a loaded machine: the tests of ``close`` above are the ones
    that tell the old wait from the new."""
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("p")
    writer.append(path, 100)
    state = tmp_path / "state"
    flags = ["--request-timeout", "1", "--failover-after", "0.5", "--position-wait", "0.5"]
    push = start_push(
        f"dc1={hung.url}",
        state,
        path,
        extra=["--server", f"dc2={dc2.url}", *flags, "--probe-interval", "0.2"],
    ).wait_started(state)

    def in_dc2() -> Delivered:
        return read_delivered(dc2.data_dir, "app", "dc2")

    _wait_for(lambda: in_dc2().count() == 100, "the file in dc2", 30)
    assert "installation dc1 is down" in push.log()
    seen = hung.probes()
    _wait_for(lambda: hung.probes() > seen, "a probe of dc1 once it is down")
    started = time.monotonic()
    assert push.proc is not None
    push.proc.send_signal(signal.SIGTERM)
    assert push.wait(30) == 0, push.log()
    took = time.monotonic() - started
    assert took < 4.0, f"the client took {took:.2f} s to stop: {push.log()}"
    assert "up again" not in push.log()
    assert_exactly_once(in_dc2(), writer)


class _OwnersHangProxy:
    """Forwards every request to ``target`` except ``GET /v1/owners``, which never ends."""

    def __init__(self, target: str) -> None:
        self.owner_asks = 0
        self.release = threading.Event()
        proxy = self
        http = httpx.Client(timeout=30)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                """Silent."""

            def _forward(self, method: str) -> None:
                if self.path.startswith("/v1/owners"):
                    proxy.owner_asks += 1
                    proxy.release.wait(60)
                    return
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                answer = http.request(method, target + self.path, content=body, headers=headers)
                self.send_response(answer.status_code)
                for name in ("Content-Type", "Retry-After", "Logbroker-Forwarded"):
                    if name in answer.headers:
                        self.send_header(name, answer.headers[name])
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._http = http
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._http.close()


@pytest.mark.slow
def test_push_stopping_while_an_owners_map_is_asked_of_a_hung_gateway_exits_at_once(
    tmp_path: Path, gateway, start_push
) -> None:
    """With ``direct_to_owner``, the owners' map is asked for from a thread pool of its own
    (``push-owners``, a 10 s timeout).  Python's exit joins a pool's threads, so a client
    stopped while the gateway hung on that question exited only when it timed out; it is
    a request abandoned like a write, and the client exits at once."""
    proxy = _OwnersHangProxy(gateway.url)
    try:
        path = tmp_path / "app.log"
        writer = LineWriter("o")
        writer.append(path, 100)
        state = tmp_path / "state"
        flags = ["--direct-to-owner", "http://127.0.0.1:*", "--owner-refresh", "0.3"]
        push = start_push(proxy.url, state, path, extra=flags).wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 100, timeout_s=30)
        _wait_for(lambda: proxy.owner_asks >= 1, "the client to ask for the owners", 30)
        started = time.monotonic()
        assert push.proc is not None
        push.proc.send_signal(signal.SIGTERM)
        assert push.wait(30) == 0, push.log()
        took = time.monotonic() - started
        assert took < 3.0, f"the client took {took:.2f} s to stop: {push.log()}"
    finally:
        proxy.close()
    assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 100), writer)
