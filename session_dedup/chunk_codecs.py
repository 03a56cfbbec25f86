"""Undoing a chunk's codec: every chunk is stored as its client compressed it.

The one decompression every reader uses (pull clients, the loader, tests); writers compress
with whatever produces standard gzip or zstd frames.
"""

from __future__ import annotations

import gzip

import zstandard

from log_store.errors import LogbrokerError


class CorruptChunk(LogbrokerError):
    """A chunk whose data does not decompress with its declared codec."""


def decompress(codec: str, data: bytes) -> bytes:
    """The chunk's raw bytes (whole lines) for a stored ``codec`` and ``data``."""
    if codec == "raw":
        return data
    try:
        if codec == "gzip":
            return gzip.decompress(data)
        if codec == "zstd":
            # Streaming frames carry no content size and a chunk may hold several frames, so the
            # one-shot decompress() would refuse or stop early.
            dctx = zstandard.ZstdDecompressor()
            return dctx.decompressobj(read_across_frames=True).decompress(data)
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise CorruptChunk(f"{codec} chunk does not decompress: {exc}") from exc
    raise CorruptChunk(f"unknown codec {codec!r}")
