"""The push-client's loop: find files, read them, ship chunks, save acknowledged positions.

One thread (the loop) owns every file and every position; sender threads only move bytes
over HTTP and hand the gateways' answers back through a queue and a pipe that wakes the loop.
The stages are modules of their own: ``files`` (finding, reading, rotation, letting go),
``shipper`` (sessions, writes and their answers), ``installations`` and ``handover`` (where
data goes across installations), ``parking`` (files the gateway refuses), ``state_file``,
``status`` and ``metrics``.  This module starts and stops them, runs the loop, reloads the
configuration on SIGHUP, and saves the state.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import logging
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from delivery.installations import MixedInstallations
from log_store.errors import LogbrokerError
from log_store.open_files import raise_open_files_limit
from push_client.audit_publishing import PushAuditCounts, PushAuditPublishers
from push_client.backoff import CLOSE_WAIT_S
from push_client.config import PushConfig
from push_client.discovery import ChangeWatcher, directory_entries, expand, watch_root
from push_client.files import Counters, FileSet
from push_client.gateway_check import GatewayCheck
from push_client.identity import display_path
from push_client.installations import InstallationSet
from push_client.lag_report import LagReporter
from push_client.metrics import MetricsServer, PushCollector, PushMetrics
from push_client.parking import ParkingLot
from push_client.progress import ProgressBar
from push_client.service_notify import notify_service_manager
from push_client.shipper import Shipper, census_all
from push_client.state_file import PushState, StateFile, write_atomically
from push_client.status import (
    STATUS_NAME,
    FileRows,
    gateway_errors,
    installation_rows,
    status_content,
    status_document,
    unreadable_row,
)
from push_client.tailer import Phase, TailedFile
from push_client.token import BearerToken, read_plain
from push_client.transport import CONNECT_TIMEOUT_S, GatewayClient, TransportStats

log = logging.getLogger("logbroker.push")
AUDIT_STOP_S = 2.0
"""How long a stopping client gives the audit's last publish (the gateway may hang)."""
_REQUEST_THREADS = ("push-send", "push-owners")
"""Pool threads that may be stuck in a request to a hung gateway (an executor's threads hold
the interpreter's exit until they end)."""

_STATE_SAVE_INTERVAL_S = 0.5
_STATUS_INTERVAL_S = 1.0
_TOKEN_CHECK_INTERVAL_S = 1.0
_MIN_RESCAN_GAP_S = 0.02


_RESTART_ONLY = (
    "failover_after_s",
    "graphite",
    "graphite_interval_s",
    "graphite_prefix",
    "inotify",
    "max_backoff_s",
    "max_in_flight",
    "metrics_port",
    "position_wait_s",
    "probe_interval_s",
    "probe_max_interval_s",
    "request_timeout_s",
    "servers",
    "stall_after_s",
    "state_dir",
)
"""Settings the running parts took at start (connections, watchers, the metrics port): a
reload keeps them, and says so."""


def _shown(value: Any) -> str:
    return ", ".join(value) if isinstance(value, tuple) else str(value)


def _run_asked(asked: queue.SimpleQueue[Callable[[], None] | None]) -> None:
    """Run what the signal handlers asked for (a stop, a reload), in order, until None."""
    while (call := asked.get()) is not None:
        try:
            call()
        except Exception:  # the next signal's stop must still be run
            log.exception("acting on a signal")


class CannotStart(LogbrokerError):
    """The client cannot run with this configuration on this host: its state directory or
    its metrics port cannot be used.  Nothing was shipped, nothing was written."""


class StateDirBusy(CannotStart):
    """Another push-client holds the state directory."""


class PushDaemon:
    """Ships the configured files until :meth:`stop`; see the module docstring.

    ``reload`` builds the configuration again (from the same file and flags); SIGHUP calls it
    and applies what can change while running (entries, token, timings).  ``read_token``
    reads the token file, refusing one that must not be used (see :class:`BearerToken`).
    """

    def __init__(
        self,
        config: PushConfig,
        *,
        idle_exit_s: float | None = None,
        progress: bool | None = None,
        reload: Callable[[], PushConfig] | None = None,
        read_token: Callable[[Path], str] = read_plain,
    ) -> None:
        self.config = config
        self.idle_exit_s = idle_exit_s
        self._exit_code = 0
        """1 if ``idle_exit_s`` ended the run with files parked (refused, so not shipped)."""
        self.state_dir = config.state_dir
        self._reload_config = reload
        self._reload_requested = False
        self._stop = threading.Event()
        self._stop_started: float | None = None
        self._gave_up = False
        """A one-shot run ended because no gateway answered (see :meth:`_give_up`)."""
        self._one_shot_ended = False
        """A one-shot run ended by itself, idle (see :meth:`_end_one_shot_run`)."""
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Reentrant: the SIGTERM handler wakes the loop from the thread that may hold it.
        self._wake_lock = threading.RLock()
        self._token = BearerToken(config.token, config.token_file, read_token)
        self._stats = TransportStats()
        self._check = GatewayCheck(config.installations, self._token)
        self._installations = InstallationSet(
            config.installations,
            probe_interval_s=config.probe_interval_s,
            probe_max_interval_s=config.probe_max_interval_s,
            wake=self._wake,
            check=self._check,
        )
        multi = self._installations.multi
        self._clients = {
            member.name: GatewayClient(
                member.spec.servers,
                token=self._token,
                stop=self._stop,
                stats=self._stats,
                max_backoff_s=config.max_backoff_s,
                pool_size=config.max_in_flight + 2,
                failover_after_s=config.failover_after_s if multi else None,
                is_down=member.is_down,
                request_timeout_s=config.request_timeout_s,
                stall_after_s=config.stall_after_s,
                probe_interval_s=config.probe_interval_s,
                probe_max_interval_s=config.probe_max_interval_s,
                group=member.name,
                check=self._check,
            )
            for member in self._installations.members
        }
        self._compressors = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="push-compress"
        )
        self._watcher = ChangeWatcher(config.inotify)
        self._state = PushState()
        self._state_file = StateFile(self.state_dir)
        self._state_dir_errors: dict[str, str] = {}
        """What could not be written to the state dir ("positions", "status"): the error."""
        self._counters = Counters()
        self.metrics = PushMetrics()
        self._files = FileSet(
            config,
            self._state,
            self._counters,
            self._watcher,
            self._compressors,
            on_retired=self._save_state,
        )
        self._files.multi = multi
        self._parking = ParkingLot(config.park_retry_s)
        self._audit_counts = PushAuditCounts(self.state_dir, multi=multi)
        self._shipper = Shipper(
            config,
            self._files,
            self._counters,
            self._installations,
            self._clients,
            self.metrics,
            self._parking,
            stop=self._stop,
            wake=self._wake,
            save_state=self._save_state,
            audit=self._audit_counts,
        )
        self._lock_fd = -1
        show = sys.stderr.isatty() if progress is None else progress
        self._progress = ProgressBar(sys.stderr) if show else None
        self._metrics_server: MetricsServer | None = None
        self._lag_report: LagReporter | None = None
        self.started_at = time.time()
        self._file_rows = FileRows()
        self._status_content: dict[str, Any] = {}
        """What the status showed last (compared every second: the files are rewritten only
        when it changes)."""
        self._status_changed_at = 0.0
        self._status_checked_at = 0.0
        self._status_on_disk = False
        self._metrics_on_disk: tuple[Any, ...] | None = None
        """The inputs of the metrics in ``metrics.prom`` besides the status's (None: none
        written yet, or the last write failed)."""
        self._audit: PushAuditPublishers | None = None

    # -- public ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to flush what is in flight, save state and return.  Safe from any
        thread; not from a signal handler (it sets an event: see :meth:`run`)."""
        if not self._stop.is_set():
            # Set before the event, so that no sender sees "stopping" without its deadline.
            deadline = time.monotonic() + self.config.shutdown_timeout_s
            for client in self._clients.values():
                client.stop_deadline = deadline
        self._stop.set()
        self._wake()

    def request_reload(self) -> None:
        """Reload the configuration at the next turn of the loop.  Safe from any thread."""
        self._reload_requested = True
        self._wake()

    def requests_abandoned(self) -> bool:
        """After :meth:`run`: whether threads of the client are still stuck in a request
        (a write, a session, an owners' map): the caller exits without waiting for them."""
        return any(
            t.name.startswith(_REQUEST_THREADS) and t.is_alive() for t in threading.enumerate()
        )

    def run(self) -> int:
        """Run until stopped (or idle, with ``idle_exit_s``); return the exit code.

        Raises :class:`CannotStart` (before anything is read or sent) when the state dir or
        the metrics port cannot be used, or the ``--server`` groups' gateways do not belong
        to one installation per group (see ``push_client.gateway_check``).
        """
        self._prepare()
        in_main = threading.current_thread() is threading.main_thread()
        previous: dict[signal.Signals, Any] = {}
        # The handlers hand the stop or reload to a thread of their own: a handler runs in the
        # main thread between two of its instructions, and the stop's Event.set waited forever
        # for the event's lock when the signal came while the main thread held it (a second
        # SIGTERM or Ctrl-C while the client was stopping hung it).
        asked: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        if in_main:
            threading.Thread(
                target=_run_asked, args=(asked,), name="push-signals", daemon=True
            ).start()
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, lambda _s, _f: asked.put(self.stop))
            previous[signal.SIGHUP] = signal.signal(
                signal.SIGHUP, lambda _s, _f: asked.put(self.request_reload)
            )
        # Ready once a SIGHUP is a reload: a Type=notify unit holds `systemctl reload` back
        # until then.  Before the start's census, which may wait minutes for positions.
        notify_service_manager("READY=1")
        try:
            self._start()
            self._loop()
            self._say_stopped_one_shot_run()
        finally:
            self._shutdown()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            asked.put(None)
        return self._exit_code

    # -- start and stop -------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Take the state dir, load the positions and open the metrics port, or raise
        :class:`CannotStart` with the reason (a traceback told an operator nothing)."""
        raise_open_files_limit()
        try:
            self._check.ask_all()
        except MixedInstallations as exc:
            raise CannotStart(str(exc)) from exc
        try:
            self._take_lock()
            loaded = self._state_file.load()
        except OSError as exc:
            self._release_lock()
            raise CannotStart(
                f"cannot use state dir {display_path(str(self.state_dir))}: "
                f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}"
            ) from exc
        self._state.sources, self._state.retired = loaded.sources, loaded.retired
        self._state.clean = loaded.clean
        self._state.saved_at = loaded.saved_at
        self._audit_counts.restore(loaded.audit)
        self.metrics.state_corruptions = self._state_file.corruptions
        if self.config.metrics_port is not None:
            try:
                self._metrics_server = MetricsServer(
                    self.config.metrics_port, self._render_metrics, self._last_status
                )
            except OSError as exc:
                self._release_lock()
                raise CannotStart(
                    f"cannot serve metrics on 127.0.0.1:{self.config.metrics_port}: "
                    f"{exc.strerror or exc}"
                ) from exc

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

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _start(self) -> None:
        self._lag_report = LagReporter(
            # the state dir's absolute path: two clients of one host started with the same
            # relative --state-dir from different directories are two clients
            f"{socket.gethostname()}:{display_path(os.path.abspath(self.state_dir))}",
            self._token,
        )
        for entry in self.config.entries:
            self._watcher.watch(watch_root(entry.path))
        names = self._installations.names
        deadline = time.monotonic() + self.config.position_wait_s
        multi = self._installations.multi

        def census(tailed: TailedFile, name: str) -> None:
            # The installation the source last wrote to may hold more of it than the state
            # says: the last run did not stop cleanly, or the state is older than the last
            # run (restored from a snapshot or a backup, clean and with a valid checksum).
            # Its answer is waited for before the source goes elsewhere; a session there
            # answers it at no cost when it is up (see Shipper.open_pending_sessions).
            tailed.handover.census.add(name)
            tailed.handover.census_deadline = deadline

        # A clean stop no longer spares the census: a clean state cannot tell it is stale.
        self._state.clean = False
        self._files.resume_from_state(names, census)
        found = self._files.discover()
        self._warn_of_empty_entries()
        if multi and not self._state_file.found:
            # No positions (first start, or the state dir was lost): every installation may
            # hold some of every file.  Learn them all before sending anything.
            census_all(found, names, deadline)
        elif multi:
            # A state restored from a snapshot does not know where files went after it: the
            # installations that are up are asked before the first sessions (one request per
            # installation and batch of files; one that is down is not waited for).
            for tailed in self._files:
                tailed.handover.asked_at_start.update(names)
        self._shipper.open_pending_sessions(time.monotonic())
        self._audit = PushAuditPublishers(
            self._audit_counts,
            self._installations,
            self._clients,
            auth_headers=self._token.headers,
        ).start()

    def _warn_of_empty_entries(self) -> None:
        """Say which entries match no file at the start: a mistyped path would otherwise
        look like a client with nothing to do."""
        directories = directory_entries(self.config.entries)
        for entry in self.config.entries:
            if next(expand([entry]), None) is not None:
                continue
            if entry in directories:
                log.warning(
                    "entry %s (log type %s) is a directory, and an entry names files: "
                    "ship the files in it with a glob such as %s",
                    entry.path,
                    entry.log_type,
                    os.path.join(entry.path, "*.log"),
                )
            else:
                log.warning(
                    "entry %s (log type %s) matches no file yet; it is shipped once one appears",
                    entry.path,
                    entry.log_type,
                )

    def _shutdown(self) -> None:
        self._stop.set()
        notify_service_manager("STOPPING=1")
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
        self._files.prune_retired()
        try:
            self._shipper.give_up_in_flight()
            self._files.sync_state_positions()
            self._state.clean = True
            self._save_state()
            self._publish_status(running=False)
            if self._audit is not None:
                # after the positions are safe; a hung gateway costs at most this long
                self._audit.stop(AUDIT_STOP_S)
        finally:
            # Probes and lag reports are never data: one waiting for a gateway that hangs
            # gets a share of one short wait, not a timeout of its own each.
            close_by = time.monotonic() + CLOSE_WAIT_S

            def left() -> float:
                return max(0.0, close_by - time.monotonic())

            self._installations.close(left())
            self._shipper.close()
            self._compressors.shutdown(wait=False, cancel_futures=True)
            for client in self._clients.values():
                client.close(left())
            self._files.close()
            self._audit_counts.close()
            self._watcher.close()
            if self._metrics_server is not None:
                self._metrics_server.close()
            if self._lag_report is not None:
                self._lag_report.close(left())
            with self._wake_lock:
                wake_w, self._wake_w = self._wake_w, -1
                os.close(wake_w)
                os.close(self._wake_r)
            if self._lock_fd >= 0:
                os.close(self._lock_fd)

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        files = self._files
        shipper = self._shipper
        next_rescan = time.monotonic() + self.config.rescan_interval_s
        next_poll = 0.0
        next_full_poll = 0.0
        last_rescan = 0.0
        next_save = 0.0
        next_status = 0.0
        next_token_check = 0.0
        while True:
            now = time.monotonic()
            shipper.collect()
            if self._stop.is_set():
                if self._stop_started is None:
                    self._stop_started = now
                    if not self._gave_up:
                        log.info("stopping: flushing in-flight chunks")
                if now >= max(c.stop_deadline for c in self._clients.values()):
                    if shipper.writes_in_flight:
                        log.warning(
                            "gave up on %d requests in flight; their chunks are sent again "
                            "after the restart",
                            shipper.writes_in_flight,
                        )
                    return
                if shipper.writes_in_flight == 0 and not shipper.sendable():
                    return
            else:
                if self._reload_requested:
                    self._reload()
                if now >= next_token_check:
                    next_token_check = now + _TOKEN_CHECK_INTERVAL_S
                    if self._token.refresh():
                        self._parking.release_all(files, "the token changed", token_only=True)
                shipper.follow_installations()
                changes = self._watcher.drain()
                changed = changes.any
                if changes.moves:
                    files.follow_renames(changes.moves, now)
                if changes.structural or (changed and bool(files.waiting_paths)):
                    # A change right after a rescan is not dropped, only put off for the gap:
                    # a rotated log is re-created empty and written a moment later, and the
                    # write's event was the last one (its lines waited a whole rescan).
                    next_rescan = min(next_rescan, last_rescan + _MIN_RESCAN_GAP_S)
                if now >= next_rescan:
                    files.discover()
                    last_rescan = now
                    next_rescan = now + self.config.rescan_interval_s
                poll_s = self.config.poll_interval_s
                if changed or now >= next_full_poll or not self._watcher.active:
                    files.refresh_all(now)
                    next_poll = now + poll_s
                    next_full_poll = now + max(poll_s, self.config.rescan_interval_s)
                elif now >= next_poll:
                    # The files inotify watches are looked at on their events (and all of
                    # them at the full poll, in case one was missed); an idle client with a
                    # thousand files does not stat each of them four times a second.
                    files.refresh_all(now, watched_too=False)
                    next_poll = now + poll_s
                files.read_all(now)
                files.let_go_of_quiet_files(now)
                files.check_abandoned(now)
                self._parking.release_due(files, now)
                self._parking.report(files, now)
                shipper.open_pending_sessions(now)
            shipper.refresh_owners(now)
            linger_wait = shipper.dispatch(now)
            dirty = shipper.state_dirty or files.unsaved_sources
            if now >= next_save and dirty:
                self._save_state()
                next_save = now + _STATE_SAVE_INTERVAL_S
            if now >= next_status:
                self._publish_status(running=True)
                next_status = now + _STATUS_INTERVAL_S
            if self._idle_done(now):
                self._end_one_shot_run()
                self.stop()
                continue
            stalled = self._stalled(now)
            if stalled is not None:
                self._give_up(now, stalled)
                continue
            timeout = min(
                max(0.0, next_poll - now),
                max(0.0, next_rescan - now),
                linger_wait,
                max(0.0, next_status - now),
                max(0.0, next_save - now) if dirty else 1.0,
            )
            self._wait(timeout)

    def _end_one_shot_run(self) -> None:
        """``idle_exit_s`` ends the run: say what was shipped and what was not, and set the
        exit status (1 if a file was not shipped: parked, unreadable, or named by an entry
        that is a directory)."""
        self._one_shot_ended = True
        self._say_unsent_tails()
        files = self._files
        live = files.live()
        parked = [t for t in live if t.parked is not None]
        directories = directory_entries(self.config.entries)
        for tailed in parked:
            assert tailed.parked is not None
            log.error(
                "%s was not shipped: parked, the gateway refused it: %s",
                tailed.path,
                tailed.parked.refusal,
            )
        for path, miss in sorted(files.unreadable.items()):
            log.error("%s was not shipped: cannot read it: %s", display_path(path), miss.error)
        for entry in directories:
            log.error(
                "entry %s was not shipped: it is a directory, and an entry names files "
                "(a glob such as %s ships the files in it)",
                entry.path,
                os.path.join(entry.path, "*.log"),
            )
        counts = [f"{len(live) - len(parked)} shipped"]
        if parked:
            counts.append(f"{len(parked)} parked (refused by the gateway)")
        if files.unreadable:
            counts.append(f"{len(files.unreadable)} unreadable")
        found = len(live) + len(files.unreadable)
        said = f"of {found} file{'' if found == 1 else 's'} found, {', '.join(counts)}"
        if len(directories) == 1:
            said += "; 1 entry is a directory"
        elif directories:
            said += f"; {len(directories)} entries are directories"
        empty = [
            e.path
            for e in self.config.entries
            if e not in directories and next(expand([e]), None) is None
        ]
        if empty:
            said += f"; no file matched {', '.join(empty)} (not an error: nothing to ship there)"
        if parked or files.unreadable or directories:
            self._exit_code = 1
            log.error("idle for %.1f s: %s; exiting with status 1", self.idle_exit_s, said)
        else:
            log.info(
                "everything acknowledged and idle for %.1f s: %s; exiting", self.idle_exit_s, said
            )

    def _say_stopped_one_shot_run(self) -> None:
        """A one-shot run stopped by a signal before it ended by itself: status 1 unless
        everything it found was acknowledged, so that a cron job or a CI step that was
        stopped (a timeout, a cancel) does not read "all shipped" in a 0."""
        if self.idle_exit_s is None or self._one_shot_ended or self._gave_up:
            return
        files = self._files
        behind = [
            t for t in files.live() if t.parked is not None or t.size - t.unterminated > t.settled
        ]
        if not behind and not files.unreadable:
            return
        self._exit_code = 1
        owed = sum(max(0, t.size - t.unterminated - t.settled) for t in behind)
        unreadable = f", {len(files.unreadable)} unreadable" if files.unreadable else ""
        log.error(
            "stopped before the run was done: %d bytes of %d file%s not acknowledged%s. The "
            "positions of what was acknowledged are saved in %s, and a rerun with the same "
            "state dir resumes there (nothing lost, nothing shipped twice); exiting with "
            "status 1",
            owed,
            len(behind),
            "" if len(behind) == 1 else "s",
            unreadable,
            display_path(str(self.state_dir)),
        )

    def _stalled(self, now: float) -> str | None:
        """With ``idle_exit_s``: the last failure if the run has data to ship and every
        request has failed for :attr:`give_up_after_s` with no gateway answering."""
        if self.idle_exit_s is None or self._stop.is_set() or not self._work_left():
            return None
        return self._stats.stall.stalled(
            now,
            after_s=self.give_up_after_s,
            connect_s=CONNECT_TIMEOUT_S,
            request_timeout_s=self.config.request_timeout_s,
        )

    @property
    def give_up_after_s(self) -> float:
        """How long a one-shot run goes on while every request fails: ``idle_exit_s``, and at
        least two retries at the longest backoff (plus the failover, with installations), so
        that a gateway that restarts meanwhile is found again."""
        floor = 2 * self.config.max_backoff_s
        if self._installations.multi:
            floor += self.config.failover_after_s
        return max(self.idle_exit_s or 0.0, floor)

    def _give_up(self, now: float, failure: str) -> None:
        """End a one-shot run whose gateways do not answer, with status 1 (2 if a gateway
        was refused for belonging to another installation, see ``push_client.gateway_check``):
        what was acknowledged is saved (by the shutdown), what was not is sent by the next run."""
        refusals = self._check.refusals
        code = 2 if refusals else 1
        log.error(
            "no gateway answered for %.1f s (%s), every request failed; last error: %s. "
            "%sGiving up: the positions of what was acknowledged are saved in %s, and a rerun "
            "with the same state dir resumes there (nothing lost, nothing shipped twice); "
            "exiting with status %d",
            now - (self._stats.stall.failing_since or now),
            ", ".join(self.config.servers),
            failure,
            "".join(f"Refused: {r}. " for r in refusals),
            display_path(str(self.state_dir)),
            code,
        )
        self._exit_code, self._gave_up = code, True
        # No flush: the requests in flight fail like the others; the next run sends them.
        for client in self._clients.values():
            client.stop_deadline = now
        self._stop.set()
        self._wake()

    def _work_left(self) -> bool:
        """Whether something still waits for a gateway: a request, data read and not
        acknowledged, or a file whose session is not open yet (parked ones aside)."""
        shipper = self._shipper
        if shipper.writes_in_flight or shipper.session_jobs or self._counters.buffered:
            return True
        return any(not t.session_ready and t.parked is None for t in self._files.live())

    def _say_unsent_tails(self) -> None:
        """A one-shot run ends: name the bytes it leaves in files because their last line has
        no newline yet (a later run sends them once it has), instead of exiting in silence."""
        for tailed in self._files.live():
            if tailed.parked is None and tailed.size > tailed.settled:
                log.warning(
                    "%s: its last %d bytes were not sent: a line without its newline yet (sent "
                    "by a later run once the line is complete)",
                    display_path(tailed.path),
                    tailed.size - tailed.settled,
                )
        for path in sorted(self._files.waiting_paths):
            with contextlib.suppress(OSError):
                size = os.stat(path).st_size
                if size:
                    log.warning(
                        "%s: not sent: its first line has no newline yet (%d bytes)",
                        display_path(path),
                        size,
                    )

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
        if self.idle_exit_s is None or self._stop.is_set() or self._work_left():
            return False
        return now - self._counters.last_activity >= self.idle_exit_s

    # -- reloading ------------------------------------------------------------------------------
    def _reload(self) -> None:
        """SIGHUP: build the configuration again and apply it; a bad one changes nothing."""
        self._reload_requested = False
        if self._reload_config is None:
            log.warning("SIGHUP: no configuration to reload")
            return
        try:
            new = self._reload_config()
        except LogbrokerError as exc:
            log.error("SIGHUP: the configuration is invalid, keeping the running one: %s", exc)
            return
        old = self.config
        kept = [key for key in _RESTART_ONLY if getattr(new, key) != getattr(old, key)]
        if kept:
            log.warning(
                "SIGHUP: %s change only with a restart; keeping the running %s",
                ", ".join(kept),
                "; ".join(f"{key} = {_shown(getattr(old, key))}" for key in kept),
            )
            new = replace(new, **{key: getattr(old, key) for key in kept})
        self.config = new
        self._shipper.config = new
        if (new.direct_to_owner, new.owner_refresh_s) != (
            old.direct_to_owner,
            old.owner_refresh_s,
        ):
            self._shipper.configure_owners()
        self._files.apply_config(new)
        self._parking.retry_s = new.park_retry_s
        self._token.replace(new.token, new.token_file)
        for entry in new.entries:
            self._watcher.watch(watch_root(entry.path))
        self._files.discover()
        self._parking.release_all(self._files, "configuration reloaded", token_only=False)
        log.info("SIGHUP: configuration reloaded (%d entries)", len(new.entries))

    # -- state, status, metrics -----------------------------------------------------------------
    def _save_state(self) -> None:
        self._files.sync_state_positions()
        self._files.prune_retired()
        # The audit counts of what was acknowledged up to these positions, saved with them.
        self._state.audit = self._audit_counts.to_state()
        try:
            try:
                self._state_file.save(self._state)
            except OSError as exc:
                if not self._remake_state_dir(exc):
                    raise
                self._state_file.save(self._state)
        except OSError as exc:
            # A full or broken state dir costs positions, not shipping: the gateway's last
            # seqnos are the truth.  The state stays dirty, so the next save tries again.
            self.metrics.state_save_failures += 1
            if self._state_dir_trouble("positions", exc) and self._installations.multi:
                self._drop_stale_state()
            return
        self._audit_counts.saved(self._state.audit)
        self._state_dir_recovered("positions", "positions saved again")
        self._shipper.state_dirty = False
        self._files.unsaved_sources = False

    def _remake_state_dir(self, exc: OSError) -> bool:
        """Make the state dir again if it was removed while the client ran (a clean-up, or
        an operator who took it for a stale one), and take its lock anew; True if it did.

        Saving into a directory that is gone failed for good, with no status for
        ``--status`` and no lock to keep a second client out of the same positions.
        """
        if not isinstance(exc, FileNotFoundError) or self.state_dir.exists():
            return False
        self._release_lock()
        try:
            self._take_lock()
        except (OSError, CannotStart) as err:
            log.error("state dir %s was removed and cannot be made again: %s", self.state_dir, err)
            return False
        self._shipper.state_dirty = True
        self._status_on_disk, self._metrics_on_disk = False, None
        log.warning(
            "state dir %s was removed while the client ran; made it again: positions, status "
            "and metrics are written there again (the gateways' last seqnos are the truth for "
            "what was acknowledged meanwhile)",
            self.state_dir,
        )
        return True

    def _state_dir_trouble(self, what: str, exc: OSError) -> bool:
        """Log a failure to write ``what`` once per distinct error; True if it is new."""
        text = f"{exc.strerror or exc}"
        if self._state_dir_errors.get(what) == text:
            return False
        self._state_dir_errors[what] = text
        if what == "positions":
            log.error(
                "cannot save positions in %s: %s; shipping goes on (a restart resumes from "
                "the gateways' last seqnos), saving is tried again every %.1f s",
                self.state_dir,
                text,
                _STATE_SAVE_INTERVAL_S,
            )
        else:
            log.warning("cannot write status in %s: %s", self.state_dir, text)
        return True

    def _state_dir_recovered(self, what: str, message: str) -> None:
        if self._state_dir_errors.pop(what, None) is not None:
            log.info("%s in %s", message, self.state_dir)

    def _drop_stale_state(self) -> None:
        """With several installations, positions older than the acks are worse than none
        (a restart would trust where they say each file went): remove them, so that a
        restart asks every installation instead (see "When the client's positions are lost
        too" in docs/push-client.md)."""
        with contextlib.suppress(OSError):
            self._state_file.path.unlink()
            log.warning(
                "removed the stale %s until positions can be saved again", self._state_file.path
            )

    def _last_status(self) -> bytes:
        """The status document as last published (read from the metrics server's thread)."""
        return status_document(
            self._status_content, self._status_changed_at, self._status_checked_at
        )

    def _publish_status(self, *, running: bool) -> None:
        """Every second: the status and metrics files are rewritten when what they show
        changed, and only touched otherwise (their modification time is when the daemon
        last found them current: node_exporter exports it, and alerts on a stale textfile
        keep working).  Rewriting both for a thousand idle files was most of an idle
        client's CPU."""
        rows = self._file_rows.rows(self._files.live())
        unreadable = [unreadable_row(m) for _, m in sorted(self._files.unreadable.items())]
        failing = {name: client.failing() for name, client in self._clients.items()}
        content = status_content(
            pid=os.getpid(),
            running=running,
            started_at=self.started_at,
            servers=list(self.config.servers),
            installations=installation_rows(self._installations, failing),
            errors=gateway_errors(failing, [c.recovered() for c in self._clients.values()]),
            files=rows,
            unreadable=unreadable,
            token_problem=self._token.problem,
        )
        now = time.time()
        changed = content != self._status_content
        if changed:
            self._status_content, self._status_changed_at = content, now
            self._status_on_disk = False
        self._status_checked_at = now
        if self._lag_report is not None and running:
            current = self._clients[self._installations.current().name]
            self._lag_report.offer(current.current_server, rows + unreadable)
        metrics_inputs = self._metrics_inputs()
        try:
            _write_or_touch(
                self.state_dir / STATUS_NAME,
                not self._status_on_disk,
                lambda: status_document(content, self._status_changed_at),
            )
            self._status_on_disk = True
            _write_or_touch(
                self.state_dir / "metrics.prom",
                changed or metrics_inputs != self._metrics_on_disk,
                lambda: self._render_metrics().encode(),
            )
            self._metrics_on_disk = metrics_inputs
        except OSError as exc:
            self._status_on_disk, self._metrics_on_disk = False, None
            if not self._remake_state_dir(exc):
                self._state_dir_trouble("status", exc)
        else:
            self._state_dir_recovered("status", "status written again")
        if self._progress is not None and running:
            backlog = sum(t.lag_bytes for t in self._files.live())
            self._progress.update(self._counters.acked_bytes, backlog)

    def _metrics_inputs(self) -> tuple[Any, ...]:
        """What the metrics show besides what the status shows (per file: sizes, positions,
        errors, parking, doubts; the installations and failing gateways): the counters and
        gauges of :meth:`_metrics_state`, cheap to gather every second."""
        stats = self._stats
        with stats.lock:
            transport = (
                sorted(stats.requests.items()),
                sorted(stats.owner_writes.items()),
                sorted(stats.owner_partitions.items()),
                stats.retries,
                stats.failovers,
            )
        m = self.metrics
        return (
            dataclasses.astuple(self._counters),
            transport,
            (
                m.request_bytes_total,
                m.requests_sent,
                m.state_corruptions,
                m.state_save_failures,
                m.overlap_bytes,
            ),
            self._shipper.writes_in_flight,
            self._installations.version,
            self._installations.failovers,
            self._parking.parked_total,
            self._files.abandoned.total,
        )

    def _render_metrics(self) -> str:
        return self.metrics.render(**self._metrics_state())

    def metrics_collector(self) -> PushCollector:
        """The metrics as a prometheus_client collector, read at each collection."""
        return PushCollector(lambda: self.metrics.families(**self._metrics_state()))

    def _metrics_state(self) -> dict[str, Any]:
        return dict(
            counters=self._counters,
            stats=self._stats,
            files=[t for t in self._files.live() if t.phase is not Phase.DONE],
            buffered=self._counters.buffered,
            in_flight=self._shipper.writes_in_flight,
            installations=self._installations,
            failing_gateways={name: client.failing() for name, client in self._clients.items()},
            parked_total=self._parking.parked_total,
            abandoned_bytes=self._files.abandoned.total,
            unreadable=list(self._files.unreadable.values()),
        )


def _write_or_touch(path: Path, changed: bool, render: Callable[[], bytes]) -> None:
    """Write ``render()`` to ``path`` if ``changed`` (or the file is gone), else set its
    modification time to now."""
    if not changed:
        try:
            os.utime(path)
            return
        except FileNotFoundError:
            pass  # removed by someone: written again
    write_atomically(path, render(), durable=False)
