"""A write's compressed chunks may decompress to ``max_decompressed_bytes_per_request`` in all:
a request of many small bombs, each under the per-chunk limit, is refused 413 as a whole after
decompressing at most that much, writes nothing, and never holds the gateway's event loop."""

from __future__ import annotations

import base64
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import orjson
import pytest
import zstandard

from ingest_api.codec_check import check_codecs
from ingest_api.errors import ApiError
from ingest_api.framing import encode_binary, parse_binary
from ingest_api.settings import Limits
from session_dedup.chunk_codecs import MAX_DECOMPRESSED_BYTES
from tests.gateway.conftest import end_offsets, meta, topic_envelopes

BUDGET = 4 * 1024 * 1024
"""The small gateway's budget: its tests send a few MiB, not 64 MiB chunks."""


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def _zstd_streamed(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)


COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": _gzip,
    "zstd-sized": _zstd,
    "zstd-streamed": _zstd_streamed,
}


def _lines_of(size: int) -> bytes:
    """``size`` bytes of one long line: what compresses best."""
    return b"a" * (size - 1) + b"\n"


@pytest.fixture(scope="module")
def small_budget_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import GatewayProcess

    base = tmp_path_factory.mktemp("budget-gateway")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LOGBROKER_LIMITS_MAX_DECOMPRESSED_BYTES_PER_REQUEST", str(BUDGET))
        gateway = GatewayProcess(base / "data", [], base / "gateway.log").start()
    yield gateway
    gateway.kill()


class _HealthWatch:
    """``GET /healthz`` over and over while a request is in flight: the slowest answer.

    Started once a first answer came (a connection made), stopped after one more answer than
    had come when the request was answered."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._done = threading.Event()
        self._answered = threading.Condition()
        self.slowest_s = 0.0
        self.answers = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _HealthWatch:
        self._thread.start()
        self._wait_for(1)
        self.slowest_s = 0.0
        self.answers = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self._wait_for(self.answers + 1)
        self._done.set()
        self._thread.join(30)

    def _wait_for(self, answers: int) -> None:
        with self._answered:
            assert self._answered.wait_for(lambda: self.answers >= answers, timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self._url, timeout=60) as http:
            while not self._done.is_set():
                started = time.monotonic()
                assert http.get("/healthz").status_code == 200
                with self._answered:
                    self.slowest_s = max(self.slowest_s, time.monotonic() - started)
                    self.answers += 1
                    self._answered.notify_all()
                self._done.wait(0.02)


def _post(
    url: str, route: str, sections: list[tuple[str, str, list[bytes]]], log_type: str = "bombs"
) -> httpx.Response:
    """Write ``(source_id, codec, datas)`` sections, seqnos from 1, through ``route``."""
    if route == "binary":
        body = encode_binary(
            [
                (meta(source, log_type, codec=codec), [(i + 1, 0, d) for i, d in enumerate(datas)])
                for source, codec, datas in sections
            ]
        )
        media = "application/x-logbroker-chunks"
    else:
        body = b"\n".join(
            orjson.dumps(
                {
                    **meta(source, log_type, codec=codec),
                    "seqno": i + 1,
                    "data_b64": base64.b64encode(d).decode(),
                }
            )
            for source, codec, datas in sections
            for i, d in enumerate(datas)
        )
        media = "application/x-ndjson"
    return httpx.post(url + "/v1/write", content=body, headers={"content-type": media}, timeout=60)


def _assert_refused_quickly(
    gateway: Any, route: str, sections: list[tuple[str, str, list[bytes]]], budget: int
) -> None:
    before = end_offsets(gateway.data_dir)
    with _HealthWatch(gateway.url) as health:
        started = time.monotonic()
        response = _post(gateway.url, route, sections)
        took_s = time.monotonic() - started
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["error"] == "decompressed_too_large"
    assert body["limit"] == "max_decompressed_bytes_per_request" and body["max"] == budget
    assert f"more than {budget} bytes" in body["reason"]
    assert took_s < 10, took_s
    # (the slowest answer is a few ms on an idle machine: the margin is for shared CPUs; the
    # loop was held for 5-25 s by the 84 KB write before the budget)
    assert health.answers >= 1 and health.slowest_s < 1.0, (health.answers, health.slowest_s)
    # nothing of the request, not even its topic
    assert end_offsets(gateway.data_dir) == before
    assert topic_envelopes(gateway.data_dir, "dc1.bombs") == {}


@pytest.mark.parametrize("route", ["binary", "ndjson"])
@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_many_small_bombs_are_refused_413_with_nothing_written_and_healthz_answering(
    small_budget_gateway: Any, route: str, codec: str
) -> None:
    # 40 chunks of 2 MiB each: every one far under the per-chunk limit, 80 MiB in all
    bomb = COMPRESS[codec](_lines_of(2 * 1024 * 1024))
    assert len(bomb) < 8 * 1024
    sections = [("good", codec.split("-")[0], [COMPRESS[codec](b"fine\n")])]
    sections.append(("bomber", codec.split("-")[0], [bomb] * 40))
    _assert_refused_quickly(small_budget_gateway, route, sections, BUDGET)


def test_a_request_up_to_the_budget_is_written_and_one_byte_more_is_refused(
    small_budget_gateway: Any,
) -> None:
    url = small_budget_gateway.url
    half = BUDGET // 2
    # the budget spans sections and codecs: 2 MiB of gzip and 2 MiB of zstd in one request
    at_budget = [
        ("under-gz", "gzip", [_gzip(_lines_of(half // 2))] * 2),
        ("under-zs", "zstd", [_zstd_streamed(b"x\n" * (half // 2))]),
    ]
    response = _post(url, "binary", at_budget)
    assert response.status_code == 200, response.text
    acks = {r["source_id"]: [a["status"] for a in r["acks"]] for r in response.json()["results"]}
    assert acks == {"under-gz": ["written", "written"], "under-zs": ["written"]}
    written = topic_envelopes(small_budget_gateway.data_dir, "dc1.bombs")
    assert sum(len(records) for records in written.values()) == 3

    before = end_offsets(small_budget_gateway.data_dir)
    over = [
        ("over-gz", "gzip", [_gzip(_lines_of(half // 2))] * 2),
        ("over-zs", "zstd", [_zstd(b"x\n" * (half // 2) + b"\n")]),
    ]
    response = _post(url, "binary", over)
    assert response.status_code == 413, response.text
    assert response.json()["error"] == "decompressed_too_large"
    assert end_offsets(small_budget_gateway.data_dir) == before


def test_the_per_chunk_limit_is_unchanged_within_the_default_budget(
    shared_gateway: Any,
) -> None:
    # a chunk of exactly 64 MiB is written; one that declares a byte more is refused with its
    # source alone (chunk_too_large), as before the budget, and the request answers 200
    response = _post(
        shared_gateway.url,
        "binary",
        [
            ("at-limit", "zstd", [_zstd(_lines_of(MAX_DECOMPRESSED_BYTES))]),
            ("too-big", "zstd", [_zstd(bytes(MAX_DECOMPRESSED_BYTES + 1))]),
        ],
        log_type="per-chunk",
    )
    assert response.status_code == 200, response.text
    results = {r["source_id"]: r for r in response.json()["results"]}
    assert results["too-big"]["status"] == 413
    assert results["too-big"]["error"] == "chunk_too_large"
    assert f"more than {MAX_DECOMPRESSED_BYTES}" in results["too-big"]["reason"]
    assert [a["status"] for a in results["at-limit"]["acks"]] == ["written"]
    written = topic_envelopes(shared_gateway.data_dir, "dc1.per-chunk")
    assert [env.source_id for records in written.values() for _, env in records] == ["at-limit"]


def test_the_reviewed_84_kb_write_of_64_mib_chunks_is_refused_at_the_default_budget(
    shared_gateway: Any,
) -> None:
    """40 zstd frames of 64 MiB of ``a`` each (2 KiB apiece): 25 s of the event loop, and
    written, before a request had a budget."""
    frame = _zstd(_lines_of(MAX_DECOMPRESSED_BYTES))
    assert len(frame) < 4096
    default_budget = 128 * 1024 * 1024
    _assert_refused_quickly(shared_gateway, "binary", [("r", "zstd", [frame] * 40)], default_budget)


def test_gzip_bombs_under_the_inline_size_are_checked_off_the_event_loop(
    shared_gateway: Any,
) -> None:
    """Three gzip chunks of 64 MiB each are 190 KiB: checked inline by their compressed size
    they held the loop for a second or more; now the budget's 128 MiB are decompressed in a
    thread and /healthz keeps answering."""
    bomb = _gzip(_lines_of(MAX_DECOMPRESSED_BYTES))
    assert 3 * len(bomb) < 256 * 1024
    default_budget = 128 * 1024 * 1024
    _assert_refused_quickly(shared_gateway, "binary", [("g", "gzip", [bomb] * 3)], default_budget)


def test_a_check_that_leaves_the_event_loop_keeps_every_chunks_line_count() -> None:
    """The check stops on the loop after 256 KiB of output and goes on in a thread from the
    chunk it stopped at: every line count (kept for the audit) is there, none twice."""
    chunks = [b"x\n" * (300 * 1024), b"y\n" * 7, b"z\n" * (600 * 1024), b"w\n" * 3]
    body = encode_binary(
        [
            (meta("a", codec="gzip"), [(1, 0, _gzip(chunks[0])), (2, 0, _gzip(chunks[1]))]),
            (meta("b", codec="zstd"), [(1, 0, _zstd(chunks[2])), (2, 0, _zstd(chunks[3]))]),
            (meta("c", codec="gzip"), [(1, 0, b"not gzip")]),
        ]
    )
    sections = parse_binary(body, Limits())
    anyio.run(check_codecs, sections, sum(map(len, chunks)))
    assert sections[0].batch.lines == [300 * 1024, 7]
    assert sections[1].batch.lines == [600 * 1024, 3]
    assert sections[2].error is not None and sections[2].error.error == "bad_chunk"
    # one byte less of budget: the request is refused
    sections = parse_binary(body, Limits())
    with pytest.raises(ApiError, match="more than") as refused:
        anyio.run(check_codecs, sections, sum(map(len, chunks)) - 1)
    assert (refused.value.status, refused.value.error) == (413, "decompressed_too_large")
