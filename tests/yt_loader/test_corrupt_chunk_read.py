"""A chunk in the log that does not decompress stops a load's range read, naming its offset:
a load that left it out would be complete and never be done again."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store
from session_dedup.chunk_codecs import CorruptChunk
from session_dedup.envelope import Envelope, encode
from yt_loader.log_source import StoreLogSource
from yt_loader.offset_ranges import OffsetRange
from yt_loader.range_reader import read_range


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
