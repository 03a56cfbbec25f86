"""The parts of a partition outage that need no process: the gateway's answer as the client
reads it, and which chunks may share a section after chunks were given back."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from push_client.config import Entry
from push_client.identity import FileIdentity, read_fingerprint
from push_client.partition_outage import PartitionOutage, PartitionOutages, waits_for
from push_client.tailer import TailedFile
from push_client.transport import PartitionsUnavailable


def _tailed(path: Path, chunk_bytes: int) -> TailedFile:
    fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    tailed = TailedFile(
        entry=Entry(str(path), "app"),
        fd=fd,
        path=str(path),
        first_path=str(path),
        identity=FileIdentity(st.st_dev, st.st_ino, read_fingerprint(fd, final=True) or "e"),
        generation=0,
        source_id="s",
        host="h",
        chunk_bytes=chunk_bytes,
        max_line_bytes=64 * 1024,
    )
    tailed.resume_at(0)
    return tailed


def test_chunks_given_back_while_a_later_request_is_in_flight_are_not_sent_with_those_after_it(
    tmp_path: Path,
) -> None:
    """Before: the chunk given back and the one read after the request still in flight went
    in one section; the gateway wrote both (it checks where a section starts only) and then
    answered the in-flight bytes ``duplicate``: they were lost (found on Kafka, a file whose
    partition came back while its pipelined request was out)."""
    path = tmp_path / "app.log"
    path.write_bytes(b"a" * 99 + b"\n")
    tailed = _tailed(path, chunk_bytes=100)
    tailed.read(100, time.monotonic())
    first = tailed.take(1 << 20)
    with open(path, "ab") as f:
        f.write(b"b" * 99 + b"\n")
    tailed.read(100, time.monotonic())
    second = tailed.take(1 << 20)  # pipelined behind the first
    with open(path, "ab") as f:
        f.write(b"c" * 99 + b"\n")
    tailed.read(100, time.monotonic())
    tailed.finished(first)  # the first failed (a partition without an owner): given back
    tailed.give_back(first)
    assert [(c.start, c.seqno) for c in tailed.pending] == [(0, 100), (200, 300)]
    assert [(c.start, c.seqno) for c in tailed.take(1 << 20)] == [(0, 100)]
    tailed.finished(second)
    tailed.give_back(second)
    assert [(c.start, c.seqno) for c in tailed.take(1 << 20)] == [(100, 200), (200, 300)]
    tailed.close()


def test_a_503_names_the_waiting_sources_or_is_retried_whole() -> None:
    answer = PartitionsUnavailable.from_body(
        {
            "error": "partition_unavailable",
            "reason": "no gateway owns dc1.app/2 right now (none)",
            "partitions": [{"topic": "dc1.app", "partition": 2, "source_ids": ["a", "b"]}],
        }
    )
    assert answer is not None
    assert answer.sources == {"a": ("dc1.app", 2), "b": ("dc1.app", 2)}
    assert answer.affects("a", "dc1.app", 0)  # named: whatever the client thought
    assert not answer.affects("c", "dc1.app", 2)
    # each file is told its own partition's reason, not another's of the same answer
    two = PartitionsUnavailable.from_body(
        {
            "error": "partition_unavailable",
            "reason": "the owner of dc1.app/2 ...; the owner of dc1.app/3 ...",
            "partitions": [
                {"topic": "dc1.app", "partition": 2, "source_ids": ["a"], "reason": "of 2"},
                {"topic": "dc1.app", "partition": 3, "source_ids": ["b"], "reason": "of 3"},
            ],
        }
    )
    assert two is not None and two.reason_for("dc1.app", 3) == "of 3"
    assert answer.reason_for("dc1.app", 2) == answer.reason  # an older gateway's answer
    # a session's answer names the partition only
    partition_only = PartitionsUnavailable.from_body(
        {
            "error": "partition_unavailable",
            "reason": "r",
            "partitions": [{"topic": "t", "partition": 1}],
        }
    )
    assert partition_only is not None and partition_only.affects("x", "t", 1)
    assert not partition_only.affects("x", "t", 0)
    # an older gateway's 503, or a body that names nothing: the request is retried whole
    assert PartitionsUnavailable.from_body({"error": "store_unavailable", "reason": "r"}) is None
    assert PartitionsUnavailable.from_body({"error": "partition_unavailable"}) is None
    assert PartitionsUnavailable.from_body([1, 2]) is None


def test_a_file_waiting_for_the_partition_of_its_pin_is_told_where_its_data_goes() -> None:
    """The gateway names the partition holding a new source's pin with ``"pins": true``; the
    client says that partition holds the file's pin, not that it is the file's partition."""
    answer = PartitionsUnavailable.from_body(
        {
            "error": "partition_unavailable",
            "reason": "the owner of dc1.kr/1 ...",
            "partitions": [
                {"topic": "dc1.kr", "partition": 1, "source_ids": ["a"], "pins": True},
                {"topic": "dc1.kr", "partition": 2, "source_ids": ["b"]},
            ],
        }
    )
    assert answer is not None and answer.pins == {("dc1.kr", 1)}
    assert waits_for("dc1.kr/2", False, "dc1.kr", 2) == "partition dc1.kr/2"
    assert waits_for("dc1.kr/1", True, "dc1.kr", 3) == (
        "partition dc1.kr/1, which holds its pin (its data goes to dc1.kr/3),"
    )
    assert waits_for("dc1.kr/1", True, "dc1.kr", 1) == (
        "partition dc1.kr/1, which holds its pin (its data goes there too),"
    )
    assert waits_for("dc1.kr/1", True, "", -1) == (
        "partition dc1.kr/1, which holds its pin (its data partition is not known yet),"
    )


class _File:
    """What :class:`PartitionOutages` reads of a tailed file."""

    def __init__(self, path: str, partition: int) -> None:
        self.path, self.topic, self.partition = path, "dc1.kr", partition
        self.outage: PartitionOutage | None = None


def test_the_log_says_once_which_partition_a_file_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outages = PartitionOutages(cap_s=5, max_probes=1)
    pinned, own = _File("/l/f0.log", 3), _File("/l/f1.log", 1)
    with caplog.at_level(logging.WARNING, logger="logbroker.push"):
        for _ in range(2):  # said once, not at every answer naming it
            outages.wait(pinned, "i", "dc1.kr", 1, "gone", None, pin=True)  # type: ignore[arg-type]
            outages.wait(own, "i", "dc1.kr", 1, "gone", None)  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "/l/f0.log: partition dc1.kr/1, which holds its pin (its data goes to dc1.kr/3), has no "
        "reachable owner now (gone); this file waits, tried again every 5 s at most (the files "
        "not waiting for it ship on)",
        "/l/f1.log: partition dc1.kr/1 has no reachable owner now (gone); this file waits, "
        "tried again every 5 s at most (the files not waiting for it ship on)",
    ]
    outage = pinned.outage
    assert outage is not None and outage is own.outage and outage.pin_files == {pinned}
    outages.back(pinned)  # type: ignore[arg-type]
    assert pinned.outage is None and own.outage is None and not outage.pin_files
    assert len(outages) == 0
