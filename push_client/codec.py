"""Per-entry compression of a chunk's data; each chunk stays whole lines once decompressed."""

from __future__ import annotations

import gzip
import threading

import zstandard

_local = threading.local()


def _zstd() -> zstandard.ZstdCompressor:
    # A compressor object is not safe to share between threads.
    compressor: zstandard.ZstdCompressor | None = getattr(_local, "zstd", None)
    if compressor is None:
        compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
        _local.zstd = compressor
    return compressor


def compress(codec: str, data: bytes | memoryview) -> bytes | memoryview:
    """``data`` encoded with ``codec`` (``raw`` returns it unchanged)."""
    if codec == "raw":
        return data
    if codec == "gzip":
        return gzip.compress(data, compresslevel=1, mtime=0)
    if codec == "zstd":
        return _zstd().compress(data)
    raise ValueError(f"unknown codec {codec!r}")
