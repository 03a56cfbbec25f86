"""A chunk already in a log that does not decompress (written before gateways checked codecs,
or mirrored) is skipped by readers with a warning; it stops no reader and no group."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx
import pytest

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
