"""A compressed chunk that does not decompress is bad input: refused with its source, and
nothing of it written, through every write route that takes a codec."""

from __future__ import annotations

import base64
import gzip
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from ingest_api.framing import encode_binary
from session_dedup.chunk_codecs import MAX_DECOMPRESSED_BYTES
from tests.gateway.conftest import end_offsets, meta, topic_envelopes


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _zstd_streamed(data: bytes) -> bytes:
    """A frame without a content size, as a streaming compressor writes it."""
    return zstandard.ZstdCompressor(write_content_size=False).compress(data)


COMPRESS = {"gzip": _gzip, "zstd": _zstd}

BAD_DATA = {
    "not the codec": lambda codec: b"notgzip",
    "truncated": lambda codec: COMPRESS[codec](b"a line\n" * 1000)[:-6],
    "trailing garbage": lambda codec: COMPRESS[codec](b"a line\n") + b"junk",
}


def _post(client: Any, route: str, chunks: list[tuple[str, str, int, bytes]]) -> Any:
    """Write ``(source_id, codec, seqno, data)`` chunks through ``route`` (binary|ndjson)."""
    if route == "binary":
        sections: list[tuple[dict[str, str], list[tuple[int, int, bytes]]]] = []
        for source_id, codec, seqno, data in chunks:
            sections.append((meta(source_id, "corrupt", codec=codec), [(seqno, 0, data)]))
        return client.post_binary(encode_binary(sections))
    lines = [
        orjson.dumps(
            {
                **meta(source_id, "corrupt", codec=codec),
                "seqno": seqno,
                "data_b64": base64.b64encode(data).decode(),
            }
        )
        for source_id, codec, seqno, data in chunks
    ]
    return client.post_ndjson(b"\n".join(lines))


@pytest.mark.parametrize("route", ["binary", "ndjson"])
@pytest.mark.parametrize("codec", ["gzip", "zstd"])
@pytest.mark.parametrize("defect", sorted(BAD_DATA))
def test_a_chunk_that_does_not_decompress_is_400_and_writes_nothing(
    shared_gateway: Any, client_for: Any, route: str, codec: str, defect: str
) -> None:
    client = client_for(shared_gateway.url)
    before = end_offsets(shared_gateway.data_dir)
    good = COMPRESS[codec](b"good line\n")
    bad = BAD_DATA[defect](codec)
    # the bad chunk comes after a good one of the same source: nothing of the source is written
    response = _post(client, route, [("m:1", codec, 4, good), ("m:1", codec, 5, bad)])
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "bad_chunk"
    assert "'m:1'" in body["reason"] and "seqno 5" in body["reason"]
    assert f"{codec} chunk does not decompress" in body["reason"]
    after = end_offsets(shared_gateway.data_dir)
    assert after == before
    assert not any(topic == "dc1.corrupt" for topic, _ in after)  # not even created


@pytest.mark.parametrize("route", ["binary", "ndjson"])
def test_a_corrupt_source_is_refused_on_its_own_and_the_others_are_written(
    start_gateway: Any, client_for: Any, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")
    gateway = start_gateway()
    client = client_for(gateway.url)
    response = _post(
        client,
        route,
        [
            ("good-gz", "gzip", 1, _gzip(b"one\ntwo\n")),
            ("bad", "zstd", 1, b"\x28\xb5\x2f\xfd garbage"),
            ("good-zs", "zstd", 1, _zstd_streamed(b"three\n")),
            ("bad", "zstd", 2, _zstd(b"fine, but its source is refused\n")),
        ],
    )
    assert response.status_code == 200, response.text
    results = {r["source_id"]: r for r in response.json()["results"]}
    assert results["bad"]["status"] == 400 and results["bad"]["error"] == "bad_chunk"
    assert "seqno 1" in results["bad"]["reason"]
    assert [a["status"] for a in results["good-gz"]["acks"]] == ["written"]
    assert [a["status"] for a in results["good-zs"]["acks"]] == ["written"]
    written = {
        env.source_id
        for records in topic_envelopes(gateway.data_dir, "dc1.corrupt").values()
        for _, env in records
    }
    assert written == {"good-gz", "good-zs"}
    # the audit counts the lines of what was written, from the one check's count
    deadline = time.monotonic() + 20
    lines: list[int] = []
    while time.monotonic() < deadline:
        windows = client.http.get("/v1/audit/windows", params={"topic": "dc1.corrupt"}).json()
        lines = [
            w["tiers"]["gateway"]["lines"] for w in windows["windows"] if "gateway" in w["tiers"]
        ]
        if lines:
            break
        time.sleep(0.3)
    assert sum(lines) == 3, windows


def _bomb(codec: str) -> bytes:
    """A small chunk that expands past the limit (here: 4 times the limit of zeros)."""
    size = 4 * MAX_DECOMPRESSED_BYTES
    if codec == "gzip":
        return gzip.compress(bytes(size), compresslevel=9)
    if codec == "zstd-sized":
        return _zstd(bytes(size))
    return _zstd_streamed(bytes(size))


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("route", ["binary", "ndjson"])
@pytest.mark.parametrize("codec", ["gzip", "zstd-sized", "zstd-streamed"])
def test_a_zip_bomb_is_413_and_the_gateway_stays_small(
    shared_gateway: Any, client_for: Any, route: str, codec: str
) -> None:
    client = client_for(shared_gateway.url)
    before = end_offsets(shared_gateway.data_dir)
    bomb = _bomb(codec)
    assert len(bomb) < 1024 * 1024
    assert shared_gateway.proc is not None
    peak_before = _peak_rss_kib(shared_gateway.proc.pid)
    started = time.monotonic()
    response = _post(client, route, [("bomber", codec.split("-")[0], 1, bomb)])
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "chunk_too_large"
    assert f"more than {MAX_DECOMPRESSED_BYTES}" in response.json()["reason"]
    assert time.monotonic() - started < 10
    assert end_offsets(shared_gateway.data_dir) == before
    # 4x the limit never exists in the gateway: it counts lines a block of output at a time
    assert _peak_rss_kib(shared_gateway.proc.pid) - peak_before < MAX_DECOMPRESSED_BYTES // 1024
