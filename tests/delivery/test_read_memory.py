"""``logbroker read`` holds a fetch's compressed data, not all of it decompressed at once.

One fetch (``--max-bytes``, 16 MiB by default) of zstd chunks may hold hundreds of MiB of
lines: a reader that decompressed and encoded a whole batch before writing it grew with the
compression ratio (393 MiB of RSS here, 209 MiB for access-log-like lines compressed 7
times).  It writes each message as it decodes it, so its peak stays near its start-up size
however well the data compresses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from log_store import TopicConfig, open_store
from session_dedup.envelope import Envelope, encode
from tests.conftest import REPO

TOPIC = "dc1.app"
CHUNKS = 160
LINE_BYTES = 2000
CHUNK_LINES = 1024 * 1024 // LINE_BYTES
PEAK_LIMIT_KIB = 120 * 1024
"""The reader's peak resident size: about 43 MiB at start-up, 46 MiB reading these 160 MiB
(a reader that encoded a whole fetch before writing it: 393 MiB)."""

# the ``logbroker`` command, reporting its own peak resident size on stderr when it exits
_MEASURED = """
import runpy, sys
sys.argv = ["logbroker", *sys.argv[1:]]
try:
    runpy.run_module("ops", run_name="__main__")
finally:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("peak " + line.split()[1] + "\\n")
"""


def _fill(gateway: Any) -> None:
    """``CHUNKS`` zstd chunks of 1 MiB of lines each: a few hundred KiB in the log."""
    compressor = zstandard.ZstdCompressor()
    store = open_store(gateway.data_dir)
    try:
        store.create_topic(TOPIC, TopicConfig(partitions=1))
        for seqno in range(1, CHUNKS + 1):
            data = b"".join(
                b"%04d %06d %s\n" % (seqno, i, b"x" * (LINE_BYTES - 13)) for i in range(CHUNK_LINES)
            )
            value = encode(
                Envelope("s", "h", "/f", "app", "zstd", seqno, 0, 0, compressor.compress(data))
            )
            store.append(TOPIC, 0, [value])
    finally:
        store.close()


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl-chunks"])
def test_reading_a_well_compressed_topic_as_json_stays_small(
    gateway: Any, tmp_path: Path, fmt: str
) -> None:
    _fill(gateway)
    out_path = tmp_path / "out.jsonl"
    with open(out_path, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURED, "read", "--server", gateway.url, "--topic", TOPIC,
             "--from-beginning", "--idle-exit", "0", "--format", fmt],
            stdout=out, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        records = 0
        last = b""
        with open(out_path, "rb") as f:
            for line in f:
                records += 1
                last = line
        record = orjson.loads(last)
        last_line = f"{CHUNKS:04d} {CHUNK_LINES - 1:06d} {'x' * (LINE_BYTES - 13)}"
        if fmt == "jsonl":
            assert records == CHUNKS * CHUNK_LINES
            assert (record["seqno"], record["line"]) == (CHUNKS, CHUNK_LINES - 1)
            assert record["data"] == last_line
        else:
            assert records == CHUNKS
            assert record["seqno"] == CHUNKS
            assert record["data"].endswith("\n" + last_line + "\n")
    finally:
        out_path.unlink()
    peak = int(done.stderr.rsplit("peak ", 1)[1])
    assert peak < PEAK_LIMIT_KIB, f"the reader's peak RSS was {peak // 1024} MiB"
