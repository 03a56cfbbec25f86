"""``logbroker load --audit-server A,B``: a B that was down when the run started is asked its
installation when the counts first reach it, and refused if it belongs to another
installation than A (exit 2 with ``--audit-only``, nothing published there).  Before, only the
gateways that answered at the start were checked: the counts A could not take went to B's
audit, another installation's.

Real gateways (embedded store) behind scripted fronts: A's answers 503 to the audit's write,
B's answers 503 to its first ``/healthz`` (down at the start)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from audit.records import is_audit_topic
from tests.conftest import GatewayProcess
from tests.scripted_http import LoopbackServer, running, send_json
from tests.yt_loader.conftest import ChildProcess, append_lines
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec

pytestmark = [pytest.mark.spark, pytest.mark.slow]

Script = Callable[[str, str, int], int | None]
"""(method, path, how many times that method and path were asked) -> the status the front
answers itself, or None to pass the request on."""


class _Front(LoopbackServer):
    def __init__(self, upstream: str, script: Script) -> None:
        self.upstream = upstream
        self.script = script
        self.seen: list[str] = []
        self.lock = threading.Lock()
        super().__init__(_Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Front

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        asked = f"{self.command} {self.path}"
        with self.server.lock:
            self.server.seen.append(asked)
            status = self.server.script(self.command, self.path, self.server.seen.count(asked))
        if status is not None:
            send_json(self, status, b'{"error": "store_unavailable", "reason": "scripted"}')
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        answer = httpx.request(
            self.command, self.server.upstream + self.path, content=body, headers=headers
        )
        send_json(self, answer.status_code, answer.content)

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads what the load says."""


def _audit_topics(url: str) -> list[str]:
    topics = httpx.get(f"{url}/v1/topics", params={"include_audit": "true"}, timeout=30).json()
    return [t["name"] for t in topics["topics"] if is_audit_topic(t["name"])]


def test_an_audit_server_down_at_the_start_is_refused_when_first_reached_if_of_another_installation(
    spark: object,
    tmp_path: Path,
    gateway: GatewayProcess,
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    data_dir = tmp_path / "data"
    append_lines(data_dir, "dc1.app", "a", partitions=1, chunks=2)
    warehouse = tmp_path / "wh"
    config = LoadConfig(SourceSpec(data_dir=str(data_dir)), warehouse, table_format="parquet")
    run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    assert _audit_topics(gateway.url) == [] and _audit_topics(other.url) == []

    def a_refuses_writes(method: str, _path: str, _n: int) -> int | None:
        return 503 if method == "POST" else None

    def b_down_at_the_start(_method: str, path: str, n: int) -> int | None:
        return 503 if path == "/healthz" and n == 1 else None

    with (
        running(_Front(gateway.url, a_refuses_writes)) as first,
        running(_Front(other.url, b_down_at_the_start)) as late,
    ):
        child = ChildProcess(
            ["-m", "ops", "load", "--data-dir", str(data_dir), "--warehouse", str(warehouse),
             "--table-format", "parquet", "--audit-only",
             "--audit-server", f"{first.url},{late.url}"],
            tmp_path / "load.log",
        )  # fmt: skip
        code = child.wait(60)
        output = child.output()

    assert code == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith(
        f"logbroker load: publishing the audit counts failed: {late.url} belongs to installation "
    ), last
    assert f"{first.url} to " in last and "another installation's audit" in last, last
    assert f"audit: {first.url}: " in output  # A was asked first, and failed
    assert [s for s in late.seen if s.startswith("POST")] == []  # nothing sent to B
    assert _audit_topics(other.url) == []
