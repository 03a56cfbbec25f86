"""What a push endpoint answers cannot make the gateway hold it: only the status is read (and
a few KiB of the body), and each POST has one deadline as a whole, not only per read."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until

_ENDLESS_CAP = 256 * 1024 * 1024
"""What an "endless" answer sends at most (a gateway that reads it all is still caught)."""
_PIECE = b"x" * (64 * 1024)


@dataclass
class _Connection:
    """One POST the endpoint received: what it sent back, and when the gateway hung up."""

    started: float
    sent: int = 0
    closed_after_s: float | None = None


@dataclass
class RawEndpoint:
    """An HTTP endpoint on a plain socket, answering the n-th POST as ``answer(n, conn, c)``
    says; each answer runs in its own thread."""

    answer: Callable[[int, socket.socket, _Connection], None]
    connections: list[_Connection] = field(default_factory=list)
    listener: socket.socket | None = None

    @property
    def url(self) -> str:
        assert self.listener is not None
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"

    def start(self) -> RawEndpoint:
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        # A small send buffer: what the kernel holds for the gateway stays small too.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        with conn:
            while _read_request(conn):
                record = _Connection(time.monotonic())
                self.connections.append(record)
                try:
                    self.answer(len(self.connections) - 1, conn, record)
                except OSError:
                    record.closed_after_s = time.monotonic() - record.started
                    return

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()


def _read_request(conn: socket.socket) -> bool:
    """One request's head and body; False once the gateway closed the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return False
        data += piece
    head, rest = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        piece = conn.recv(65536)
        if not piece:
            return False
        rest += piece
    return True


def endless(status: int) -> Callable[[int, socket.socket, _Connection], None]:
    """``status``, then a chunked body that does not end (until ``_ENDLESS_CAP``)."""

    def answer(n: int, conn: socket.socket, record: _Connection) -> None:
        conn.sendall(f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"%x\r\n" % len(_PIECE) + _PIECE + b"\r\n"
        while record.sent < _ENDLESS_CAP:
            conn.sendall(chunk)
            record.sent += len(chunk)
        conn.sendall(b"0\r\n\r\n")

    return answer


def ok(n: int, conn: socket.socket, record: _Connection) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


@pytest.fixture
def raw_endpoint() -> Iterator[Callable[..., RawEndpoint]]:
    endpoints: list[RawEndpoint] = []

    def _make(answer: Callable[[int, socket.socket, _Connection], None]) -> RawEndpoint:
        endpoint = RawEndpoint(answer).start()
        endpoints.append(endpoint)
        return endpoint

    yield _make
    for endpoint in endpoints:
        endpoint.stop()


def _subscribe(url: str, name: str, endpoint: str, timeout_ms: int) -> None:
    created = httpx.post(
        f"{url}/v1/subscriptions",
        json={
            "name": name,
            "endpoint": endpoint,
            "topics": ["dc1.app"],
            "linger_ms": 10,
            "timeout_ms": timeout_ms,
            "min_backoff_ms": 50,
            "max_backoff_ms": 50,
        },
    )
    assert created.status_code == 201, created.text


def _status(url: str, name: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/subscriptions/{name}").json())


def _rss_kib(pid: int) -> int:
    """The resident memory of the gateway's process group (``pid`` leads it)."""
    total = 0
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except (OSError, NotADirectoryError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) != pid:  # the process group
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def test_an_endless_answer_is_cut_after_a_few_kib_and_its_status_still_counts(
    start_gateway: Any, writer_for: Any, raw_endpoint: Any
) -> None:
    """A 500 and then a 200, each with a body that never ends: the gateway reads neither
    body, drops each connection at once, records the 500, and the 200 delivers the batch
    (once: it is not sent again)."""
    endpoint = raw_endpoint(
        lambda n, conn, record: endless(500 if n == 0 else 200)(n, conn, record)
    )
    gw = start_gateway(None, *PUSH_TO_LOOPBACK)
    writer_for(gw.url).write("s", [1, 2, 3])
    assert gw.proc is not None
    rss_before = _rss_kib(gw.proc.pid)
    _subscribe(gw.url, "endless", endpoint.url, timeout_ms=20_000)
    wait_until(lambda: _status(gw.url, "endless")["delivered_messages"] == 3, 20, "delivery")
    wait_until(
        lambda: all(c.closed_after_s is not None for c in endpoint.connections),
        10,
        "the gateway to drop the connections",
    )
    rss_after = _rss_kib(gw.proc.pid)
    assert len(endpoint.connections) == 2  # the 500, then the 200 that delivered
    for record in endpoint.connections:
        assert record.sent < 16 * 1024 * 1024, record  # kernel buffers, not the answer
        assert record.closed_after_s is not None and record.closed_after_s < 5, record
    assert rss_after - rss_before < 32 * 1024, (rss_before, rss_after)
    time.sleep(0.5)
    assert len(endpoint.connections) == 2  # delivered: nothing sent again


def test_an_answer_that_dribbles_is_cut_at_the_deadline_of_the_post(
    start_gateway: Any, writer_for: Any, raw_endpoint: Any
) -> None:
    """An endpoint that sends its status line a byte every 0.2 s never trips a per-read
    timeout of 1 s; the POST's own deadline of 1 s cuts it, and the retry delivers."""

    def dribble(n: int, conn: socket.socket, record: _Connection) -> None:
        if n > 0:
            ok(n, conn, record)
            return
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 150:
            conn.sendall(bytes([byte]))
            record.sent += 1
            time.sleep(0.2)

    endpoint = raw_endpoint(dribble)
    gw = start_gateway(None, *PUSH_TO_LOOPBACK)
    writer_for(gw.url).write("s", [1, 2])
    _subscribe(gw.url, "slow", endpoint.url, timeout_ms=1_000)
    wait_until(lambda: _status(gw.url, "slow")["delivered_messages"] == 2, 15, "delivery")
    first = endpoint.connections[0]
    wait_until(lambda: first.closed_after_s is not None, 5, "the first POST to be cut")
    assert first.closed_after_s is not None and first.closed_after_s < 3, first
    assert len(endpoint.connections) == 2
