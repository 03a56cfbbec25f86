"""``spark.read.format("logbroker").option("server", "A,B")`` reads one installation's log.

The driver asks every gateway its installation before it plans, at once: a B of another
installation fails the read then, naming both, even while A is healthy.  Each range carries
the installation the driver planned in, and a task refuses a gateway of another one before
it reads anything there: a task that finds A down and B (down at the driver's start) up does
not read B's log at A's offsets.  Before, the source checked no installation: a batch read
went on through A with B in the list, and a task read B's log at A's offsets, caught (if at
all) only after the read by the topic identity check, as a topic "deleted and created again".

The planning and the tasks of the source are plain Python (Spark calls them in its Python
workers), so the task's side is also called directly, as in ``test_source_topic_identity``;
the driver's side runs in a real Spark session.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from delivery.installations import MixedInstallations
from tests.conftest import GatewayProcess
from tests.scripted_http import LoopbackServer, running, send_json
from tests.yt_loader.conftest import append_lines
from yt_loader.data_source import (
    LogbrokerBatchReader,
    LogbrokerStreamReader,
    RangePartition,
    ReaderOptions,
)
from yt_loader.log_source import SourceSpec


class _Late(LoopbackServer):
    """A front of a real gateway whose first ``/healthz`` answers 503 (down at the start of
    the read); everything else is passed on.  ``paths``: what it was asked."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.paths: list[str] = []
        self.lock = threading.Lock()
        super().__init__(_LateHandler)


class _LateHandler(BaseHTTPRequestHandler):
    server: _Late

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
            first_healthz = self.server.paths.count("/healthz") == 1 and self.path == "/healthz"
        if first_healthz:
            send_json(self, 503, b'{"error": "not_ready", "reason": "starting"}')
            return
        answer = httpx.get(self.server.upstream + self.path, headers=dict(self.headers))
        send_json(self, answer.status_code, answer.content)

    def log_message(self, *args: object) -> None:
        """Quiet: the tests read what the source says."""


@pytest.fixture
def late_other(tmp_path: Path, start_gateway: Callable[..., GatewayProcess]) -> Iterator[_Late]:
    """A gateway of another installation, with lines of its own, behind a :class:`_Late`."""
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    append_lines(other.data_dir, "dc1.app", "b", partitions=1, chunks=6)
    with running(_Late(other.url)) as late:
        yield late


@pytest.mark.spark
@pytest.mark.slow
def test_a_read_through_gateways_of_two_installations_fails_before_it_plans(
    spark: object,
    tmp_path: Path,
    gateway: GatewayProcess,
    start_gateway: Callable[..., GatewayProcess],
) -> None:
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    reader = spark.read.format("logbroker").option("server", f"{gateway.url},{other.url}")  # type: ignore[attr-defined]

    with pytest.raises(Exception, match="belongs to installation") as caught:
        reader.load().collect()
    message = str(caught.value)
    assert f"{other.url} belongs to installation " in message, message
    assert f"{gateway.url} to " in message and "one installation" in message, message


def test_a_stream_through_gateways_of_two_installations_fails_at_its_start(
    tmp_path: Path, gateway: GatewayProcess, start_gateway: Callable[..., GatewayProcess]
) -> None:
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    other = start_gateway(tmp_path / "other")  # another data dir: another installation
    stream = LogbrokerStreamReader(
        ReaderOptions(SourceSpec(server=f"{gateway.url},{other.url}"), topics="dc1.*")
    )
    with pytest.raises(MixedInstallations, match=f"{other.url} belongs to installation "):
        stream.initialOffset()


def _as_shipped(partition: RangePartition) -> RangePartition:
    """``partition`` as an executor gets it (pickled by the driver)."""
    shipped = pickle.loads(pickle.dumps(partition))
    assert isinstance(shipped, RangePartition)
    return shipped


def _read_all(options: ReaderOptions, partitions: list[RangePartition]) -> list[str]:
    reader = LogbrokerBatchReader(options)
    return [
        line
        for partition in partitions
        for batch in reader.read(_as_shipped(partition))
        for line in batch.column("line").to_pylist()
    ]


def test_a_batch_task_refuses_a_gateway_of_another_installation_than_the_plans(
    gateway: GatewayProcess, late_other: _Late
) -> None:
    """B did not answer the driver's start; the task finds A down and B up: B is refused,
    though it is the first gateway the task reaches (before, the task read B's log at A's
    offsets and returned its lines as A's)."""
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    options = ReaderOptions(
        SourceSpec(server=f"{gateway.url},{late_other.url}", gateway_retry_s=5), topics="dc1.*"
    )
    planned = [
        p for p in LogbrokerBatchReader(options).partitions() if isinstance(p, RangePartition)
    ]
    assert planned
    gateway.kill()

    with pytest.raises(MixedInstallations) as caught:
        _read_all(options, planned)
    assert str(caught.value).startswith(f"{late_other.url} belongs to installation ")
    assert f"{gateway.url} to " in str(caught.value)
    assert not any("/messages" in p for p in late_other.paths), late_other.paths


def test_a_stream_task_refuses_a_gateway_of_another_installation_than_the_plans(
    gateway: GatewayProcess, late_other: _Late
) -> None:
    append_lines(gateway.data_dir, "dc1.app", "a", partitions=1, chunks=2)
    options = ReaderOptions(
        SourceSpec(server=f"{gateway.url},{late_other.url}", gateway_retry_s=5), topics="dc1.*"
    )
    stream = LogbrokerStreamReader(options)
    start = stream.initialOffset()
    end = stream.latestOffset(start, None)  # type: ignore[arg-type]
    planned = [p for p in stream.partitions(start, end) if isinstance(p, RangePartition)]
    assert planned
    gateway.kill()

    with pytest.raises(MixedInstallations, match=f"{late_other.url} belongs to installation "):
        _read_all(options, planned)
    assert not any("/messages" in p for p in late_other.paths), late_other.paths


@pytest.mark.spark
@pytest.mark.slow
def test_gateways_of_one_installation_read_as_one(spark: object, gateway: GatewayProcess) -> None:
    """Two URLs of one gateway are one installation: read as through one."""
    lines = append_lines(gateway.data_dir, "dc1.app", "a", partitions=2, chunks=3)
    reader = spark.read.format("logbroker").option("server", f"{gateway.url},{gateway.url}/")  # type: ignore[attr-defined]
    rows = reader.option("max_range_bytes", "200").load().collect()
    assert sorted(r["line"] for r in rows) == sorted(lines)
