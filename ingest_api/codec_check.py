"""The gateway's one check of a write's compressed chunks, before anything of it is written.

Every gzip or zstd chunk is decompressed once, block by block: a chunk that does not
decompress is refused with its source (400 ``bad_chunk``), one that expands past
``MAX_DECOMPRESSED_BYTES`` too (413 ``chunk_too_large``), and the lines of the others are kept
in :attr:`ChunkBatch.lines` for the audit, which then needs no decompression of its own.

The request's chunks together may decompress to ``max_decompressed_bytes_per_request``: past
that the whole request is refused (413 ``decompressed_too_large``), found after decompressing
at most that much (plus a block), however much its chunks claim.  A few KiB of chunks that
each expand to 64 MiB cost seconds of decompression; they cost the budget now, and nothing of
them is written for readers to decompress again.

Where the check runs is decided by what it decompresses, not by the compressed size: on the
event loop until :data:`_INLINE_OUTPUT_BYTES` came out (about a millisecond), and the rest in
a worker thread, so a small body of bombs cannot hold the loop (every other request,
``/healthz``, long polls) for longer than that.
"""

from __future__ import annotations

import anyio.to_thread

from ingest_api.errors import ApiError
from ingest_api.framing import Section
from session_dedup.chunk_codecs import (
    BudgetSpent,
    ChunkExpandsTooFar,
    CorruptChunk,
    OutputBudget,
    count_lines,
)

_INLINE_BYTES = 256 * 1024
"""Compressed data a request may hold and still start its check on the event loop."""
_INLINE_OUTPUT_BYTES = 256 * 1024
"""Decompressed bytes checked on the event loop before the rest moves to a thread: about
0.3 ms of zstd and 1 ms of gzip, bombs included (a zstd frame without a declared size may
pass it by one block, 0.1 ms of a zstd bomb)."""
_LIMIT_NAME = "max_decompressed_bytes_per_request"


async def check_codecs(sections: list[Section], max_bytes: int) -> None:
    """Refuse every section with a compressed chunk that does not decompress or is a bomb,
    keep the line counts of the others; raise 413 ``decompressed_too_large`` if the request's
    compressed chunks decompress to more than ``max_bytes`` in all.

    The write path then refuses the other sections of a refused source
    (:func:`ingest_api.framing.refuse_whole_sources`).
    """
    check = _CodecCheck(sections, max_bytes)
    if not check.sections:
        return
    if check.compressed <= _INLINE_BYTES and check.run(_INLINE_OUTPUT_BYTES):
        return
    await anyio.to_thread.run_sync(check.run, None)


class _CodecCheck:
    """The check of one request's compressed chunks, in steps: each :meth:`run` goes on
    from the chunk where the previous one stopped."""

    __slots__ = ("_lines", "_next", "compressed", "left", "max_bytes", "sections")

    def __init__(self, sections: list[Section], max_bytes: int) -> None:
        self.sections = [s for s in sections if s.error is None and s.meta.codec != "raw"]
        self.compressed = sum(sum(map(len, s.batch.datas)) for s in self.sections)
        self.max_bytes = max_bytes
        self.left = max_bytes
        """Decompressed bytes the request's unchecked chunks may still produce."""
        self._next = 0
        """The section being checked."""
        self._lines: list[int] = []
        """The lines of its chunks checked so far."""

    def run(self, output_bytes: int | None) -> bool:
        """Check chunks until all are checked (True), or until the next one would take this
        step past ``output_bytes`` of decompressed data (False: run again to go on; None: no
        step limit but the request's).  Raises the 413 when the request is over its budget."""
        step = OutputBudget(self.left if output_bytes is None else min(output_bytes, self.left))
        step_bytes = step.left
        try:
            while self._next < len(self.sections):
                self._check(self.sections[self._next], step)
                self._next += 1
                self._lines = []
        except BudgetSpent:
            if step_bytes < self.left:
                self.left -= step_bytes - step.left
                return False  # the chunk that did not fit is checked again in the next step
            raise ApiError(
                413,
                "decompressed_too_large",
                f"the request's compressed chunks decompress to more than {self.max_bytes} "
                f"bytes in all (limits.{_LIMIT_NAME}); nothing of the request was written: "
                "send fewer of them per request",
                extra={"limit": _LIMIT_NAME, "max": self.max_bytes},
            ) from None
        self.left -= step_bytes - step.left
        return True

    def _check(self, section: Section, step: OutputBudget) -> None:
        codec = section.meta.codec
        batch = section.batch
        lines = self._lines
        for i in range(len(lines), len(batch)):
            try:
                lines.append(count_lines(codec, batch.datas[i], budget=step))
            except ChunkExpandsTooFar as exc:
                section.error = ApiError(413, "chunk_too_large", _where(section, i, exc))
                return
            except CorruptChunk as exc:
                section.error = ApiError(400, "bad_chunk", _where(section, i, exc))
                return
        batch.lines = lines


def _where(section: Section, index: int, exc: CorruptChunk) -> str:
    return (
        f"source {section.meta.source_id!r}, chunk seqno {section.batch.seqnos[index]}: {exc}; "
        "nothing of this source was written"
    )
