"""A chunk already in a log that does not decompress (written before gateways checked codecs,
or mirrored) is skipped by readers with a warning; it stops no reader and no group.  So is a
record that is not an envelope at all (another producer's, in a Kafka topic): the pull API
names it in the answer (``not_envelopes``), and readers warn naming its offset."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx
import pytest

from delivery.framing import BINARY_MEDIA_TYPE, decode_binary
from delivery.partition_reader import MAX_NOT_ENVELOPES
from delivery.pull_client import PullClient, RequestRefused
from log_store import open_store
from log_store.errors import BadRequest
from session_dedup.envelope import Envelope, encode
from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import line_for, zstd_compress

TOPIC = "dc1.app"


def _append(gateway: Any, partition: int, codec: str, data: bytes, seqno: int) -> int:
    """Append one chunk straight into the embedded store, past the gateway's checks."""
    store = open_store(gateway.data_dir)
    try:
        store.create_topic(TOPIC, exist_ok=True)
        env = Envelope("direct", "h", "/f", "app", codec, seqno, 0, 0, data)
        return store.append(TOPIC, partition, [encode(env)]).first_offset
    finally:
        store.close()


def _append_foreign(gateway: Any, partition: int, values: list[bytes]) -> list[int]:
    """Append records that are not envelopes straight into the embedded store, as another
    producer writing into a Kafka topic would; their offsets."""
    store = open_store(gateway.data_dir)
    try:
        store.create_topic(TOPIC, exist_ok=True)
        first = store.append(TOPIC, partition, values).first_offset
        return list(range(first, first + len(values)))
    finally:
        store.close()


_NO_ENVELOPE = b'{"producer": "someone else"}'
_SHORT_ENVELOPE = b"\x01\x02 not an envelope either"  # passes the version byte check
_CUT_ENVELOPE = encode(Envelope("s", "h", "/f", "app", "raw", 9, 0, 0, b"cut\n"))[:-2]
"""Cut short in its data: its head reads as a chunk's, so an unfiltered read, which looks at
a record's head only, sends it; a reader finds that it does not decode."""


@pytest.fixture
def log_with_foreign_records(gateway: Any) -> dict[str, Any]:
    """Partition 0 of dc1.app: a good line, three records that are no envelopes, a good line."""
    first = _append(gateway, 0, "raw", line_for("direct", 1).encode(), 1)
    foreign = _append_foreign(gateway, 0, [_NO_ENVELOPE, _SHORT_ENVELOPE, _CUT_ENVELOPE])
    last = _append(gateway, 0, "raw", line_for("direct", 2).encode(), 2)
    return {"good": [first, last], "foreign": foreign, "end": last + 1}


def test_a_pull_read_names_each_record_it_left_out_because_it_is_not_an_envelope(
    gateway: Any, log_with_foreign_records: dict[str, Any]
) -> None:
    """In JSON and in the binary framing, of one partition and of a fetch, filtered or not;
    a raw read leaves nothing out and names nothing."""
    no_envelope, short, cut = log_with_foreign_records["foreign"]
    good = log_with_foreign_records["good"]
    url = f"{gateway.url}/v1/topics/{TOPIC}/partitions/0/messages"
    named = [
        {"offset": no_envelope, "reason": "unknown envelope version byte"},
        {"offset": short, "reason": "truncated envelope"},
    ]

    as_json = httpx.get(url, params={"offset": 0}).json()
    assert as_json["not_envelopes"] == named
    # the one whose head reads as a chunk's is sent, and does not decode
    assert [m["offset"] for m in as_json["messages"]] == [good[0], cut, good[1]]
    assert as_json["messages"][1]["kind"] == "unknown"
    assert as_json["next_offset"] == log_with_foreign_records["end"]

    binary = httpx.get(url, params={"offset": 0}, headers={"Accept": BINARY_MEDIA_TYPE})
    (section,) = decode_binary(binary.content)
    assert section.meta["not_envelopes"] == named
    assert [o for o, _ in section.records] == [good[0], cut, good[1]]

    filtered = httpx.get(url, params={"offset": 0, "server": "h"}).json()
    # a filter looks at every field, so the cut one is parsed whole and named too
    assert [n["offset"] for n in filtered["not_envelopes"]] == [no_envelope, short, cut]
    assert filtered["not_envelopes"][2]["reason"] == (
        "data length does not match the envelope's size"
    )
    assert [m["offset"] for m in filtered["messages"]] == good

    positions = {"partitions": [{"topic": TOPIC, "partition": 0, "offset": 0}]}
    fetched = httpx.post(f"{gateway.url}/v1/fetch", json=positions).json()
    assert fetched["partitions"][0]["not_envelopes"] == named
    fetched_binary = httpx.post(
        f"{gateway.url}/v1/fetch", json={**positions, "format": "binary"}
    ).content
    assert decode_binary(fetched_binary)[0].meta["not_envelopes"] == named

    raw = httpx.get(url, params={"offset": 0, "raw": 1}).json()
    assert raw["not_envelopes"] == []
    assert [m["kind"] for m in raw["messages"][1:4]] == ["unknown"] * 3

    # the client library names all three, the one it could not decode included
    client = PullClient(gateway.url)
    try:
        (part,) = client.fetch([(TOPIC, 0, 0)])
    finally:
        client.close()
    assert [m.offset for m in part.messages] == good
    assert [(n.offset, n.reason) for n in part.not_envelopes] == [
        (no_envelope, "unknown envelope version byte"),
        (short, "truncated envelope"),
        (cut, "data length does not match the envelope's size"),
    ]


def test_a_long_poll_answers_at_once_naming_a_record_that_is_not_an_envelope(
    gateway: Any,
) -> None:
    """A long-poll that found only such a record answers with it rather than wait on past it
    (its answer would then move the reader past it without naming it)."""
    _append(gateway, 0, "raw", line_for("direct", 1).encode(), 1)
    (foreign,) = _append_foreign(gateway, 0, [_NO_ENVELOPE])
    url = f"{gateway.url}/v1/topics/{TOPIC}/partitions/0/messages"
    for _ in range(2):  # the second answer may be one read ahead: it names it too
        started = time.monotonic()
        answer = httpx.get(url, params={"offset": foreign, "wait_ms": 20_000}, timeout=30).json()
        assert time.monotonic() - started < 10
        assert answer["messages"] == []
        assert [n["offset"] for n in answer["not_envelopes"]] == [foreign]
        assert answer["next_offset"] == foreign + 1
    started = time.monotonic()
    fetched = httpx.post(
        f"{gateway.url}/v1/fetch",
        json={"partitions": [{"topic": TOPIC, "partition": 0, "offset": 0}], "wait_ms": 20_000},
        timeout=30,
    ).json()
    assert time.monotonic() - started < 10
    assert [n["offset"] for n in fetched["partitions"][0]["not_envelopes"]] == [foreign]


def test_an_answer_names_a_bounded_number_of_records_and_the_next_names_the_rest(
    gateway: Any,
) -> None:
    """A partition full of another producer's records: each answer names at most
    MAX_NOT_ENVELOPES and ends just past the last it names, so nothing is passed unnamed."""
    count = MAX_NOT_ENVELOPES + 44
    foreign = _append_foreign(gateway, 0, [b"x%d" % i for i in range(count)])
    last = _append(gateway, 0, "raw", line_for("direct", 1).encode(), 1)
    client = PullClient(gateway.url)
    try:
        (first,) = client.fetch([(TOPIC, 0, 0)])
        assert [n.offset for n in first.not_envelopes] == foreign[:MAX_NOT_ENVELOPES]
        assert first.messages == [] and first.next_offset == foreign[MAX_NOT_ENVELOPES]
        (second,) = client.fetch([(TOPIC, 0, first.next_offset)])
        assert [n.offset for n in second.not_envelopes] == foreign[MAX_NOT_ENVELOPES:]
        assert [m.offset for m in second.messages] == [last]
    finally:
        client.close()


def _assert_named_foreign(stderr: str, offsets: list[int]) -> None:
    assert "Traceback" not in stderr, stderr
    for offset in offsets:
        assert (
            f"logbroker read: skipping a record that is not a logbroker envelope: {TOPIC}/0 "
            f"offset {offset}: "
        ) in stderr, stderr


@pytest.mark.parametrize("fmt", ["lines", "jsonl"])
def test_a_reader_skips_a_record_that_is_not_an_envelope_naming_its_offset(
    gateway: Any, log_with_foreign_records: dict[str, Any], fmt: str
) -> None:
    done = _read(gateway, "--from-beginning", "--format", fmt)
    assert done.returncode == 0, done.stderr
    _assert_named_foreign(done.stderr, log_with_foreign_records["foreign"])
    assert line_for("direct", 1).strip() in done.stdout
    assert line_for("direct", 2).strip() in done.stdout
    assert "someone else" not in done.stdout


def test_a_group_reader_names_a_record_that_is_not_an_envelope_and_commits_past_it(
    gateway: Any, log_with_foreign_records: dict[str, Any]
) -> None:
    done = _read(gateway, "--from-beginning", "--group", "g-foreign")
    assert done.returncode == 0, done.stderr
    _assert_named_foreign(done.stderr, log_with_foreign_records["foreign"])
    assert line_for("direct", 2).strip() in done.stdout
    group = httpx.get(f"{gateway.url}/v1/groups/g-foreign").json()
    committed = {p["partition"]: p["committed"] for p in group["partitions"]}
    assert committed[0] == log_with_foreign_records["end"]
    again = _read(gateway, "--from-beginning", "--group", "g-foreign")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "" and "envelope" not in again.stderr


@pytest.fixture
def log_with_corrupt_chunks(gateway: Any) -> dict[str, Any]:
    """Partition 0 of dc1.app: a good line, a bad gzip chunk, a bad zstd chunk, a good zstd
    chunk; the offsets of the bad ones."""
    _append(gateway, 0, "raw", line_for("direct", 1).encode(), 1)
    bad_gzip = _append(gateway, 0, "gzip", b"notgzip", 2)
    bad_zstd = _append(gateway, 0, "zstd", zstd_compress(b"cut short\n" * 100)[:-7], 3)
    _append(gateway, 0, "zstd", zstd_compress(line_for("direct", 4).encode()), 4)
    return {"bad": [bad_gzip, bad_zstd], "end": bad_zstd + 2}


def _read(gateway: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("read", "--server", gateway.url, "--topic", TOPIC, "--idle-exit", "2", *args),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def _assert_warned(stderr: str, offsets: list[int]) -> None:
    assert "Traceback" not in stderr, stderr
    for offset, codec in zip(offsets, ["gzip", "zstd"], strict=True):
        assert f"{TOPIC}/0 offset {offset}: {codec} chunk does not decompress" in stderr, stderr


@pytest.mark.parametrize("fmt", ["lines", "jsonl", "jsonl-chunks"])
def test_a_reader_skips_a_corrupt_chunk_with_a_warning_and_goes_on(
    gateway: Any, log_with_corrupt_chunks: dict[str, Any], fmt: str
) -> None:
    done = _read(gateway, "--from-beginning", "--format", fmt)
    assert done.returncode == 0, done.stderr
    _assert_warned(done.stderr, log_with_corrupt_chunks["bad"])
    assert line_for("direct", 1).strip() in done.stdout
    assert line_for("direct", 4).strip() in done.stdout
    assert "cut short" not in done.stdout and "notgzip" not in done.stdout


def test_a_group_reader_gets_past_a_corrupt_chunk_and_commits_past_it(
    gateway: Any, log_with_corrupt_chunks: dict[str, Any]
) -> None:
    done = _read(gateway, "--from-beginning", "--group", "g-corrupt", "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    _assert_warned(done.stderr, log_with_corrupt_chunks["bad"])
    assert line_for("direct", 4).strip() in done.stdout
    group = httpx.get(f"{gateway.url}/v1/groups/g-corrupt").json()
    committed = {p["partition"]: p["committed"] for p in group["partitions"]}
    assert committed[0] == log_with_corrupt_chunks["end"]
    # the next member starts past it: nothing printed, nothing to warn about
    again = _read(gateway, "--from-beginning", "--group", "g-corrupt")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "" and "corrupt" not in again.stderr


@pytest.mark.parametrize("group", ["a/b", "a?b", "a#b", "", "-x", "a" * 201])
def test_read_refuses_a_group_name_the_gateway_would_refuse(gateway: Any, group: str) -> None:
    done = _read(gateway, f"--group={group}")
    assert done.returncode == 2
    assert f"--group {group!r}: group name must be 1-200 characters" in done.stderr
    assert "Traceback" not in done.stderr


def test_pull_client_puts_names_into_urls_as_one_path_part(gateway: Any) -> None:
    client = PullClient(gateway.url)
    try:
        with pytest.raises(BadRequest, match="group name"):
            client.describe_group("g/members")
        with pytest.raises(BadRequest, match="group name"):
            client.join("a?b", topics=[TOPIC])
        # a topic name with '?' is the gateway's to refuse, not a query string
        with pytest.raises(RequestRefused) as refused:
            client.describe("dc1.app?x=1")
        assert refused.value.status == 400
        assert "dc1.app?x=1" in refused.value.reason
    finally:
        client.close()
