"""One tailed file: reading it in large blocks and cutting chunks at line boundaries.

The read position is always the end of the last chunk cut, so an incomplete last line is not
buffered: it is simply read again next time, once it has its newline.  The hot path is one
``pread`` of up to ``chunk_bytes`` and one ``rfind(b"\\n")``; lines are looked at one by one only
when the entry has a multiline pattern.
"""

from __future__ import annotations

import concurrent.futures
import enum
import os
import re
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import NamedTuple

from push_client.backoff import Backoff
from push_client.config import Entry
from push_client.handover import SourceHandover
from push_client.identity import FileIdentity, display_path, read_fingerprint
from push_client.parking import Parked
from push_client.partition_outage import PartitionOutage
from push_client.wire import SourceMeta


class Phase(enum.Enum):
    ACTIVE = "active"
    """The file is at its path and may grow."""
    DRAINING = "draining"
    """Renamed or deleted: read as it grows, let go once quiet (see ``push_client.rotation``)."""
    CLOSING = "closing"
    """Truncated or replaced under us: what was read is still sent, nothing more is read."""
    DONE = "done"


@dataclass(eq=False)
class Chunk:
    """Whole lines ``[start, seqno)`` of one file."""

    start: int
    seqno: int
    data: bytes | memoryview
    read_at: float
    create_time_ms: int
    encoded: concurrent.futures.Future[bytes | memoryview] | None = None
    """The data compressed by the entry's codec, started as soon as the chunk was cut."""
    encoded_with: str = ""
    """The codec of ``encoded``: a reload may change the entry's codec before it is sent."""


class UnackedSince:
    """When the oldest byte not yet acknowledged was first seen: what lag in seconds means.

    A log written to without pause always has a few bytes not acknowledged yet, so "since
    when has the file had unacknowledged bytes" grows without bound while shipping keeps up
    (it did: --status and the dashboard showed minutes of lag for files milliseconds behind).
    Each growth seen is remembered with its time, and acknowledgements drop what they cover.
    At most one entry per ``resolution_s`` and ``max_entries`` in all (pairs merge, keeping the
    earlier time): an outage of days costs bounded memory and errs towards more lag, never less.
    """

    def __init__(self, resolution_s: float = 0.1, max_entries: int = 1024) -> None:
        self.resolution_s = resolution_s
        self.max_entries = max_entries
        self._seen: deque[tuple[int, float]] = deque()
        """(size seen, wall time it was first seen), sizes increasing."""

    def update(self, size: int, acked: int, now: float) -> float | None:
        """Note ``size`` seen at ``now``; return when byte ``acked`` was first seen (or None
        when nothing is unacknowledged)."""
        seen = self._seen
        while seen and seen[0][0] <= acked:
            seen.popleft()
        if size <= acked:
            seen.clear()
            return None
        if seen and now - seen[-1][1] < self.resolution_s:
            seen[-1] = (max(size, seen[-1][0]), seen[-1][1])
        elif not seen or size > seen[-1][0]:
            seen.append((size, now))
        if len(seen) > self.max_entries:
            pairs = list(seen)
            merged = [(pairs[i + 1][0], pairs[i][1]) for i in range(0, len(pairs) - 1, 2)]
            if len(pairs) % 2:
                merged.append(pairs[-1])
            self._seen = deque(merged)
        return self._seen[0][1]


class PathError(NamedTuple):
    """Why a tailed file's path cannot be looked at, and since when."""

    error: str
    """The error's message (``Permission denied``), as said in the log."""
    since: float
    """Wall clock."""
    errno: str = ""
    """Its symbolic errno (``EACCES``), for alert rules; "" when it has none."""


class TailedFile:
    """A file being shipped as one source.  Owned by the daemon's loop thread only."""

    def __init__(
        self,
        *,
        entry: Entry,
        fd: int,
        path: str,
        first_path: str,
        identity: FileIdentity,
        generation: int,
        source_id: str,
        host: str,
        chunk_bytes: int,
        max_line_bytes: int,
        multiline_timeout_s: float = 1.0,
    ) -> None:
        self.entry = entry
        self.fd = fd
        self.path = path
        self.first_path = first_path
        self.identity = identity
        self.generation = generation
        self.source_id = source_id
        self.meta = SourceMeta(
            entry.log_type, source_id, host, display_path(first_path), entry.codec
        )
        self.epoch: int | None = None
        self.chunk_bytes = chunk_bytes
        self.max_line_bytes = max_line_bytes
        self.multiline: re.Pattern[bytes] | None = entry.multiline_pattern()
        self.multiline_timeout_s = multiline_timeout_s
        self.phase = Phase.ACTIVE
        self.session_ready = False
        self.topic = ""
        self.partition = -1
        self.read_pos = 0
        self.acked = 0
        st = os.fstat(fd)
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        """The file's modification time when last looked at: a file written without growing
        (truncated and written again to the same size between two looks) is looked into."""
        self.pending: deque[Chunk] = deque()
        self.pending_bytes = 0
        self.in_flight = 0
        """Requests of this file in flight (see ``PushConfig.pipeline_depth``)."""
        self.in_flight_bytes = 0
        self.pipeline_blocked = False
        """Set when a pipelined request overtook its predecessor: one at a time until idle."""
        self.rotated_at: float | None = None
        self.last_growth = time.monotonic()
        self.held_since: float | None = None
        self.unterminated = 0
        """Bytes at the end of the file, read, that no newline ends yet (0 with --multiline):
        what ``--status`` names instead of leaving a lag that never moves unexplained."""
        self.pending_since: float | None = None
        """When the oldest byte not yet acknowledged was first seen (wall clock), or None."""
        self._unacked = UnackedSince()
        self.retire_reason = ""
        self.handover = SourceHandover()
        self.parked: Parked | None = None
        """Set while the gateway refuses this file (see ``push_client.parking``)."""
        self.outage: PartitionOutage | None = None
        """Set while its partition has no reachable owner (see ``push_client.partition_outage``)."""
        self.alone = False
        """Sent in requests of its own, to find which file a refused request is due to."""
        self.session_asked = False
        """A session request for this file is out."""
        self.session_retry_at = 0.0
        """Monotonic time before which no session is asked for (a refusal that may pass)."""
        self.session_backoff: Backoff | None = None
        self.session_refusal = ""
        """The last refusal that may pass (a 429, say), as said in the log; "" when none."""
        self.session_installation = ""
        """The installation the file's session is open at (where its writes go)."""
        self.fenced_said_at: float | None = None
        """Monotonic time the log last said its writes were fenced (None: never)."""
        self.fenced_unsaid = 0
        """Fences since then, said with the next line."""
        self.path_error: PathError | None = None
        """Set while its path cannot be looked at (see ``FileSet.refresh_all``)."""

    # -- positions ------------------------------------------------------------------------------
    def resume_at(self, last_seqno: int, epoch: int | None = None) -> None:
        """Start after what the log holds: the gateway's last seqno is the truth.

        ``epoch`` is the one our session fence started; every write names it, so a request
        of an earlier incarnation of this client still in flight cannot land any more.
        """
        self.acked = last_seqno
        self.read_pos = last_seqno
        self.epoch = epoch
        self.session_ready = True
        self.pipeline_blocked = False

    @property
    def settled(self) -> int:
        """Every byte below was acknowledged (by some installation) or is in doubt."""
        return max(self.acked, self.handover.frontier)

    def drop_pending(self) -> int:
        """Forget the chunks cut but not sent; return their bytes (they are read again)."""
        dropped = self.pending_bytes
        self.pending.clear()
        self.pending_bytes = 0
        self.read_pos = self.acked
        return dropped

    def on_acked(self, seqno: int) -> None:
        if seqno > self.acked:
            self.acked = seqno
            self.handover.on_acked(seqno)

    @property
    def idle(self) -> bool:
        """Nothing of it waits to be sent or is in flight."""
        return not self.pending and not self.in_flight

    @property
    def lag_bytes(self) -> int:
        return max(0, self.size - self.settled)

    @property
    def read_limit(self) -> int | None:
        """While a doubt is settled, reading stops at the end of its range."""
        return self.handover.resend_end

    def wants_read(self) -> bool:
        limit = self.read_limit
        return (
            self.session_ready
            and self.parked is None
            and self.phase in (Phase.ACTIVE, Phase.DRAINING)
            and self.size > self.read_pos
            and (limit is None or self.read_pos < limit)
        )

    # -- watching -------------------------------------------------------------------------------
    def refresh(self, now: float) -> str | None:
        """Look at the file again; return ``"truncated"`` or ``"rotated"`` when that happened."""
        if self.phase in (Phase.CLOSING, Phase.DONE):
            return None
        st = os.fstat(self.fd)
        if st.st_size != self.size:
            if st.st_size < max(self.read_pos, self.size) or self._fingerprint_changed():
                return self._truncated()
            self.size = st.st_size
            self.last_growth = now
        elif st.st_mtime_ns != self.mtime_ns and self._fingerprint_changed():
            # written, not grown: truncated and filled again to the same size since the last
            # look (its new lines would otherwise be taken for what was read already)
            self.mtime_ns = st.st_mtime_ns
            return self._truncated()
        self.mtime_ns = st.st_mtime_ns
        self.pending_since = self._unacked.update(self.size, self.settled, time.time())
        if self.phase is Phase.ACTIVE:
            try:
                at_path = os.stat(self.path)
            except FileNotFoundError:
                return "rotated"
            if (at_path.st_dev, at_path.st_ino) != (self.identity.dev, self.identity.ino):
                return "rotated"
        return None

    def _truncated(self) -> str:
        # This source ends where it was read to: what it still owes is that, less what was
        # acknowledged.  The file's new size is the new source's (a copytruncate showed the
        # old one's unsent bytes as no lag at all while a gateway was down).
        self.size = self.read_pos
        return "truncated"

    def _fingerprint_changed(self) -> bool:
        current = read_fingerprint(self.fd, final=True)
        return current is not None and current != self.identity.fingerprint

    def quiet_since(self) -> float:
        return max(self.rotated_at or 0.0, self.last_growth)

    # -- reading --------------------------------------------------------------------------------
    def read(self, budget: int, now: float, *, final: bool = False) -> int:
        """Cut chunks from ``read_pos`` on, up to about ``budget`` bytes; return bytes cut.

        ``final``: the file will not grow again, so a last line without newline is sent too.
        """
        cut_total = 0
        limit = self.read_limit
        while cut_total < budget:
            want = self.chunk_bytes
            if limit is not None:
                want = min(want, limit - self.read_pos)
                if want <= 0:
                    break
            data = os.pread(self.fd, want, self.read_pos)
            if not data:
                self.unterminated = 0
                break
            at_eof = len(data) < want
            cut = data.rfind(b"\n") + 1
            if limit is not None and self.read_pos + len(data) == limit:
                # The range was cut into chunks before: its end is a chunk boundary.
                cut = len(data)
            elif final and at_eof:
                cut = len(data)
            elif self.multiline is not None and cut:
                cut = self._record_end(data, cut, now, at_eof=at_eof, final=final)
            if cut == 0 and not at_eof:
                data, cut = self._long_line(final)
            if cut == 0:
                if self.multiline is None:
                    self.unterminated = len(data)
                break
            self._push(data if cut == len(data) else memoryview(data)[:cut], now)
            cut_total += cut
            if self.multiline is None:
                self.unterminated = len(data) - cut if at_eof else 0
            if at_eof and cut == len(data):
                break
            if at_eof and self.multiline is None:
                break
        return cut_total

    def _push(self, data: bytes | memoryview, now: float) -> None:
        start = self.read_pos
        self.read_pos = start + len(data)
        self.held_since = None
        self.pending.append(Chunk(start, self.read_pos, data, now, time.time_ns() // 1_000_000))
        self.pending_bytes += len(data)

    def _long_line(self, final: bool) -> tuple[bytes, int]:
        """A line longer than a chunk: send it whole, up to ``max_line_bytes``."""
        data = os.pread(self.fd, self.max_line_bytes, self.read_pos)
        newline = data.find(b"\n")
        if newline >= 0:
            return data, newline + 1
        if len(data) >= self.max_line_bytes or final:
            # Past the limit a line is cut: the only chunk that does not end with a newline.
            return data, len(data)
        return data, 0

    def _record_end(self, data: bytes, cut: int, now: float, *, at_eof: bool, final: bool) -> int:
        """Where the last complete multiline record ends in ``data[:cut]``."""
        assert self.multiline is not None
        end = cut - 1
        record_start = 0
        while end > 0:
            line_start = data.rfind(b"\n", 0, end) + 1
            if line_start == 0:
                break
            if self.multiline.match(data, line_start):
                record_start = line_start
                break
            end = line_start - 1
        if record_start > 0 and not at_eof:
            return record_start
        # The last record may go on in lines not written yet: hold it for a while.
        if final or not at_eof:
            return cut
        if self.held_since is None:
            self.held_since = now
        if now - self.held_since >= self.multiline_timeout_s:
            return cut
        return record_start

    # -- sending --------------------------------------------------------------------------------
    def take(self, max_bytes: int) -> list[Chunk]:
        """Pending chunks for one request (at least one), counted as in flight.

        Only a run without a hole: chunks given back (a request that failed) while a later
        request of the file is in flight sit before chunks read after it, and a section names
        where its first chunk starts only (``prev_seqno``), so the gateway would write the
        chunk after the hole and then answer the hole's chunks ``duplicate``: lost.
        """
        taken: list[Chunk] = []
        size = 0
        while self.pending and (not taken or size + len(self.pending[0].data) <= max_bytes):
            if taken and self.pending[0].start != taken[-1].seqno:
                break  # the bytes between are in flight: they go first
            chunk = self.pending.popleft()
            size += len(chunk.data)
            taken.append(chunk)
        self.pending_bytes -= size
        self.in_flight += 1
        self.in_flight_bytes += size
        return taken

    def use_entry(self, entry: Entry) -> None:
        """Go on under ``entry`` (a reloaded configuration): the same source, its chunks from
        now on cut by the entry's multiline pattern and sent with its codec (the gateway keeps
        each chunk's codec, and a seqno is a byte offset whatever the codec)."""
        self.entry = entry
        self.multiline = entry.multiline_pattern()
        if entry.codec != self.meta.codec:
            self.meta = replace(self.meta, codec=entry.codec)

    def section_meta(self, chunks: list[Chunk]) -> bytes:
        """The section header of a request carrying ``chunks``.

        ``prev_seqno`` is where the first chunk starts, the seqno of the chunk before it:
        the gateway writes the section only if it holds the source up to there, so a
        pipelined request can never land before its predecessor and leave a gap.
        """
        return self.meta.encoded(self.epoch, chunks[0].start)

    def finished(self, chunks: list[Chunk]) -> None:
        """A request of this file came back (answered or abandoned)."""
        self.in_flight -= 1
        self.in_flight_bytes -= sum(len(c.data) for c in chunks)

    def give_back(self, chunks: list[Chunk]) -> int:
        """Unacknowledged chunks go back among the pending ones, in file order; return the
        bytes dropped (already acknowledged, or the session is being reopened)."""
        dropped = 0
        kept: list[Chunk] = []
        for chunk in chunks:
            if chunk.seqno > self.acked and self.session_ready:
                kept.append(chunk)
                self.pending_bytes += len(chunk.data)
            else:
                dropped += len(chunk.data)
        if kept:
            self.pending = deque(sorted([*kept, *self.pending], key=lambda c: c.start))
        return dropped

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.phase = Phase.DONE
