"""The push-client's loop: discover files, read them, send chunks, apply acks, save positions.

One thread owns every file and every position; sender threads only move bytes over HTTP and
hand the gateway's answers back through a queue (and a pipe that wakes the loop).

The gateway accepts gaps in seqnos, so if a later request of a source were written while an
earlier one failed, the earlier chunks would come back as ``duplicate`` and be lost.  Hence
every section names ``prev_seqno`` (where its first chunk starts): up to ``pipeline_depth``
requests of one source may be in flight, and one that overtakes its predecessor is refused
(``out_of_order``) and sent again after it.  Sessions fence (``epoch``), so a request of a
killed earlier incarnation cannot land after we resumed.  Requests of different sources run
concurrently, up to ``max_in_flight``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import fnmatch
import logging
import os
import queue
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from log_store.errors import LogbrokerError
from push_client.codec import compress
from push_client.config import Entry, PushConfig
from push_client.discovery import ChangeWatcher, expand, find_inode, watch_root
from push_client.identity import FileIdentity, make_source_id, read_fingerprint
from push_client.metrics import MetricsServer, PushMetrics
from push_client.progress import ProgressBar
from push_client.state_file import (
    PushState,
    RetiredSource,
    SourcePosition,
    StateFile,
    write_atomically,
)
from push_client.status import STATUS_NAME, file_row, status_document
from push_client.tailer import Chunk, Phase, TailedFile
from push_client.transport import GatewayClient, Stopped
from push_client.wire import WireChunk, encode_write_body

log = logging.getLogger("logbroker.push")

_RETIRED_KEEP_S = 7 * 24 * 3600
_RETIRED_KEEP_COUNT = 10_000
_STATE_SAVE_INTERVAL_S = 0.5
_STATUS_INTERVAL_S = 1.0
_MIN_RESCAN_GAP_S = 0.02


def _encoded(codec: str, chunk: Chunk) -> bytes | memoryview:
    if chunk.encoded is not None:
        return chunk.encoded.result()
    return compress(codec, chunk.data)


def _matches(entry: Entry, path: str) -> bool:
    return fnmatch.fnmatchcase(path, os.path.abspath(entry.path))


class StateDirBusy(LogbrokerError):
    """Another push-client holds the state directory."""


@dataclass
class _WriteJob:
    sections: list[tuple[TailedFile, list[Chunk]]]
    future: concurrent.futures.Future[dict[str, Any]]


@dataclass
class _SessionJob:
    files: list[TailedFile]
    future: concurrent.futures.Future[list[dict[str, Any]]]


@dataclass
class _Counters:
    read_bytes: int = 0
    acked_bytes: int = 0
    acked_chunks: int = 0
    duplicate_chunks: int = 0
    rotations: int = 0
    truncations: int = 0
    retired: dict[str, int] = field(default_factory=dict)
    fenced: int = 0
    out_of_order: int = 0
    first_read_at: float = 0.0
    last_ack_at: float = 0.0


class PushDaemon:
    """Ships the configured files until :meth:`stop`; see the module docstring."""

    def __init__(
        self,
        config: PushConfig,
        *,
        idle_exit_s: float | None = None,
        progress: bool | None = None,
    ) -> None:
        self.config = config
        self.idle_exit_s = idle_exit_s
        self.state_dir = config.state_dir
        self._stop = threading.Event()
        self._stop_started: float | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Reentrant: the SIGTERM handler wakes the loop from the thread that may hold it.
        self._wake_lock = threading.RLock()
        self._results: queue.SimpleQueue[_WriteJob | _SessionJob] = queue.SimpleQueue()
        self._client = GatewayClient(
            config.servers,
            token=config.token,
            stop=self._stop,
            max_backoff_s=config.max_backoff_s,
            pool_size=config.max_in_flight + 2,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.max_in_flight + 1, thread_name_prefix="push-send"
        )
        self._compressors = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="push-compress"
        )
        self._watcher = ChangeWatcher(config.inotify)
        self._files: dict[str, TailedFile] = {}
        self._by_inode: dict[tuple[int, int], TailedFile] = {}
        self._waiting_paths: set[str] = set()
        self._state = PushState()
        self._state_file = StateFile(self.state_dir)
        self._state_dirty = False
        self._writes_in_flight = 0
        self._sessions_in_flight = 0
        self._buffered = 0
        self._counters = _Counters()
        self._last_activity = time.monotonic()
        self._lock_fd = -1
        show = sys.stderr.isatty() if progress is None else progress
        self._progress = ProgressBar(sys.stderr) if show else None
        self.metrics = PushMetrics()
        self._metrics_server: MetricsServer | None = None
        self.started_at = time.time()
        self._status_document = b"{}"

    # -- public ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to flush what is in flight, save state and return.  Signal-safe."""
        if not self._stop.is_set():
            # Set before the event, so that no sender sees "stopping" without its deadline.
            self._client.stop_deadline = time.monotonic() + self.config.shutdown_timeout_s
        self._stop.set()
        self._wake()

    def requests_abandoned(self) -> bool:
        """After :meth:`run`: whether sender threads are still stuck in a request."""
        return any(t.name.startswith("push-send") and t.is_alive() for t in threading.enumerate())

    def run(self) -> int:
        """Run until stopped (or idle, with ``idle_exit_s``); return the exit code."""
        self._take_lock()
        in_main = threading.current_thread() is threading.main_thread()
        previous: dict[signal.Signals, Any] = {}
        if in_main:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, lambda _s, _f: self.stop())
        try:
            self._start()
            self._loop()
        finally:
            self._shutdown()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 0

    # -- start and stop -------------------------------------------------------------------------
    def _take_lock(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StateDirBusy(
                f"another logbroker push is running with state dir {self.state_dir}"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _start(self) -> None:
        self._state = self._state_file.load()
        self.metrics.state_corruptions = self._state_file.corruptions
        if self.config.metrics_port is not None:
            self._metrics_server = MetricsServer(
                self.config.metrics_port, self._render_metrics, self._last_status
            )
        for entry in self.config.entries:
            self._watcher.watch(watch_root(entry.path))
        self._resume_from_state()
        self._discover()
        self._open_pending_sessions()

    def _shutdown(self) -> None:
        self._stop.set()
        c = self._counters
        log.info(
            "acknowledged %d bytes in %d chunks (%d duplicates); first read at %.3f, "
            "last ack at %.3f",
            c.acked_bytes,
            c.acked_chunks,
            c.duplicate_chunks,
            c.first_read_at,
            c.last_ack_at,
        )
        if self._progress is not None:
            self._progress.finish()
        self._prune_retired()
        try:
            self._sync_state_positions()
            self._state_file.save(self._state)
            self._publish_status(running=False)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._compressors.shutdown(wait=False, cancel_futures=True)
            self._client.close()
            for tailed in self._files.values():
                if tailed.fd >= 0:
                    os.close(tailed.fd)
            self._watcher.close()
            if self._metrics_server is not None:
                self._metrics_server.close()
            with self._wake_lock:
                wake_w, self._wake_w = self._wake_w, -1
                os.close(wake_w)
                os.close(self._wake_r)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        next_rescan = time.monotonic() + self.config.rescan_interval_s
        next_poll = 0.0
        last_rescan = 0.0
        next_save = 0.0
        next_status = 0.0
        while True:
            now = time.monotonic()
            self._collect()
            if self._stop.is_set():
                if self._stop_started is None:
                    self._stop_started = now
                    log.info("stopping: flushing in-flight chunks")
                if now >= self._client.stop_deadline:
                    if self._writes_in_flight:
                        log.warning(
                            "gave up on %d requests in flight; their chunks are sent again "
                            "after the restart",
                            self._writes_in_flight,
                        )
                    return
                if self._writes_in_flight == 0 and not self._sendable():
                    return
            else:
                changes = self._watcher.drain()
                changed = changes.any
                if changes.moves:
                    self._follow_renames(changes.moves, now)
                if now >= next_rescan or (
                    (changes.structural or (changed and bool(self._waiting_paths)))
                    and now - last_rescan >= _MIN_RESCAN_GAP_S
                ):
                    self._discover()
                    last_rescan = now
                    next_rescan = now + self.config.rescan_interval_s
                if changed or now >= next_poll or not self._watcher.active:
                    self._refresh_all(now)
                    next_poll = now + self.config.poll_interval_s
                self._read_all(now)
                self._let_go_of_quiet_files(now)
                self._open_pending_sessions()
            linger_wait = self._dispatch(now)
            if now >= next_save and self._state_dirty:
                self._save_state()
                next_save = now + _STATE_SAVE_INTERVAL_S
            if now >= next_status:
                self._publish_status(running=True)
                next_status = now + _STATUS_INTERVAL_S
            if self._idle_done(now):
                log.info("everything acknowledged and idle for %.1f s; exiting", self.idle_exit_s)
                self.stop()
                continue
            timeout = min(
                max(0.0, next_poll - now),
                linger_wait,
                max(0.0, next_status - now),
                max(0.0, next_save - now) if self._state_dirty else 1.0,
            )
            self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        fds = [self._wake_r]
        inotify_fd = self._watcher.fileno()
        if inotify_fd is not None and not self._stop.is_set():
            fds.append(inotify_fd)
        readable, _, _ = select.select(fds, [], [], timeout)
        if self._wake_r in readable:
            # Drain the wake-up pipe; it is non-blocking, so an empty pipe ends the loop.
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_r, 4096):
                    continue

    def _wake(self) -> None:
        # Senders may finish after the loop closed the pipe: the lock keeps them from writing
        # into a descriptor number that was closed (and maybe reused).  A full pipe already
        # holds a wake-up.
        with self._wake_lock:
            if self._wake_w >= 0:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"x")

    def _idle_done(self, now: float) -> bool:
        if self.idle_exit_s is None or self._stop.is_set():
            return False
        if self._writes_in_flight or self._sessions_in_flight or self._buffered:
            return False
        if any(not t.session_ready for t in self._files.values()):
            return False
        return now - self._last_activity >= self.idle_exit_s

    # -- files ----------------------------------------------------------------------------------
    def _entry_for(self, entry_path: str) -> Entry | None:
        for entry in self.config.entries:
            if entry.path == entry_path:
                return entry
        return None

    def _resume_from_state(self) -> None:
        """Reopen the sources of the state file, following files rotated while we were down."""
        for pos in list(self._state.sources.values()):
            entry = self._entry_for(pos.entry_path)
            identity = FileIdentity(pos.dev, pos.ino, pos.fingerprint)
            found = self._open_identity(pos.path, identity)
            phase = Phase.ACTIVE
            if found is None:
                moved = find_inode(os.path.dirname(pos.path), pos.dev, pos.ino)
                if moved is not None:
                    found = self._open_identity(moved, identity)
                    phase = Phase.DRAINING
            if found is None or entry is None:
                reason = "gone" if found is None else "unconfigured"
                if found is not None:
                    os.close(found[0])
                log.warning(
                    "source %s is %s since the last run; positions up to %d were acked",
                    pos.source_id,
                    reason,
                    pos.acked,
                )
                self._retire_position(pos, reason, pos.size)
                continue
            fd, path = found
            tailed = self._new_file(entry, fd, path, pos.first_path, identity, pos.generation)
            tailed.path = pos.path if phase is Phase.ACTIVE else path
            if phase is Phase.DRAINING:
                tailed.phase = Phase.DRAINING
                tailed.rotated_at = time.monotonic()
                self._counters.rotations += 1

    def _open_identity(self, path: str, identity: FileIdentity) -> tuple[int, str] | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        same_inode = (st.st_dev, st.st_ino) == (identity.dev, identity.ino)
        if same_inode and read_fingerprint(fd, final=True) == identity.fingerprint:
            return fd, path
        os.close(fd)
        return None

    def _discover(self) -> None:
        self._waiting_paths.clear()
        for cand in expand(self.config.entries):
            if (cand.dev, cand.ino) in self._by_inode:
                continue
            self._watcher.watch(os.path.dirname(cand.path))
            try:
                fd = os.open(cand.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            fingerprint = read_fingerprint(fd)
            if (st.st_dev, st.st_ino) != (cand.dev, cand.ino) or fingerprint is None:
                os.close(fd)
                self._waiting_paths.add(cand.path)
                continue
            identity = FileIdentity(cand.dev, cand.ino, fingerprint)
            generation = self._generation_for(identity, st.st_size)
            if generation is None:
                os.close(fd)
                continue
            self._new_file(cand.entry, fd, cand.path, cand.path, identity, generation)

    def _follow_renames(self, moves: list[tuple[str, str]], now: float) -> None:
        """Files renamed away from a matched path that we had not picked up yet (rotated
        faster than we looked) are read from their new name, to their end."""
        for old_path, new_path in moves:
            entry = next((e for e in self.config.entries if _matches(e, old_path)), None)
            if entry is None:
                continue
            try:
                fd = os.open(new_path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            fingerprint = read_fingerprint(fd, final=True)
            if (st.st_dev, st.st_ino) in self._by_inode or fingerprint is None:
                os.close(fd)
                continue
            identity = FileIdentity(st.st_dev, st.st_ino, fingerprint)
            generation = self._generation_for(identity, st.st_size)
            if generation is None:
                os.close(fd)
                continue
            tailed = self._new_file(entry, fd, new_path, old_path, identity, generation)
            tailed.phase = Phase.DRAINING
            tailed.rotated_at = now
            self._counters.rotations += 1
            log.info("%s was renamed to %s before it was picked up; reading it", old_path, new_path)

    def _generation_for(self, identity: FileIdentity, size: int) -> int | None:
        """The generation a newly found file gets; None when it is a file already let go.

        A file let go after rotation and seen again under a matched name is the same file:
        it is skipped.  The same identity after a truncation or deletion (inode reused, same
        first line) is new content: it gets the next generation so its seqnos start afresh.
        """
        generation = 0
        for retired in self._state.retired:
            if (retired.dev, retired.ino, retired.fingerprint) != identity.key:
                continue
            if retired.reason == "rotated" and size >= retired.size:
                return None
            generation = max(generation, retired.generation + 1)
        for tailed in self._files.values():
            if tailed.identity == identity:
                generation = max(generation, tailed.generation + 1)
        return generation

    def _new_file(
        self,
        entry: Entry,
        fd: int,
        path: str,
        first_path: str,
        identity: FileIdentity,
        generation: int,
    ) -> TailedFile:
        source_id = make_source_id(self.config.host, first_path, identity, generation)
        tailed = TailedFile(
            entry=entry,
            fd=fd,
            path=path,
            first_path=first_path,
            identity=identity,
            generation=generation,
            source_id=source_id,
            host=self.config.host,
            chunk_bytes=self.config.chunk_bytes,
            max_line_bytes=self.config.max_line_bytes,
            multiline_timeout_s=self.config.multiline_timeout_s,
        )
        self._files[source_id] = tailed
        self._by_inode[(identity.dev, identity.ino)] = tailed
        self._watcher.watch(os.path.dirname(path))
        log.info("tailing %s as source %s", path, source_id)
        return tailed

    def _refresh_all(self, now: float) -> None:
        for tailed in list(self._files.values()):
            if tailed.phase in (Phase.CLOSING, Phase.DONE):
                continue
            try:
                change = tailed.refresh(now)
            except OSError as exc:
                log.warning("cannot stat %s: %s", tailed.path, exc)
                continue
            if change == "rotated":
                tailed.phase = Phase.DRAINING
                tailed.rotated_at = now
                self._counters.rotations += 1
                # The rotated file keeps its place in _by_inode: if a glob matches its new
                # name, it is still this source and not a new file.
                log.info("%s was rotated away; reading it to its end", tailed.path)
                self._discover()
            elif change == "truncated":
                self._on_truncated(tailed)

    def _on_truncated(self, tailed: TailedFile) -> None:
        """The bytes after our position are not the ones we were reading: a new source.

        With copytruncate this is where the window shows: lines appended after our last read
        and before the truncation are only in the copy, and lines written between the copy
        and the truncation are nowhere.  No tailer can ship them; rename rotation has no such
        window.  What we read before the truncation is still sent under the old source.
        """
        self._counters.truncations += 1
        log.warning(
            "%s was truncated or replaced at byte %d (size now %d); shipping its new contents "
            "as a new source",
            tailed.path,
            tailed.read_pos,
            tailed.size,
        )
        tailed.phase = Phase.CLOSING
        tailed.retire_reason = "truncated"
        key = (tailed.identity.dev, tailed.identity.ino)
        if self._by_inode.get(key) is tailed:
            del self._by_inode[key]
        self._discover()

    def _read_all(self, now: float) -> None:
        room = self.config.memory_bytes - self._buffered
        per_file_cap = 2 * self.config.request_bytes
        for tailed in self._files.values():
            if room <= 0:
                break
            if not tailed.wants_read():
                continue
            held = tailed.pending_bytes + tailed.in_flight_bytes
            budget = min(room, per_file_cap - held)
            if budget <= 0:
                continue
            chunks_before = len(tailed.pending)
            try:
                cut = tailed.read(budget, now)
            except OSError as exc:
                log.warning("cannot read %s: %s", tailed.path, exc)
                continue
            if tailed.entry.codec != "raw":
                # Compress while earlier chunks are on the wire, not when the request is made.
                for index in range(chunks_before, len(tailed.pending)):
                    chunk = tailed.pending[index]
                    chunk.encoded = self._compressors.submit(
                        compress, tailed.entry.codec, chunk.data
                    )
            if cut:
                if not self._counters.first_read_at:
                    self._counters.first_read_at = time.time()
                room -= cut
                self._buffered += cut
                self._counters.read_bytes += cut
                self._last_activity = now

    def _let_go_of_quiet_files(self, now: float) -> None:
        for tailed in list(self._files.values()):
            if tailed.phase is Phase.DRAINING and tailed.session_ready:
                if now - tailed.quiet_since() < self.config.rotate_wait_s:
                    continue
                if tailed.read_pos < tailed.size and not tailed.pending and not tailed.in_flight:
                    # The writer moved on: a last line without its newline is sent as is.
                    cut = tailed.read(tailed.size - tailed.read_pos + 1, now, final=True)
                    self._buffered += cut
                    self._counters.read_bytes += cut
                if tailed.read_pos >= tailed.size and not tailed.pending and not tailed.in_flight:
                    st = os.fstat(tailed.fd)
                    tailed.retire_reason = "rotated" if st.st_nlink > 0 else "deleted"
                    self._retire(tailed)
            elif tailed.phase is Phase.CLOSING and not tailed.pending and not tailed.in_flight:
                self._retire(tailed)

    def _retire(self, tailed: TailedFile) -> None:
        log.info(
            "letting go of %s (%s) at byte %d", tailed.path, tailed.retire_reason, tailed.acked
        )
        self._counters.retired[tailed.retire_reason] = (
            self._counters.retired.get(tailed.retire_reason, 0) + 1
        )
        pos = self._position_of(tailed)
        self._retire_position(pos, tailed.retire_reason, tailed.size)
        key = (tailed.identity.dev, tailed.identity.ino)
        if self._by_inode.get(key) is tailed:
            del self._by_inode[key]
        del self._files[tailed.source_id]
        tailed.close()
        self._save_state()

    def _retire_position(self, pos: SourcePosition, reason: str, size: int) -> None:
        self._state.sources.pop(pos.source_id, None)
        self._state.retired.append(
            RetiredSource(
                source_id=pos.source_id,
                dev=pos.dev,
                ino=pos.ino,
                fingerprint=pos.fingerprint,
                generation=pos.generation,
                reason=reason,
                retired_at=time.time(),
                size=size,
            )
        )
        self._state_dirty = True

    def _prune_retired(self) -> None:
        horizon = time.time() - _RETIRED_KEEP_S
        kept = [r for r in self._state.retired if r.retired_at >= horizon]
        self._state.retired = kept[-_RETIRED_KEEP_COUNT:]

    # -- sessions -------------------------------------------------------------------------------
    def _open_pending_sessions(self) -> None:
        if self._sessions_in_flight:
            return
        waiting = [
            t
            for t in self._files.values()
            if not t.session_ready and t.phase is not Phase.DONE and not t.in_flight
        ]
        if not waiting:
            return
        waiting = waiting[:5000]
        sessions = [t.meta.as_dict() for t in waiting]
        future = self._pool.submit(self._client.open_sessions, sessions)
        job = _SessionJob(waiting, future)
        self._sessions_in_flight += 1
        future.add_done_callback(lambda _f: self._finished(job))

    def _on_sessions(self, job: _SessionJob, results: list[dict[str, Any]]) -> None:
        for tailed, result in zip(job.files, results, strict=True):
            if tailed.phase is Phase.DONE or tailed.source_id not in self._files:
                continue
            last_seqno = int(result.get("last_seqno", 0))
            tailed.topic = str(result.get("topic", ""))
            tailed.partition = int(result.get("partition", -1))
            size = os.fstat(tailed.fd).st_size
            epoch = result.get("epoch")
            epoch = int(epoch) if isinstance(epoch, int) else None
            if last_seqno > size:
                # The log holds more of this identity than the file has: not the file we
                # shipped before (truncated while we were down).  Start a new generation.
                log.warning(
                    "gateway holds %d bytes of %s but the file has %d: starting a new source",
                    last_seqno,
                    tailed.source_id,
                    size,
                )
                self._buffered -= tailed.drop_pending()
                tailed.resume_at(last_seqno, epoch)
                tailed.size = size
                self._on_truncated(tailed)
                continue
            self._buffered -= tailed.drop_pending()
            tailed.resume_at(last_seqno, epoch)
            tailed.size = size
            self._state_dirty = True

    # -- sending --------------------------------------------------------------------------------
    def _sendable(self) -> list[TailedFile]:
        depth = self.config.pipeline_depth
        return [
            t
            for t in self._files.values()
            if t.session_ready and t.pending and t.in_flight < (1 if t.pipeline_blocked else depth)
        ]

    def _dispatch(self, now: float) -> float:
        """Send what is ready; return how long the oldest unsent chunk may still linger."""
        linger_s = self.config.linger_ms / 1000.0
        stopping = self._stop.is_set()
        while self._writes_in_flight < self.config.max_in_flight:
            ready = self._sendable()
            if not ready:
                return self.config.poll_interval_s
            total = sum(t.pending_bytes for t in ready)
            oldest = min(t.pending[0].read_at for t in ready)
            if total < self.config.request_bytes and now - oldest < linger_s and not stopping:
                return linger_s - (now - oldest)
            ready.sort(key=lambda t: t.pending[0].read_at)
            room = self.config.request_bytes
            sections: list[tuple[TailedFile, list[Chunk]]] = []
            for tailed in ready:
                if room <= 0:
                    break
                chunks = tailed.take(room)
                room -= sum(len(c.data) for c in chunks)
                sections.append((tailed, chunks))
            self._submit_write(sections)
        return self.config.poll_interval_s

    def _submit_write(self, sections: list[tuple[TailedFile, list[Chunk]]]) -> None:
        payload = [(t.section_meta(chunks), t.entry.codec, chunks) for t, chunks in sections]
        future = self._pool.submit(self._send_write, payload)
        job = _WriteJob(sections, future)
        self._writes_in_flight += 1
        future.add_done_callback(lambda _f: self._finished(job))

    def _send_write(self, payload: list[tuple[bytes, str, list[Chunk]]]) -> dict[str, Any]:
        """Runs in a sender thread: compress, frame, POST until acknowledged."""
        sections = [
            (
                meta,
                [WireChunk(c.seqno, c.create_time_ms, _encoded(codec, c)) for c in chunks],
            )
            for meta, codec, chunks in payload
        ]
        body = encode_write_body(sections)
        self.metrics.observe_request_bytes(len(body))
        return self._client.write(body)

    def _finished(self, job: _WriteJob | _SessionJob) -> None:
        self._results.put(job)
        self._wake()

    def _collect(self) -> None:
        while True:
            try:
                job = self._results.get_nowait()
            except queue.Empty:
                return
            if isinstance(job, _SessionJob):
                self._sessions_in_flight -= 1
                try:
                    self._on_sessions(job, job.future.result())
                except (Stopped, concurrent.futures.CancelledError):
                    continue
                except Exception as exc:  # the next tick asks again
                    log.error("opening sessions failed: %s", exc)
                continue
            self._writes_in_flight -= 1
            try:
                answer = job.future.result()
            except (Stopped, concurrent.futures.CancelledError):
                self._abandon(job)
                continue
            except Exception as exc:  # chunks go back, sent again
                log.error("write failed: %s", exc)
                self._abandon(job)
                continue
            self._on_write(job, answer)

    def _abandon(self, job: _WriteJob) -> None:
        for tailed, chunks in job.sections:
            tailed.finished(chunks)
            self._buffered -= tailed.give_back(chunks)

    def _on_write(self, job: _WriteJob, answer: dict[str, Any]) -> None:
        results = answer.get("results", [])
        by_source = {r.get("source_id"): r for r in results if isinstance(r, dict)}
        now = time.monotonic()
        for tailed, chunks in job.sections:
            tailed.finished(chunks)
            result = by_source.get(tailed.source_id, {})
            acked_seqnos = {
                int(a["seqno"]): a.get("status")
                for a in result.get("acks", [])
                if a.get("status") in ("written", "duplicate")
            }
            if result.get("topic"):
                tailed.topic = str(result["topic"])
                tailed.partition = int(result.get("partition", -1))
            statuses = {a.get("status") for a in result.get("acks", [])}
            if "fenced" in statuses:
                self._on_fenced(tailed, chunks)
                continue
            if "out_of_order" in statuses:
                self._on_out_of_order(tailed, chunks)
                continue
            unacked: list[Chunk] = []
            for chunk in chunks:
                status = acked_seqnos.get(chunk.seqno)
                if status is None:
                    unacked.append(chunk)
                    continue
                tailed.on_acked(chunk.seqno)
                self._buffered -= len(chunk.data)
                self._counters.acked_bytes += len(chunk.data)
                self._counters.acked_chunks += 1
                if status == "duplicate":
                    self._counters.duplicate_chunks += 1
            if not tailed.in_flight:
                tailed.pipeline_blocked = False
            if unacked:
                log.error(
                    "gateway did not acknowledge %d chunks of %s; sending them again",
                    len(unacked),
                    tailed.source_id,
                )
                self._buffered -= tailed.give_back(unacked)
            self._state_dirty = True
        self._last_activity = now
        self._counters.last_ack_at = time.time()

    def _on_out_of_order(self, tailed: TailedFile, chunks: list[Chunk]) -> None:
        """The section was refused because the log does not yet hold what precedes it."""
        self._counters.out_of_order += 1
        if tailed.in_flight:
            # It overtook its predecessor, which is still in flight: send it again after.
            tailed.pipeline_blocked = True
            self._buffered -= tailed.give_back(chunks)
            return
        # Nothing of ours precedes it: the log ends below what it acknowledged to us (its
        # data was lost or replaced).  Its last seqno is the truth: resume from there.
        log.error(
            "the log holds less of %s than it acknowledged (below byte %d); resuming from "
            "the gateway's position",
            tailed.source_id,
            chunks[0].start,
        )
        self._buffered -= sum(len(c.data) for c in chunks) + tailed.drop_pending()
        tailed.session_ready = False

    def _on_fenced(self, tailed: TailedFile, chunks: list[Chunk]) -> None:
        """Another session of this source started after ours: nothing of ours was written.

        That is another client shipping the same file (or a clock-skewed restart of this one).
        Open the session again (fencing in turn) and resume from the gateway's last seqno:
        whoever writes has read the log's end after its fence, so no bytes are written twice.
        """
        log.error(
            "writes of %s were fenced by a newer session (is another client shipping this "
            "file?); reopening the session and resuming from the gateway's position",
            tailed.source_id,
        )
        self._buffered -= sum(len(c.data) for c in chunks) + tailed.drop_pending()
        tailed.session_ready = False
        self._counters.fenced += 1

    # -- state, status, metrics -----------------------------------------------------------------
    def _position_of(self, tailed: TailedFile) -> SourcePosition:
        return SourcePosition(
            source_id=tailed.source_id,
            entry_path=tailed.entry.path,
            first_path=tailed.first_path,
            path=tailed.path,
            dev=tailed.identity.dev,
            ino=tailed.identity.ino,
            fingerprint=tailed.identity.fingerprint,
            generation=tailed.generation,
            log_type=tailed.entry.log_type,
            codec=tailed.entry.codec,
            acked=tailed.acked,
            size=tailed.size,
            pending_since=tailed.pending_since,
        )

    def _sync_state_positions(self) -> None:
        """Copy acked positions into the state.  Only acked positions: never ahead of the log."""
        for tailed in self._files.values():
            if tailed.phase is Phase.DONE:
                continue
            known = self._state.sources.get(tailed.source_id)
            if not tailed.session_ready and known is not None:
                continue
            self._state.sources[tailed.source_id] = self._position_of(tailed)

    def _save_state(self) -> None:
        self._sync_state_positions()
        self._prune_retired()
        self._state_file.save(self._state)
        self._state_dirty = False

    def _last_status(self) -> bytes:
        """The status document as last published (read from the metrics server's thread)."""
        return self._status_document

    def _publish_status(self, *, running: bool) -> None:
        rows = [file_row(t) for t in self._files.values() if t.phase is not Phase.DONE]
        stats = self._client.stats
        document = status_document(
            pid=os.getpid(),
            running=running,
            started_at=self.started_at,
            servers=list(self.config.servers),
            last_error=stats.last_error,
            last_error_at=stats.last_error_at,
            files=rows,
        )
        self._status_document = document
        try:
            write_atomically(self.state_dir / STATUS_NAME, document, durable=False)
            write_atomically(
                self.state_dir / "metrics.prom", self._render_metrics().encode(), durable=False
            )
        except OSError as exc:
            log.warning("cannot write status: %s", exc)
        if self._progress is not None and running:
            backlog = sum(t.lag_bytes for t in self._files.values())
            self._progress.update(self._counters.acked_bytes, backlog)

    def _render_metrics(self) -> str:
        files = [t for t in self._files.values() if t.phase is not Phase.DONE]
        return self.metrics.render(
            counters=self._counters,
            stats=self._client.stats,
            files=files,
            buffered=self._buffered,
            in_flight=self._writes_in_flight,
        )
