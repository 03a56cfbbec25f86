"""A following ``logbroker read`` of a topic deleted and made again, with fewer partitions or
more: it reads the new topic from its start, forgets the partitions only the old one had, and
the other topics it follows are printed all along.

The readers are stopped (SIGSTOP) while the topic goes and comes back, so that their next read
names the old topic's positions, as a reader that was busy printing (or whose long-poll
answered just before the deletion) does.  Once, such a reader named a partition only the old
topic had in every fetch for ever, and the gateway refused each whole fetch: it printed no
topic at all any more.
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from delivery.consumer import Consumer
from delivery.pull_client import RequestRefused
from tests.delivery.conftest import ReaderProcess, Writer, wait_until

_SOURCES = 4  # sources of each log type
Key = tuple[str, str, int]  # topic, source, seqno


def _write_round(writer: Writer, log_type: str, prefix: str, seqno: int) -> set[Key]:
    """One chunk of each of ``_SOURCES`` sources of ``log_type``; what it wrote."""
    for s in range(_SOURCES):
        writer.write(f"{prefix}{s}", [seqno], log_type=log_type)
    return {(f"dc1.{log_type}", f"{prefix}{s}", seqno) for s in range(_SOURCES)}


def _printed(reader: ReaderProcess) -> Counter[Key]:
    return Counter((r["topic"], r["source_id"], r["seqno"]) for r in reader.records())


def _wait_for(reader: ReaderProcess, keys: set[Key], what: str) -> None:
    try:
        wait_until(lambda: set(_printed(reader)) >= keys, 30, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the reader said: {reader.stderr()[-3000:]}") from None


def _recreate_under_readers(
    gateway: Any, writer_for: Any, start_reader: Any, old: int, readers: dict[str, list[str]]
) -> dict[str, tuple[ReaderProcess, Counter[Key]]]:
    """``dc1.ops`` made with ``old`` partitions and written with ``dc1.app``, followed by
    ``readers`` (name: their topic flags), deleted while they are stopped and made again by
    the next write with the gateway's default partitions; both topics written on.  Each
    reader, with the lines it should have printed (each once)."""
    admin = httpx.Client(base_url=gateway.url, timeout=30.0)
    writer = writer_for(gateway.url)
    made = admin.post("/v1/topics", json={"name": "dc1.ops", "partitions": old})
    assert made.status_code == 201, made.text
    written: set[Key] = set()
    for seqno in (1, 2, 3):
        written |= _write_round(writer, "app", "app", seqno)
        written |= _write_round(writer, "ops", "old", seqno)
    reading = ("--server", gateway.url, "--format", "jsonl", "--from-beginning")
    started = {name: start_reader(*reading, *flags) for name, flags in readers.items()}

    def wanted(name: str) -> set[Key]:
        return {k for k in written if name != "one" or k[0] == "dc1.ops"}

    for name, reader in started.items():
        _wait_for(reader, wanted(name), f"{name}: the lines before the deletion")
        reader.proc.send_signal(signal.SIGSTOP)
    try:
        deleted = admin.delete("/v1/topics/dc1.ops")
        assert deleted.status_code == 200, deleted.text
        written |= _write_round(writer, "ops", "new", 1)  # makes it again
        written |= _write_round(writer, "app", "app", 4)
    finally:
        for reader in started.values():
            reader.proc.send_signal(signal.SIGCONT)
    for seqno in (2, 3, 4):
        written |= _write_round(writer, "ops", "new", seqno)
        written |= _write_round(writer, "app", "app", seqno + 3)
        time.sleep(0.2)
    for name, reader in started.items():
        _wait_for(reader, wanted(name), f"{name}: every line written after the deletion")
    time.sleep(0.5)  # a line printed twice shows by now
    admin.close()
    return {name: (reader, Counter(wanted(name))) for name, reader in started.items()}


def test_readers_follow_a_topic_made_again_with_fewer_partitions(
    start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    gateway = start_gateway(None, "--partitions", "2")
    readers = {
        "prefix": ["--topic", "dc1.*"],
        "one": ["--topic", "dc1.ops"],
        "group": ["--topic", "dc1.*", "--group", "g1"],
    }
    outcome = _recreate_under_readers(gateway, writer_for, start_reader, 6, readers)
    assert len(httpx.get(f"{gateway.url}/v1/topics/dc1.ops").json()["partitions"]) == 2
    for name, (reader, expected) in outcome.items():
        err = reader.stderr()
        assert _printed(reader) == expected, (name, err[-3000:])
        assert "dc1.ops was created again; reading it from its start" in err, (name, err)
        assert err.count("created again") == 1, (name, err)  # once, not once per partition
        assert err.count("looking at the topics again") <= 1, (name, err[-3000:])


def test_a_reader_of_a_prefix_follows_a_topic_made_again_with_more_partitions(
    start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    gateway = start_gateway(None, "--partitions", "4")
    outcome = _recreate_under_readers(
        gateway, writer_for, start_reader, 1, {"prefix": ["--topic", "dc1.*"]}
    )
    reader, expected = outcome["prefix"]
    assert _printed(reader) == expected, reader.stderr()[-3000:]
    assert "dc1.ops was created again; reading it from its start" in reader.stderr()
    assert reader.stderr().count("created again") == 1, reader.stderr()


class _RefusingClient:
    """A stand-in gateway whose commits are refused as the topic was made anew meanwhile."""

    def commit(self, *args: Any, **kwargs: Any) -> None:
        raise RequestRefused(
            409,
            "topic_recreated",
            "dc1.ops's topic id is new, not old: either the topic was deleted and created "
            "again since these offsets were read (heartbeat to get the new topic's positions), "
            "or the id is wrong",
            {},
        )


def test_a_commit_refused_for_a_topic_made_again_is_not_said_as_a_rebalance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A group reader's commit that raced the topic's deletion and making again is refused;
    the reader then learns the new topic from the group and says once that it was created
    again.  The refusal itself must not be said as a second "created again" (the gateway's
    reason has those words) nor as a rebalance, which it was not."""
    consumer = Consumer(_RefusingClient(), topics=["dc1.ops"], group="g1")  # type: ignore[arg-type]
    consumer._positions[("dc1.ops", 0)] = 5
    with caplog.at_level(logging.WARNING, logger="delivery.consumer"):
        consumer.commit()
    assert caplog.records == [], [r.getMessage() for r in caplog.records]
    consumer.close()
