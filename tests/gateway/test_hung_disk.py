"""A data disk that hangs (``fsfreeze -f``, a dead volume): writes neither succeed nor fail.
``/readyz`` must say so and ``/metrics`` must still answer.

A frozen file system needs a loop-mounted ext4 and minutes of a real gateway; these tests hang
the disk's one durable sync (``os.fdatasync``) or a store read in-process instead, with the
store, the readiness look and the metrics registry the gateway uses.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ingest_api.admin_api import _Readiness
from ingest_api.metrics import MetricsRegistry
from ingest_api.store_gauges import register_store_gauges
from log_store.errors import StoreUnavailable
from log_store.interface import TopicConfig
from log_store.sqlite_store import SqliteLogStore


class _Hang:
    """Blocks each caller until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def wait(self) -> None:
        self.calls += 1
        self.entered.set()
        assert self.released.wait(30), "never released"


def _write_stuck_on_the_disk(
    store: SqliteLogStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[_Hang, threading.Thread]:
    """A write to dc1.app/0 hung in its durable sync (until ``hang.released``): the hang and
    the writer's thread."""
    hang = _Hang()
    real_fdatasync = os.fdatasync

    def stuck_fdatasync(fd: int) -> None:
        hang.wait()
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", stuck_fdatasync)
    writer = threading.Thread(target=store.append, args=("dc1.app", 0, [b"stuck"]))
    writer.start()
    assert hang.entered.wait(10)
    return hang, writer


def test_a_write_stuck_on_the_disk_makes_the_store_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteLogStore(tmp_path / "data", stall_after_s=0.3)
    store.create_topic("dc1.app")
    store.append("dc1.app", 0, [b"before"])
    assert store.readiness() is None

    hang, writer = _write_stuck_on_the_disk(store, monkeypatch)
    assert store.readiness() is None, "not ready before stall_after_s"
    time.sleep(0.4)
    reason = store.readiness()
    assert reason is not None
    assert reason.startswith(
        "a store operation (a group commit) has been waiting on the data directory's disk for"
    )

    hang.released.set()
    writer.join(10)
    assert store.readiness() is None
    assert store.end_offset("dc1.app", 0) == 2
    store.close()


def test_writes_behind_a_write_stuck_on_the_disk_are_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: they queued behind the stuck one (a client waited as long as the disk hung,
    with no answer to fail over on); now they get ``StoreUnavailable`` (503, Retry-After)."""
    store = SqliteLogStore(tmp_path / "data", stall_after_s=0.3)
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    hang, writer = _write_stuck_on_the_disk(store, monkeypatch)
    time.sleep(0.4)
    for write in (
        lambda: store.append("dc1.app", 1, [b"next"]),
        lambda: store.submit("dc1.app", 0, lambda _state: [b"queued"]),
        lambda: store.create_topic("dc1.other"),
    ):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="waiting on the data directory's disk"):
            write()
        assert time.monotonic() - started < 1.0
    assert hang.calls == 1, "a refused write touched the disk"

    hang.released.set()
    writer.join(10)
    monkeypatch.undo()  # the real durable sync again
    store.append("dc1.app", 1, [b"after"])
    assert (store.end_offset("dc1.app", 0), store.end_offset("dc1.app", 1)) == (1, 1)
    store.close()


def test_readyz_says_not_ready_when_the_readiness_look_itself_hangs() -> None:
    hang = _Hang()

    def readiness() -> str | None:
        hang.wait()
        return None

    looks = _Readiness(SimpleNamespace(store=SimpleNamespace(readiness=readiness)), 0.2)  # type: ignore[arg-type]

    async def look_twice() -> list[str | None]:
        first = await looks.look()
        await asyncio.sleep(1.05)  # past the cached answer
        return [first, await looks.look()]

    started = time.monotonic()
    answers = asyncio.run(look_twice())
    assert time.monotonic() - started < 3
    assert answers == ["the store did not answer within 0.2 s (its disk may hang)"] * 2
    assert hang.calls == 1, "a stuck look was started again"
    hang.released.set()


def test_metrics_answer_while_a_store_read_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteLogStore(tmp_path / "data")
    store.create_topic("dc1.app")
    store.append("dc1.app", 0, [b"x"])
    registry = MetricsRegistry()
    register_store_gauges(registry, store, tmp_path / "data", read_timeout_s=0.3)
    assert b'logbroker_partition_end_offset{partition="0",topic="dc1.app"} 1.0' in (
        registry.render()
    )

    hang = _Hang()
    real_describe = store.describe_topic

    def stuck_describe(name: str) -> Any:
        hang.wait()
        return real_describe(name)

    monkeypatch.setattr(store, "describe_topic", stuck_describe)
    time.sleep(1.1)  # past the shared snapshot of the topics
    for _ in range(2):
        started = time.monotonic()
        text = registry.render()
        assert time.monotonic() - started < 2.0  # one read waited for, not one per gauge
        assert b"logbroker_partition_end_offset{" not in text  # left out, not stale
        assert b"logbroker_disk_free_bytes" in text  # what needs no stuck read still answers
    assert hang.calls == 1, "a stuck read was started again"

    hang.released.set()
    deadline = time.monotonic() + 5
    while b"logbroker_partition_end_offset{" not in registry.render():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    store.close()
