"""``/metrics`` of a gateway with several uvicorn workers shows the sum over all of them.

Writes arrive on fresh connections, so the kernel spreads them over the workers; every scrape,
whichever worker answers it, must show what was written in total, never less than the scrape
before, also after a worker is SIGKILLed and uvicorn starts another.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from tests.gateway.conftest import meta
from tests.metrics_text import samples

pytestmark = pytest.mark.slow

TOPIC = "dc1.app"
CHUNKS_PER_REQUEST = 5


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _metrics_dir(gateway_pid: int) -> Path:
    """The run's multiprocess directory, as the workers were started with it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in _children(gateway_pid):
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for entry in environ:
                if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
                    return Path(entry.split(b"=", 1)[1].decode())
        time.sleep(0.1)
    raise AssertionError("no worker names a PROMETHEUS_MULTIPROC_DIR")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _worker_pids(directory: Path) -> set[int]:
    return {int(path.stem.rsplit("_", 1)[1]) for path in directory.glob("*.db")}


def _written_per_worker(directory: Path) -> dict[int, float]:
    """Chunks each worker (by pid) counted as written, read from its own file."""
    counted: dict[int, float] = {}
    for path in directory.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for metric in MultiProcessCollector.merge([str(path)]):
            for s in metric.samples:
                if s.name == "logbroker_chunks_total" and s.labels.get("status") == "written":
                    counted[pid] = counted.get(pid, 0.0) + s.value
    return counted


class _Writer:
    """Writes on a fresh connection each time and keeps the totals the gateway acked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.chunks = 0
        self.bytes = 0
        self.requests = 0

    def write(self) -> None:
        source = f"spread-{self.requests}"
        chunks = [
            (s, 0, f"line {s} of {source}\n".encode()) for s in range(1, 1 + CHUNKS_PER_REQUEST)
        ]
        body = encode_binary([(meta(source), chunks)])
        response = httpx.post(
            f"{self.url}/v1/write",
            content=body,
            headers={"content-type": BINARY_MEDIA_TYPE, "connection": "close"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert [a["status"] for a in response.json()["results"][0]["acks"]] == ["written"] * len(
            chunks
        )
        self.requests += 1
        self.chunks += len(chunks)
        self.bytes += sum(len(c[2]) for c in chunks)


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = httpx.get(f"{url}/metrics", headers={"connection": "close"}, timeout=30)
    assert response.status_code == 200
    return samples(response.text)


def _monotonic_samples(scrape: dict[Any, float]) -> dict[Any, float]:
    """The samples that may only grow: counters and histograms' buckets, counts and sums."""
    return {
        key: value
        for key, value in scrape.items()
        if key[0].endswith(("_total", "_bucket", "_count", "_sum"))
    }


def _assert_not_backwards(before: dict[Any, float], after: dict[Any, float]) -> None:
    for key, value in _monotonic_samples(before).items():
        assert after.get(key, 0.0) >= value, f"{key} went back from {value} to {after.get(key)}"


def _assert_totals(scrape: dict[Any, float], writer: _Writer) -> None:
    written = scrape.get(
        ("logbroker_chunks_total", frozenset({("topic", TOPIC), ("status", "written")}))
    )
    data = scrape.get(("logbroker_written_bytes_total", frozenset({("topic", TOPIC)})))
    assert (written, data) == (writer.chunks, writer.bytes)


def test_every_scrape_sums_all_workers_and_never_goes_backwards(start_gateway: Any) -> None:
    gateway = start_gateway(None, "--workers", "2")
    assert gateway.proc is not None
    directory = _metrics_dir(gateway.proc.pid)
    writer = _Writer(gateway.url)
    previous = _scrape(gateway.url)

    # write until both workers have counted some (the kernel decides who accepts), at least 40
    deadline = time.monotonic() + 120
    while writer.requests < 40 or len(_written_per_worker(directory)) < 2:
        assert time.monotonic() < deadline, (
            f"writes never reached both workers: {_written_per_worker(directory)}"
        )
        writer.write()
        if writer.requests % 5 == 0:
            current = _scrape(gateway.url)
            _assert_not_backwards(previous, current)
            previous = current
    per_worker = _written_per_worker(directory)
    assert sum(per_worker.values()) == writer.chunks and min(per_worker.values()) > 0
    for _ in range(6):  # several scrapes, answered by either worker: all show the same sums
        current = _scrape(gateway.url)
        _assert_totals(current, writer)
        _assert_not_backwards(previous, current)
        previous = current

    # a worker dies without a word: what it counted stays, its live gauges go
    victim = max(per_worker)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not [p for p in _worker_pids(directory) - set(per_worker) if _alive(p)]:
        assert time.monotonic() < deadline, "uvicorn did not replace the killed worker"
        time.sleep(0.1)
    for _ in range(10):
        writer.write()
    for _ in range(6):
        current = _scrape(gateway.url)
        _assert_totals(current, writer)
        _assert_not_backwards(previous, current)
        previous = current
    assert not list(directory.glob(f"gauge_live*_{victim}.db"))
    assert directory.exists()
    assert gateway.stop() == 0
    assert not directory.exists(), "logbroker serve leaves its metrics directory behind"


@pytest.mark.fault
def test_a_killed_gateways_metrics_directory_is_removed_by_the_next_start(
    start_gateway: Any, tmp_path: Path
) -> None:
    killed = start_gateway(tmp_path / "killed", "--workers", "2")
    assert killed.proc is not None
    directory = _metrics_dir(killed.proc.pid)
    killed.kill()  # SIGKILL of the whole group: nobody removes the directory
    assert directory.exists()
    start_gateway(tmp_path / "next", "--workers", "2")
    assert not directory.exists()
