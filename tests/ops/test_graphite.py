"""``--graphite HOST:PORT`` sends the daemons' metrics in Graphite's plaintext protocol.

A tiny carbon stand-in (a TCP listener in the test) receives the lines of a gateway with two
workers (sent by its parent process from the workers' shared files) and of a push-client:
``PREFIX.NAME[.LABEL.VALUE...] VALUE TIMESTAMP``, with the values the daemons counted.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.metrics_text import sample
from tests.push_client.conftest import FAST_FLAGS, LineWriter, PushProcess, wait_for_lines

pytestmark = pytest.mark.slow

LINES = 300


class CarbonListener:
    """Accepts plaintext connections on a free loopback port and keeps every line received."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
            with self._lock:
                self.lines.extend(data.decode("ascii").splitlines())

    def latest(self, path: str) -> tuple[float, int] | None:
        """The last (value, timestamp) received for a metric path."""
        with self._lock:
            found = [line.split() for line in self.lines if line.split()[0] == path]
        return (float(found[-1][1]), int(found[-1][2])) if found else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sock.close()


def _wait(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_gateway_and_push_client_send_their_metrics_to_graphite(
    start_gateway: Any, tmp_path: Path
) -> None:
    carbon = CarbonListener()
    graphite = ["--graphite", f"127.0.0.1:{carbon.port}", "--graphite-interval", "0.5"]
    gateway = start_gateway(None, "--workers", "2", *graphite, "--graphite-prefix", "lbtest.gw1")
    log = tmp_path / "app.log"
    LineWriter("graphite").append(log, LINES)
    push = PushProcess(
        [
            "--server",
            gateway.url,
            "--log-type",
            "app",
            "--state-dir",
            str(tmp_path / "state"),
            *graphite,
            "--graphite-prefix",
            "lbtest.host1",
            *FAST_FLAGS,
            str(log),
        ],
        tmp_path / "push.log",
    ).start()
    try:
        wait_for_lines(gateway.data_dir, "app", LINES, timeout_s=60)
        text = httpx.get(f"{gateway.url}/metrics", timeout=30).text
        written = sample(text, "logbroker_chunks_total", topic="dc1.app", status="written")
        data = sample(text, "logbroker_written_bytes_total", topic="dc1.app")
        assert written and data == log.stat().st_size

        chunks_path = "lbtest.gw1.logbroker_chunks_total.status.written.topic.dc1_app"
        _wait(
            "the gateway's chunk count", lambda: (carbon.latest(chunks_path) or (0,))[0] == written
        )
        bytes_path = "lbtest.gw1.logbroker_written_bytes_total.topic.dc1_app"
        _wait("the gateway's byte count", lambda: (carbon.latest(bytes_path) or (0,))[0] == data)
        # gauges read from the store travel too (the parent reads them, not the workers' files)
        free = carbon.latest("lbtest.gw1.logbroker_disk_free_bytes")
        assert free is not None and free[0] > 0
        assert abs(free[1] - time.time()) < 120

        acked = "lbtest.host1.logbroker_push_acked_bytes_total"
        _wait("the push-client's acked bytes", lambda: (carbon.latest(acked) or (0,))[0] == data)
        assert push.stop() == 0
    finally:
        push.kill()
        gateway.stop()
        carbon.close()


def test_a_graphite_that_hangs_holds_a_stopping_daemon_at_most_the_stop_wait() -> None:
    """A Graphite whose listener takes no more connections (its accept queue full): the
    sender's connect waits out its 10 s timeout.  ``stop`` used to wait for that send without
    a limit and then make its last send, 20 s in all; it now gives up after its wait."""
    from prometheus_client import CollectorRegistry, Counter

    from ops.graphite import GraphiteSender

    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    address = full.getsockname()
    queued: list[socket.socket] = []
    try:
        while True:  # fill the queue: then a connect hangs
            try:
                queued.append(socket.create_connection(address, timeout=0.3))
            except TimeoutError:
                break
            assert len(queued) < 10
        registry = CollectorRegistry()
        Counter("lines", "lines", registry=registry).inc()
        sender = GraphiteSender(address, registry, interval_s=0.05).start()
        time.sleep(0.3)  # its first send is waiting to connect
        started = time.monotonic()
        sender.stop(wait_s=1.0)
        took = time.monotonic() - started
        assert took < 2.0, f"stop took {took:.2f} s"
    finally:
        for conn in queued:
            conn.close()
        full.close()
