"""A gateway that takes requests and never answers (frozen with SIGSTOP, or waiting for its
Kafka) is left after ``stall_after_s``, not after ``request_timeout_s`` (60 s): its requests
go to the next gateway of the installation, or, when every gateway of it hangs for
``failover_after_s``, to the next installation; each line still lands once."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from push_client.token import BearerToken
from push_client.transport import GatewayClient, InstallationUnavailable, TransportStats
from push_client.wire import SourceMeta, WireChunk, encode_write_body
from tests.push_client.conftest import (
    BackgroundWriter,
    LineWriter,
    assert_exactly_once,
    assert_exactly_once_across,
    read_delivered,
    wait_for_lines,
)

STALL_S = 2.0
HUNG_FLAGS = [
    "--stall-after",
    f"{STALL_S:g}",
    "--probe-interval",
    "0.3",
    "--probe-max-interval",
    "1",
]


def _freeze(gateway) -> None:  # type: ignore[no-untyped-def]
    os.killpg(gateway.proc.pid, signal.SIGSTOP)


def _thaw(gateway) -> None:  # type: ignore[no-untyped-def]
    os.killpg(gateway.proc.pid, signal.SIGCONT)


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Seconds until ``predicate`` held; fails after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class _SlowGateway:
    """Answers every POST with ``{"who": NAME}`` after ``delay_s`` (None: never)."""

    def __init__(self, name: str, delay_s: float | None) -> None:
        self.release = threading.Event()
        self.posts = 0
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                """/readyz and /healthz: it is up (it answers its POSTs late, or never)."""
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                gateway.posts += 1
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if delay_s is None:
                    gateway.release.wait(30)
                    return
                time.sleep(delay_s)
                body = f'{{"who":"{name}"}}'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                """Quiet: the test checks the lines shipped, not the request lines."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class _HungGateway:
    """Accepts every connection and never answers a byte: a gateway that hangs."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._held.append(conn)

    def close(self) -> None:
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def hung_gateways() -> Iterator[Callable[[int], list[str]]]:
    made: list[_HungGateway] = []

    def make(count: int) -> list[str]:
        made.extend(_HungGateway() for _ in range(count))
        return [hung.url for hung in made[-count:]]

    yield make
    for hung in made:
        hung.close()


def _one_line_write(line: bytes) -> bytes:
    meta = SourceMeta("app", "hung-test", "h", "/var/log/app.log", "raw")
    return encode_write_body([(meta.encoded(), [WireChunk(len(line), 0, line)])])


@pytest.fixture
def client_of() -> Iterator[Callable[..., GatewayClient]]:
    made: list[GatewayClient] = []
    stop = threading.Event()

    def make(*servers: str, **options: float) -> GatewayClient:
        client = GatewayClient(
            servers, token=BearerToken(None, None), stop=stop, stats=TransportStats(), **options
        )
        made.append(client)
        return client

    yield make
    stop.set()
    for client in made:
        client.close()


def test_a_request_hung_at_one_gateway_is_answered_by_the_next_after_stall_after_s(
    client_of: Callable[..., GatewayClient],
) -> None:
    hung, healthy = _SlowGateway("hung", None), _SlowGateway("healthy", 0.0)
    try:
        client = client_of(hung.url, healthy.url, stall_after_s=1.0)
        started = time.monotonic()
        answer = client.post("/v1/write", b"x", "application/octet-stream", flush=True)
        took = time.monotonic() - started
        assert answer == {"who": "healthy"}
        assert 1.0 <= took < 2.5, took
        assert client.current_server == healthy.url  # the next requests go there first
        assert [row["error"] for row in client.failing()] == ["Stalled"]
    finally:
        hung.close()
        healthy.close()


def test_a_slow_but_answering_gateway_is_not_left_for_another_installation(
    client_of: Callable[..., GatewayClient],
) -> None:
    """Its only gateway answers 0.8 s after stall_after_s: the answer is taken (the first copy
    is still awaited), the installation is not given up (failover_after_s 2 s not reached)."""
    slow = _SlowGateway("slow", 1.8)
    try:
        client = client_of(slow.url, stall_after_s=1.0, failover_after_s=2.0)
        assert client.post("/v1/write", b"x", "application/octet-stream") == {"who": "slow"}
        assert slow.posts == 1  # not sent again to the same gateway while it was awaited
    finally:
        slow.close()


def test_an_installation_whose_only_gateway_hangs_is_given_up_after_stall_plus_failover(
    client_of: Callable[..., GatewayClient],
) -> None:
    hung = _SlowGateway("hung", None)
    try:
        client = client_of(hung.url, stall_after_s=1.0, failover_after_s=1.0)
        started = time.monotonic()
        with pytest.raises(InstallationUnavailable) as raised:
            client.post("/v1/write", b"x", "application/octet-stream")
        took = time.monotonic() - started
        assert 2.0 <= took < 3.0, took
        assert raised.value.maybe_written  # its ranges are doubts at that installation
        assert "Stalled: no answer for" in str(raised.value)
    finally:
        hung.close()


@pytest.mark.slow
@pytest.mark.fault
def test_a_frozen_gateway_is_left_for_the_other_gateway_after_stall_after_s(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """F6: the gateway in use frozen, a second one of the installation healthy: lines went on
    only after ``request_timeout_s`` (60 s).  Now the hung request is sent to the other
    gateway after ``stall_after_s``; the frozen one's copy, thawed, writes nothing twice."""
    data = tmp_path / "data"
    first = start_gateway(data)
    second = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("h")
    writer.append(path, 300)
    state = tmp_path / "state"
    push = start_push(f"{first.url},{second.url}", state, path, extra=HUNG_FLAGS)
    push.wait_started(state)
    wait_for_lines(data, "app", 300)
    time.sleep(0.5)  # idle: the frozen gateway holds no lock of the shared store
    _freeze(first)
    try:
        writer.append(path, 300)
        took = _wait(lambda: read_delivered(data, "app").count() >= 600, "the other gateway", 30)
        assert took < STALL_S + 5, f"lines went on {took:.1f} s after the freeze\n{push.log()}"
        assert "Stalled: no answer for" in push.log()
        # said once the client has the answer, a moment after the lines are in the log
        _wait(lambda: f"now sending to {second.url}" in push.log(), "the move said", 10)
    finally:
        _thaw(first)
    time.sleep(1.0)  # the thawed gateway handles the request it held (a duplicate)
    writer.append(path, 300)
    wait_for_lines(data, "app", 900)
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(data, "app"), writer)


@pytest.mark.slow
@pytest.mark.fault
def test_a_frozen_installation_is_left_after_stall_after_s_plus_failover_after_s(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """F5: with dc1's gateway hanging (frozen here; waiting for its Kafka there) dc2 got the
    lines only after the requests failed (a minute).  Now dc1 is left ``stall_after_s +
    failover_after_s`` after its first request hung; what it held is in doubt there and
    settled once it answers again: every line in exactly one installation."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("i")
    writer.append(path, 300)
    state = tmp_path / "state"
    failover_s = 1.0
    extra = [*HUNG_FLAGS, "--server", f"dc2={dc2.url}", "--failover-after", f"{failover_s:g}"]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra)
    push.wait_started(state)
    _wait(lambda: read_delivered(dc1.data_dir, "app", "dc1").count() == 300, "dc1", 30)

    def in_dc2() -> int:
        return read_delivered(dc2.data_dir, "app", "dc2").count()

    try:
        with BackgroundWriter(path, writer, lines_per_tick=5):
            time.sleep(0.5)
            _freeze(dc1)
            took = _wait(lambda: in_dc2() > 0, "lines in dc2", 40)
            assert took < STALL_S + failover_s + 5, f"dc2 wrote {took:.1f} s after the freeze"
            time.sleep(1.0)
        assert "installation dc1 is down" in push.log()
    finally:
        _thaw(dc1)

    def every_line() -> bool:
        delivered = read_delivered(dc1.data_dir, "app", "dc1").count() + in_dc2()
        return delivered >= len(writer.ids)

    _wait(every_line, "every line (dc1's doubt settled)", 40)
    assert push.stop() == 0, push.log()
    assert_exactly_once_across(
        [read_delivered(dc1.data_dir, "app", "dc1"), read_delivered(dc2.data_dir, "app", "dc2")],
        writer,
    )


def test_a_request_passes_several_hung_gateways_in_about_one_stall(
    tmp_path: Path,
    start_gateway,  # type: ignore[no-untyped-def]
    hung_gateways: Callable[[int], list[str]],
    client_of: Callable[..., GatewayClient],
) -> None:
    """Five gateways of the installation hang (they take the connection and never answer),
    the sixth works: the request waited stall_after_s at each hung one in turn (5 s here).
    Now the gateways left are probed at once after the first hangs, and the request goes to
    the one that answers: about one stall_after_s.  The line lands once."""
    gateway = start_gateway(tmp_path / "data")
    client = client_of(*hung_gateways(5), gateway.url, stall_after_s=1.0)
    started = time.monotonic()
    answer = client.write(_one_line_write(b"one line\n"))
    took = time.monotonic() - started
    assert [a["status"] for a in answer["results"][0]["acks"]] == ["written"], answer
    assert took < 3.0, f"the request took {took:.1f} s past 5 hung gateways (stall 1 s)"
    assert client.current_server == gateway.url
    # the first hung one is failing; the request did not wait for the others' probes
    assert [row["error"] for row in client.failing()] == ["Stalled"], client.failing()
    assert read_delivered(tmp_path / "data", "app").ids() == ["one"]


def test_an_installation_whose_gateways_all_hang_is_given_up_after_about_one_stall(
    hung_gateways: Callable[[int], list[str]], client_of: Callable[..., GatewayClient]
) -> None:
    """Six hung gateways: given up stall_after_s + failover_after_s after the request was
    sent (it was 6 stalls), what the first one holds in doubt there (maybe_written)."""
    client = client_of(*hung_gateways(6), stall_after_s=1.0, failover_after_s=1.0)
    started = time.monotonic()
    with pytest.raises(InstallationUnavailable) as raised:
        client.write(_one_line_write(b"one line\n"))
    took = time.monotonic() - started
    assert 2.0 <= took < 4.0, took
    assert raised.value.maybe_written


@pytest.mark.slow
@pytest.mark.fault
def test_a_client_passes_three_hung_gateways_in_about_one_stall(
    tmp_path: Path,
    start_gateway,  # type: ignore[no-untyped-def]
    start_push,  # type: ignore[no-untyped-def]
    hung_gateways: Callable[[int], list[str]],
) -> None:
    """``--server hung1,hung2,hung3,gw``: the client's first request waited stall_after_s at
    each hung gateway in turn before it reached gw (3 x 2 s).  Now once: every line lands,
    once, about one stall after the client started."""
    data = tmp_path / "data"
    gateway = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("h")
    writer.append(path, 100)
    state = tmp_path / "state"
    servers = ",".join([*hung_gateways(3), gateway.url])
    push = start_push(servers, state, path, extra=HUNG_FLAGS)
    push.wait_started(state)
    took = _wait(lambda: read_delivered(data, "app").count() >= 100, "the lines", 30)
    assert took < STALL_S + 2.5, f"lines landed {took:.1f} s after the start\n{push.log()}"
    assert push.log().count("Stalled: no answer for") == 1, push.log()
    assert f"now sending to {gateway.url}" in push.log()
    writer.append(path, 100)
    wait_for_lines(data, "app", 200)
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(data, "app"), writer)
