"""A chunk in the log that does not decompress stops a load's range read, naming its offset:
a load that left it out would be complete and never be done again.  With ``skip_corrupt`` it
is left out and named, for the load to record as lost."""

from __future__ import annotations

import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.framing import BINARY_MEDIA_TYPE, MAGIC, decode_binary
from log_store import open_store
from session_dedup.chunk_codecs import CorruptChunk
from session_dedup.envelope import Envelope, encode
from yt_loader.errors import DataLost, SourceUnavailable
from yt_loader.load_job import LoadFailed, _task_failure
from yt_loader.log_source import HttpLogSource, LogSource, StoreLogSource
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_reader import RangeReadStats, read_range


def test_a_range_with_a_corrupt_chunk_fails_naming_its_offset(tmp_path: Path) -> None:
    store = open_store(tmp_path / "data")
    try:
        store.create_topic("dc1.app", exist_ok=True)
        values = [
            encode(Envelope("s", "h", "/f", "app", "raw", 1, 0, 0, b"good\n")),
            encode(Envelope("s", "h", "/f", "app", "gzip", 2, 0, 0, b"notgzip")),
        ]
        store.append("dc1.app", 0, values)
        source = StoreLogSource(store)
        with pytest.raises(CorruptChunk, match=r"dc1\.app/0 offset 1: gzip chunk does not"):
            list(read_range(source, OffsetRange("dc1.app", 0, 0, 2)))
        # the range before it loads
        (batch,) = list(read_range(source, OffsetRange("dc1.app", 0, 0, 1)))
        assert batch.column("line").to_pylist() == ["good"]
    finally:
        store.close()


def test_a_range_read_with_skip_corrupt_leaves_the_message_out_and_names_it(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "data")
    try:
        store.create_topic("dc1.app", exist_ok=True)
        values = [
            encode(Envelope("s", "h", "/f", "app", "raw", 1, 0, 0, b"one\n")),
            encode(Envelope("s", "h", "/f", "app", "zstd", 2, 0, 0, b"notzstd")),
            encode(Envelope("s", "h", "/f", "app", "raw", 3, 0, 0, b"three\n")),
        ]
        store.append("dc1.app", 0, values)
        stats = RangeReadStats()
        batches = list(
            read_range(
                StoreLogSource(store),
                OffsetRange("dc1.app", 0, 0, 3),
                stats=stats,
                skip_corrupt=True,
            )
        )
        assert [line for b in batches for line in b.column("line").to_pylist()] == ["one", "three"]
        ((offset, why),) = stats.corrupt
        assert offset == 1 and why.startswith("does not decompress (zstd chunk does not")
        assert (stats.messages, stats.lines) == (3, 2)
    finally:
        store.close()


@pytest.mark.parametrize("through", ["store", "gateway"])
def test_a_record_that_is_not_an_envelope_stops_the_read_unless_skip_corrupt(
    tmp_path: Path, start_gateway: Any, through: str
) -> None:
    """Another producer's records in a topic (on Kafka anyone may write one): the read stops
    at the first, naming it and --skip-corrupt, or with skip_corrupt leaves each out and names
    it.  None is left out silently, read from the store or through a gateway's pull API (which
    leaves them out of its answer and names them there)."""
    data_dir = tmp_path / "data"
    gateway = start_gateway(data_dir) if through == "gateway" else None
    store = open_store(data_dir)
    source: LogSource | None = None
    try:
        store.create_topic("dc1.app", exist_ok=True)
        values = [
            encode(Envelope("s", "h", "/f", "app", "raw", 1, 0, 0, b"one\n")),
            b'{"producer": "someone else"}',
            encode(Envelope("s", "h", "/f", "app", "raw", 2, 0, 0, b"two\n")),
            b"\x01\x02 not an envelope either",  # passes the version byte check
            encode(Envelope("s", "h", "/f", "app", "raw", 3, 0, 0, b"three\n")),
            # cut short in its data: its head reads as a chunk's, so an unfiltered pull read
            # sends it, and the loader finds that it does not decode
            encode(Envelope("s", "h", "/f", "app", "raw", 4, 0, 0, b"four\n"))[:-2],
            encode(Envelope("s", "h", "/f", "app", "raw", 5, 0, 0, b"five\n")),
        ]
        store.append("dc1.app", 0, values)
        source = StoreLogSource(store) if gateway is None else HttpLogSource(gateway.url)
        rng = OffsetRange("dc1.app", 0, 0, 7)
        with pytest.raises(
            CorruptChunk, match=r"dc1\.app/0 offset 1 is not a logbroker envelope"
        ) as err:
            list(read_range(source, rng))
        assert "--skip-corrupt loads past it" in str(err.value)

        # past the first, the next one stops it (a read of two messages at a time)
        with pytest.raises(CorruptChunk, match=r"dc1\.app/0 offset 3 is not a logbroker"):
            list(read_range(source, OffsetRange("dc1.app", 0, 2, 7), read_bytes=1))

        stats = RangeReadStats()
        batches = list(read_range(source, rng, stats=stats, skip_corrupt=True))
        lines = [line for b in batches for line in b.column("line").to_pylist()]
        assert lines == ["one", "two", "three", "five"]
        assert [offset for offset, _ in stats.corrupt] == [1, 3, 5]
        assert all(why.startswith("is not a logbroker envelope") for _, why in stats.corrupt)
        assert stats.messages == 7
    finally:
        if source is not None and gateway is not None:
            source.close()
        store.close()


def test_a_gateway_that_does_not_name_what_its_reads_left_out_is_refused(
    tmp_path: Path, start_gateway: Any
) -> None:
    """A gateway from before answers named the records that are not envelopes would let a
    load through it lose one without a report: the loader refuses to read through it.  That
    gateway is played by a real one behind a proxy that takes the field out of its answers."""
    gateway = start_gateway(tmp_path / "data")
    with open_store(tmp_path / "data") as store:
        store.create_topic("dc1.app", exist_ok=True)
        store.append(
            "dc1.app", 0, [encode(Envelope("s", "h", "/f", "app", "raw", 1, 0, 0, b"a\n"))]
        )

    class OlderGateway(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            upstream = httpx.get(gateway.url + self.path, headers=dict(self.headers))
            body = upstream.content
            if upstream.headers["content-type"] == BINARY_MEDIA_TYPE:
                out = [MAGIC]
                for section in decode_binary(body):
                    section.meta.pop("not_envelopes")
                    meta = json.dumps(section.meta).encode()
                    out.append(struct.pack(">H", len(meta)) + meta)
                    out.append(struct.pack(">I", len(section.records)))
                    out += [struct.pack(">QI", o, len(v)) + v for o, v in section.records]
                body = b"".join(out)
            self.send_response(upstream.status_code)
            self.send_header("Content-Type", upstream.headers["content-type"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), OlderGateway)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    source = HttpLogSource(f"http://127.0.0.1:{proxy.server_address[1]}")
    try:
        assert source.topic_bounds("dc1.app").partitions[0].end_offset == 1
        with pytest.raises(SourceUnavailable, match="does not name the records its reads leave"):
            source.read("dc1.app", 0, 0, 1024)
        # the same gateway, asked directly, names them (none here) and is read
        direct = HttpLogSource(gateway.url)
        try:
            assert [m.offset for m in direct.read("dc1.app", 0, 0, 1024).messages] == [0]
        finally:
            direct.close()
    finally:
        source.close()
        proxy.shutdown()
        proxy.server_close()


_CHAINED = """org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0
failed 1 times: org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/opt/logbroker/yt_loader/range_reader.py", line 60, in read_range
{cause}

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/opt/logbroker/yt_loader/load_job.py", line 240, in _load_task
{error}
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException
Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages
"""


def test_a_task_failure_is_reported_as_the_error_raised_not_as_its_cause() -> None:
    """Python prints an error's cause first: the load reports the error the task raised
    (a corrupt chunk named with its offset; a range lost to retention as DATA LOST, exit 3)."""
    corrupt = _CHAINED.format(
        cause="session_dedup.chunk_codecs.CorruptChunk: gzip chunk does not decompress: x",
        error="session_dedup.chunk_codecs.CorruptChunk: dc1.app/0 offset 5: gzip chunk does "
        "not decompress: x; the load stops here",
    )
    failure = _task_failure(7, Exception(corrupt))
    assert isinstance(failure, LoadFailed)
    assert str(failure).startswith("batch 7 failed: CorruptChunk: dc1.app/0 offset 5: gzip")
    lost = _CHAINED.format(
        cause="log_store.errors.OffsetOutOfRange: offset 3 is below the log start 9",
        error="yt_loader.errors.DataLost: dc1.app partition 0: offsets 3..8 were dropped",
    )
    failure = _task_failure(7, Exception(lost))
    assert isinstance(failure, DataLost)
    assert "offsets 3..8 were dropped" in str(failure)
    assert isinstance(_task_failure(7, Exception("java.lang.OutOfMemoryError")), LoadFailed)
