"""``logbroker read --idle-exit``: an answer that moved the reader's position short of the
partition's end is not idle, even when it held no message to print.

A gateway's answer stops at a budget: at most ``MAX_NOT_ENVELOPES`` records that are no
logbroker envelopes (named in ``not_envelopes``), or a scan budget of records that the filter
left out.  Such an answer carries no message, but the position moved and the records after it
are a read away: ``--idle-exit 0`` (read what is there, then exit) must read them.
"""

from __future__ import annotations

import subprocess
from typing import Any

from delivery.partition_reader import MAX_NOT_ENVELOPES, scan_budget_of
from log_store import TopicConfig, open_store
from session_dedup.envelope import Envelope, encode
from tests.conftest import REPO, logbroker_cmd

TOPIC = "dc1.app"
_WANTED = "the line after them\n"


def _envelope(source_id: str, seqno: int, data: bytes) -> bytes:
    return encode(Envelope(source_id, "h", "/f", "app", "raw", seqno, 0, 0, data))


def _fill(gateway: Any, values: list[bytes]) -> None:
    """One partition: ``values`` (appended straight into the store), then the wanted line."""
    store = open_store(gateway.data_dir)
    try:
        store.create_topic(TOPIC, TopicConfig(partitions=1))
        for i in range(0, len(values), 64):
            store.append(TOPIC, 0, values[i : i + 64])
        store.append(TOPIC, 0, [_envelope("wanted", 1, _WANTED.encode())])
    finally:
        store.close()


def _read(gateway: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("read", "--server", gateway.url, "--topic", TOPIC, "--from-beginning", *args),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_idle_exit_reads_on_past_an_answer_of_only_records_that_are_not_envelopes(
    gateway: Any,
) -> None:
    _fill(gateway, [b'{"producer": "someone else"}'] * (MAX_NOT_ENVELOPES + 10))
    done = _read(gateway, "--idle-exit", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == _WANTED, done.stderr[-2000:]
    assert done.stderr.count("not a logbroker envelope") == MAX_NOT_ENVELOPES + 10


def test_idle_exit_reads_on_past_an_answer_whose_records_the_filter_all_left_out(
    gateway: Any,
) -> None:
    # more than one answer's scan budget of another source's chunks
    max_bytes = 64 * 1024
    chunk = b"x" * (1024 * 1024 - 1) + b"\n"
    others = scan_budget_of(max_bytes) // len(chunk) + 2
    _fill(gateway, [_envelope("other", seqno, chunk) for seqno in range(1, others + 1)])
    done = _read(
        gateway, "--idle-exit", "0", "--where", "source_id=wanted", "--max-bytes", str(max_bytes)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == _WANTED, done.stderr[-2000:]
