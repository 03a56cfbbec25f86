"""``load --server URL,URL``: a gateway that is unreachable (restarting) or answers 503 (a
Kafka takeover) is asked again, and the next gateway of the installation is asked meanwhile;
a refusal that no retry mends (403) fails at once, and an outage longer than the retry time
fails naming every gateway.  Nothing is loaded twice.

The gateway is real (embedded store); in front of it a scripted proxy answers some requests
itself, as a gateway in trouble or a load balancer without a gateway behind it would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from audit.windows import window_start
from delivery.installations import MixedInstallations
from log_store.errors import BadRequest
from ops.commands.load import _publish_to_one
from tests.conftest import GatewayProcess, free_port
from tests.scripted_http import LoopbackServer, running
from tests.yt_loader.conftest import append_lines, assert_exactly_once, table_lines
from yt_loader.errors import SourceUnavailable
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import HttpLogSource, SourceSpec

Script = Callable[[str], int | None]
"""A request's path -> the status the proxy answers itself, or None to pass it on."""


class _Proxy(LoopbackServer):
    def __init__(self, upstream: str, script: Script) -> None:
        self.upstream = upstream
        self.script = script
        self.paths: list[str] = []
        self.lock = threading.Lock()
        super().__init__(_Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Proxy

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
            status = self.server.script(self.path)
        if status is None:
            answer = httpx.get(self.server.upstream + self.path, headers=dict(self.headers))
            status, body = answer.status_code, answer.content
            content_type = answer.headers.get("content-type", "application/json")
        else:
            body = b'{"error": "store_unavailable", "reason": "scripted"}'
            content_type = "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: the tests read what the loader says."""


def _proxy(upstream: str, script: Script) -> contextlib.AbstractContextManager[_Proxy]:
    return running(_Proxy(upstream, script))


def _every(n: int, status: int) -> Script:
    """``status`` to every ``n``-th request, the others passed on."""
    count = [0]

    def script(_path: str) -> int | None:
        count[0] += 1
        return status if count[0] % n == 0 else None

    return script


def test_a_load_through_gateways_that_fail_now_and_then_loads_every_line_once(
    spark: object, tmp_path: Path, gateway: GatewayProcess
) -> None:
    expected = append_lines(gateway.data_dir, "dc1.app", "a", partitions=2, chunks=6)
    down = f"http://127.0.0.1:{free_port()}"  # a gateway that is restarting: refused
    with _proxy(gateway.url, _every(3, 503)) as busy:
        spec = SourceSpec(server=f"{down},{busy.url}", gateway_retry_s=30)
        config = LoadConfig(spec, tmp_path / "table", max_range_bytes=4000)
        report = run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    assert report.lines == len(expected)
    assert sum("/messages" in p for p in busy.paths) > 1  # the tasks read through it
    assert_exactly_once(table_lines(spark, tmp_path / "table"), expected)


def test_a_gateway_that_restarts_during_a_read_is_asked_again_until_it_answers(
    gateway: GatewayProcess,
) -> None:
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    up_at = time.monotonic() + 1.5
    with _proxy(gateway.url, lambda _p: 503 if time.monotonic() < up_at else None) as proxy:
        source = HttpLogSource(proxy.url, retry_s=30)
        try:
            batch = source.read("dc1.app", 0, 0, 1 << 20)
        finally:
            source.close()
    assert len(batch.messages) == 2
    assert len(proxy.paths) > 2  # refused, asked again, answered


def test_gateways_that_stay_unavailable_fail_the_read_after_the_retry_time_naming_each(
    gateway: GatewayProcess,
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    # a gateway without its store: it names its installation (/healthz), and answers 503
    with _proxy(gateway.url, lambda p: None if p == "/healthz" else 503) as busy:
        source = HttpLogSource(f"{down},{busy.url}", retry_s=1.0)
        started = time.monotonic()
        try:
            with pytest.raises(SourceUnavailable) as caught:
                source.topic_names()
        finally:
            source.close()
    took = time.monotonic() - started
    assert 1.0 <= took < 10, took
    message = str(caught.value)
    assert f"gateway {down} unreachable" in message
    assert f"gateway {busy.url} answered 503 to /v1/topics: scripted" in message
    assert "after 1 s of trying again" in message


def test_a_refusal_no_retry_mends_fails_at_once(gateway: GatewayProcess) -> None:
    with _proxy(gateway.url, lambda _p: 403) as refusing:
        source = HttpLogSource(refusing.url, retry_s=30)
        started = time.monotonic()
        try:
            with pytest.raises(BadRequest, match="scripted"):
                source.topic_names()
        finally:
            source.close()
    assert time.monotonic() - started < 5
    assert refusing.paths == ["/v1/topics"]


def test_server_takes_a_list_of_gateway_urls_and_refuses_a_bad_one() -> None:
    spec = SourceSpec(server="http://a:8080, http://b:8080/")
    assert spec.describe() == "gateways http://a:8080, http://b:8080"
    with pytest.raises(BadRequest, match="'b:8080'"):
        SourceSpec(server="http://a:8080,b:8080")
    with pytest.raises(BadRequest, match="gateway_retry_s"):
        SourceSpec(server="http://a:8080", gateway_retry_s=float("nan"))


def test_the_audit_counts_go_to_the_first_gateway_of_the_list_that_takes_them(
    tmp_path: Path, gateway: GatewayProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    window = window_start(int(time.time() * 1000))
    counts = {("dc1.app", window): (2, 6)}

    assert _publish_to_one(counts, tmp_path / "table", f"{down},{gateway.url}", None) == 1
    assert f"audit: {down}: " in capsys.readouterr().err  # said, then the next one asked


def test_a_gateway_of_another_installation_is_refused_before_anything_is_read_from_it(
    gateway: GatewayProcess, start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """The offsets a load planned through the first gateway are not offsets of another
    installation's log: the second, asked once the first is down, is refused (before, the
    read went on there and loaded the other log's records at them)."""
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    append_lines(other.data_dir, "dc1.app", "b", partitions=1, chunks=3)
    source = HttpLogSource(f"{gateway.url},{other.url}", retry_s=5)
    try:
        assert [p.end_offset for p in source.topic_bounds("dc1.app").partitions] == [2]
        gateway.kill()
        with pytest.raises(MixedInstallations) as caught:
            source.read("dc1.app", 0, 0, 1 << 20)
    finally:
        source.close()
    assert f"{other.url} belongs to installation" in str(caught.value)
    assert f"{gateway.url} to " in str(caught.value)


def test_a_url_no_wait_makes_right_fails_at_once() -> None:
    source = HttpLogSource("ftp://127.0.0.1:1", retry_s=30)
    started = time.monotonic()
    try:
        with pytest.raises(SourceUnavailable, match=r"ftp://127\.0\.0\.1:1"):
            source.topic_names()
    finally:
        source.close()
    assert time.monotonic() - started < 5  # before, it was asked again for the 30 s


def test_a_task_that_meets_another_installation_fails_the_load_as_the_driver_would(
    spark: object,
    tmp_path: Path,
    gateway: GatewayProcess,
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    """B did not answer at the start; a task whose reads A refuses goes to B, which belongs
    to another installation: the load ends with the driver's refusal (a ``BadRequest``,
    exit 2), not with a batch failure (exit 1), and commits nothing."""
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    healthz_asked = [0]

    def down_at_the_start(path: str) -> int | None:
        if path == "/healthz":
            healthz_asked[0] += 1
            return 503 if healthz_asked[0] == 1 else None
        return None

    with (
        _proxy(gateway.url, lambda p: 503 if "/messages" in p else None) as first,
        _proxy(other.url, down_at_the_start) as late,
    ):
        spec = SourceSpec(server=f"{first.url},{late.url}", gateway_retry_s=5)
        config = LoadConfig(spec, tmp_path / "table")
        with pytest.raises(MixedInstallations) as caught:
            run_load(spark, config, lambda _line: None)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(f"{late.url} belongs to installation "), message
    assert f"{first.url} to " in message and "one installation" in message, message
    assert not any("/messages" in p for p in late.paths)  # nothing read from the other log


def test_a_source_opened_from_a_pinned_spec_refuses_another_installation_as_its_first_gateway(
    gateway: GatewayProcess, start_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """The driver pins the installation it planned in; a task's source, opened anew, finds A
    down and B of another installation up: B is refused, though it is the first gateway the
    task reaches (before, the task took B's log as its own and read it at A's offsets)."""
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    append_lines(other.data_dir, "dc1.app", "b", partitions=1, chunks=3)
    healthz_asked = [0]

    def down_at_the_start(path: str) -> int | None:
        healthz_asked[0] += path == "/healthz"
        return 503 if healthz_asked[0] == 1 else None

    with _proxy(other.url, down_at_the_start) as late:
        spec = SourceSpec(server=f"{gateway.url},{late.url}", gateway_retry_s=5).pinned()
        assert spec.installation is not None and spec.installation[0] == gateway.url
        gateway.kill()
        source = spec.open()  # as a task opens it
        try:
            with pytest.raises(MixedInstallations) as caught:
                source.read("dc1.app", 0, 0, 1 << 20)
        finally:
            source.close()
    assert str(caught.value).startswith(f"{late.url} belongs to installation ")
    assert f"{gateway.url} to " in str(caught.value)
    assert not any("/messages" in p for p in late.paths)
