"""A partition without a reachable owner holds back only the files pinned to it.

A real push-client ships three files through a proxy in front of a real gateway.  While the
proxy plays a partition outage for one file, it answers each write that carries that file as
a Kafka gateway does then: the sections of the other files are written (forwarded to the real
gateway), and the request is answered 503 ``partition_unavailable`` naming the waiting file's
source.  The other files keep shipping; the waiting one resumes by itself when the partition
is back, and every line of every file is in the log exactly once.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.metrics_text import sample
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    until,
)
from tests.scripted_http import LoopbackServer, running

pytestmark = pytest.mark.slow

_MAGIC = b"LBW1"
_META_LEN = struct.Struct(">H")
_COUNT = struct.Struct(">I")
_CHUNK_HEAD = struct.Struct(">QqI")


def _sections(body: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """A write body's sections: (meta, the section's bytes as sent)."""
    assert body[:4] == _MAGIC
    out = []
    at = 4
    while at < len(body):
        start = at
        (meta_len,) = _META_LEN.unpack_from(body, at)
        meta = json.loads(body[at + 2 : at + 2 + meta_len])
        at += 2 + meta_len
        (count,) = _COUNT.unpack_from(body, at)
        at += 4
        for _ in range(count):
            _seqno, _created, size = _CHUNK_HEAD.unpack_from(body, at)
            at += _CHUNK_HEAD.size + size
        out.append((meta, body[start:at]))
    return out


class _OutageProxy(LoopbackServer):
    """Forwards to ``gateway``; while ``waiting_file`` is set, a write carrying a section of
    that file is answered as a gateway whose partition of it has no owner answers."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.http = httpx.Client(timeout=60)
        self.waiting_file = ""
        self.refused = 0
        self.partitions: dict[str, tuple[str, int]] = {}
        """Per source id, its topic and partition (from the session answers)."""
        self.sessions_waiting_file = ""
        """Set: a session batch asking for that file is answered 503, as a Kafka gateway
        answers while the file's partition has no owner (how long, in its reason)."""
        self.sessions_refused: list[float] = []
        self.pin_partition: int | None = None
        """Set: the partition named is this one, as holding the waiting sources' pins (a
        gateway routing them for the first time), not the partition their data goes to."""
        super().__init__(_ProxyHandler)


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _OutageProxy

    def do_GET(self) -> None:
        answer = self.server.http.get(self.server.gateway + self.path, headers=self._headers())
        self._send(answer.status_code, answer.content, answer.headers)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        proxy = self.server
        waiting = proxy.waiting_file
        binary = self.headers.get("Content-Type") == "application/x-logbroker-chunks"
        if self.path == "/v1/write" and waiting and binary:  # not the audit's NDJSON
            sections = _sections(body)
            held = [m["source_id"] for m, _ in sections if m["file"].endswith(waiting)]
            if held:
                self._held(held, [raw for m, raw in sections if m["source_id"] not in held])
                return
        if self.path == "/v1/sessions" and proxy.sessions_waiting_file:
            files = [str(session.get("file", "")) for session in json.loads(body)["sessions"]]
            if any(file.endswith(proxy.sessions_waiting_file) for file in files):
                self._sessions_held()
                return
        answer = proxy.http.post(proxy.gateway + self.path, content=body, headers=self._headers())
        if self.path == "/v1/sessions" and answer.status_code == 200:
            for session in answer.json()["sessions"]:
                if "partition" in session:
                    proxy.partitions[session["source_id"]] = (
                        session["topic"],
                        session["partition"],
                    )
        self._send(answer.status_code, answer.content, answer.headers)

    def _held(self, held: list[str], others: list[bytes]) -> None:
        """What a Kafka gateway answers: the other sections written, then a 503 naming
        the sources on the partition without an owner."""
        proxy = self.server
        if others:
            written = proxy.http.post(
                proxy.gateway + "/v1/write",
                content=_MAGIC + b"".join(others),
                headers=self._headers(),
            )
            if written.status_code != 200:
                self._send(written.status_code, written.content, written.headers)
                return
        topic, partition = proxy.partitions.get(held[0], ("dc1.app", 0))
        named: dict[str, Any] = {"topic": topic, "partition": partition, "source_ids": held}
        if proxy.pin_partition is not None:
            partition = named["partition"] = proxy.pin_partition
            named["pins"] = True  # as ingest_api.errors.partitions_unavailable(pins=True)
        proxy.refused += 1
        answer = {
            "error": "partition_unavailable",
            "reason": f"no gateway owns {topic}/{partition} right now (none)",
            "partitions": [named],
        }
        self._send(503, json.dumps(answer).encode(), {"Retry-After": "1"})

    def _sessions_held(self) -> None:
        """A Kafka gateway's answer to sessions of a partition whose owner was killed: the
        reason says for how long its address has refused connections, longer each time."""
        proxy = self.server
        proxy.sessions_refused.append(time.monotonic())
        down_s = proxy.sessions_refused[-1] - proxy.sessions_refused[0] + 1.1
        answer = {
            "error": "partition_unavailable",
            "reason": (
                "the owner of dc1.app/1 (http://127.0.0.1:9) has refused every connection "
                f"for {down_s:.1f} s: its gateway is down, and the gateways' group hands the "
                "partition on after its session timeout"
            ),
            "partitions": [{"topic": "dc1.app", "partition": 1}],
        }
        self._send(503, json.dumps(answer).encode(), {"Retry-After": "1"})

    def _headers(self) -> dict[str, str]:
        return {
            k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
        }

    def _send(self, status: int, body: bytes, headers: Any) -> None:
        self.send_response(status)
        self.send_header("Content-Type", headers.get("Content-Type", "application/json"))
        if "Retry-After" in headers:
            self.send_header("Retry-After", headers["Retry-After"])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the client's log, not the proxy's."""


@contextlib.contextmanager
def _proxy(gateway: str) -> Iterator[_OutageProxy]:
    with running(_OutageProxy(gateway)) as server:
        try:
            yield server
        finally:
            server.http.close()


@contextlib.contextmanager
def _pushing(
    tmp_path: Path, server: str, logs: Path, state: Path, extra: str = ""
) -> Iterator[PushProcess]:
    """A push-client of ``logs/*.log`` through ``server``, started (stopped at the end)."""
    config = tmp_path / "push.toml"
    config.write_text(
        f"""
[push]
servers = ["{server}"]
state_dir = "{state}"
max_backoff_s = 1.0
{extra}
[[entry]]
path = "{logs}/*.log"
log_type = "app"
"""
    )
    push = PushProcess(["--config", str(config), *FAST_FLAGS], tmp_path / "push.log")
    push.start()
    try:
        push.wait_started(state)
        yield push
    finally:
        push.stop()


def _logs(tmp_path: Path, *names: str) -> tuple[Path, dict[str, LineWriter]]:
    """A directory of ``<name>.log`` files of 100 lines each, and their writers."""
    logs = tmp_path / "logs"
    logs.mkdir()
    writers = {name: LineWriter(name) for name in names}
    for name, writer in writers.items():
        writer.append(logs / f"{name}.log", 100)
    return logs, writers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _status(state: Path) -> str:
    return subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    ).stdout


def test_files_on_healthy_partitions_ship_while_one_partition_has_no_owner(
    tmp_path: Path, start_gateway
) -> None:
    gateway = start_gateway(tmp_path / "data")
    logs, writers = _logs(tmp_path, "alpha", "beta", "slow")
    state = tmp_path / "state"
    metrics_port = _free_port()
    metrics = f"metrics_port = {metrics_port}\n"
    with _proxy(gateway.url) as proxy, _pushing(tmp_path, proxy.url, logs, state, metrics) as push:

        def lines_of(name: str) -> int:
            delivered = read_delivered(gateway.data_dir, "app")
            return sum(1 for i in delivered.ids() if i.startswith(f"{name}:"))

        assert until(lambda: read_delivered(gateway.data_dir, "app").count() == 300, 30)
        proxy.waiting_file = "slow.log"
        # Several rounds: a client that retried the whole request got one or two rounds
        # of the others through (the gateway wrote their sections), then stalled with
        # every request of theirs in flight behind the waiting file.
        for round_ in range(1, 5):
            for writer_name, writer in writers.items():
                writer.append(logs / f"{writer_name}.log", 50)
            expected = 100 + 50 * round_
            assert until(lambda e=expected: lines_of("alpha") == e and lines_of("beta") == e, 15), (
                f"round {round_}: alpha {lines_of('alpha')}, beta {lines_of('beta')} of "
                f"{expected}: {push.log()}"
            )
        assert lines_of("slow") == 100  # held back all along
        assert until(lambda: proxy.refused >= 3, 15)  # tried again, by itself
        out = _status(state)
        assert f"PARTITION UNAVAILABLE {logs}/slow.log: dc1.app/" in out, out
        assert "has no reachable owner" in out
        assert "waiting" in out
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert sample(metrics, "logbroker_push_partition_waiting_files") == 1
        refusals = sample(metrics, "logbroker_push_requests_total", outcome="partition_unavailable")
        assert refusals is not None and refusals >= 2
        log_text = push.log()
        assert f"{logs}/slow.log: partition dc1.app/" in log_text
        assert "has no reachable owner now" in log_text

        proxy.waiting_file = ""  # the partition has an owner again
        assert until(lambda: lines_of("slow") == 300, 30), push.log()
        assert until(lambda: "PARTITION UNAVAILABLE" not in _status(state), 10)
        assert "takes writes again" in push.log()
        assert_exactly_once(read_delivered(gateway.data_dir, "app"), *writers.values())


def test_a_file_waiting_for_the_partition_holding_its_pin_is_said_to_wait_for_that_one(
    tmp_path: Path, start_gateway
) -> None:
    """A gateway that routes a source for the first time needs its pin, kept in another
    partition than its data's; when that one has no owner it is named with ``"pins": true``.
    The log and ``--status`` say that the file waits for the partition holding its pin and
    where its data goes: once the log named the pin's partition as the file's and ``--status``
    the data's, each contradicting the other."""
    gateway = start_gateway(tmp_path / "data", "--partitions", "4")
    logs, writers = _logs(tmp_path, "alpha", "slow")
    state = tmp_path / "state"
    with _proxy(gateway.url) as proxy, _pushing(tmp_path, proxy.url, logs, state) as push:
        assert until(lambda: read_delivered(gateway.data_dir, "app").count() == 200, 60), push.log()

        def slow_row() -> dict[str, Any]:
            rows = json.loads((state / "status.json").read_text())["files"]
            (row,) = [r for r in rows if r["path"].endswith("slow.log")]
            return row

        assert until(lambda: slow_row()["partition"] >= 0, 10)
        data = slow_row()["partition"]
        assert proxy.partitions[slow_row()["source_id"]] == ("dc1.app", data)
        pin = (data + 1) % 4
        proxy.pin_partition = pin
        proxy.waiting_file = "slow.log"
        for writer_name, writer in writers.items():
            writer.append(logs / f"{writer_name}.log", 50)
        assert until(lambda: proxy.refused >= 2, 15), push.log()
        said = f"dc1.app/{pin}, which holds its pin (its data goes to dc1.app/{data}),"
        assert f"{logs}/slow.log: partition {said} has no reachable owner now" in push.log()
        assert until(lambda: "holds its pin" in _status(state), 10)
        out = _status(state)
        assert f"PARTITION UNAVAILABLE {logs}/slow.log: {said} has no reachable" in out, out
        outage = slow_row()["partition_outage"]
        assert (outage["partition"], outage["holds_pin"]) == (pin, True), outage
        assert slow_row()["partition"] == data
        proxy.waiting_file = ""
        assert until(lambda: read_delivered(gateway.data_dir, "app").count() == 300, 60), push.log()
        assert until(lambda: "takes writes again" in push.log(), 15), push.log()
        assert_exactly_once(read_delivered(gateway.data_dir, "app"), *writers.values())


def test_a_file_whose_session_waits_for_an_owner_is_said_to_wait_once(
    tmp_path: Path, start_gateway
) -> None:
    """A file whose session a Kafka gateway answers 503 ``partition_unavailable`` (its
    partition's owner was killed) is asked again after a backoff, and said to wait once: the
    reason states how long the owner has refused connections, and each retry's longer time
    made it a new warning, one per file each second for the whole session timeout."""
    gateway = start_gateway(tmp_path / "data")
    logs, writers = _logs(tmp_path, "alpha", "slow")
    state = tmp_path / "state"
    with _proxy(gateway.url) as proxy:
        proxy.sessions_waiting_file = "slow.log"
        with _pushing(tmp_path, proxy.url, logs, state) as push:
            assert until(lambda: len(proxy.sessions_refused) >= 5, 30), push.log()
            assert read_delivered(gateway.data_dir, "app").count() == 100  # alpha ships
            waits = push.log().count(f"{logs}/slow.log: the gateway cannot take it now")
            assert waits == 1, push.log()
            out = _status(state)
            assert f"RETRYING {logs}/slow.log: the gateway cannot take it now" in out, out
            proxy.sessions_waiting_file = ""  # the partition has an owner again
            assert until(lambda: read_delivered(gateway.data_dir, "app").count() == 200, 30), (
                push.log()
            )
            assert f"{logs}/slow.log: the gateway takes it again" in push.log()
            assert_exactly_once(read_delivered(gateway.data_dir, "app"), *writers.values())
