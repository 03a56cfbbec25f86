"""Sessions and writes: what goes to which installation, and what the answers mean.

Sender threads only move bytes over HTTP; they hand every answer back through a queue (and a
wake-up of the loop), and the loop thread applies it here.  Per file:

- a *session* (``POST /v1/sessions``, batched) tells where the log ends for the source; the
  file resumes there.  Which installation, and whether to hand the source over or settle a
  doubt first, is ``push_client.handover``'s decision;
- *writes* carry chunks of many files (of one installation) per request.  Every section names
  ``prev_seqno`` (where its first chunk starts), so up to ``pipeline_depth`` requests of one
  file may be in flight, and one that overtakes its predecessor is refused (``out_of_order``)
  and sent again after it.  Sessions fence (``epoch``), so a request of a killed earlier
  incarnation cannot land after we resumed.

Answers: acks move positions; ``fenced`` or a lost prefix reopen the session; a refused
section or session parks its file (``push_client.parking``); a refused request of several
files sends each of them alone until the culprit is parked; a 503 ``partition_unavailable``
holds back the files it names until their partition has an owner again
(``push_client.partition_outage``) and sends the others again at once; a request to an
installation that went down leaves its ranges in doubt there.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from audit.windows import count_lines
from push_client.audit_publishing import PushAuditCounts
from push_client.backoff import Backoff
from push_client.codec import compress
from push_client.config import PushConfig
from push_client.files import Counters, FileSet
from push_client.handover import Overlap
from push_client.identity import display_path
from push_client.installations import Installation, InstallationSet
from push_client.metrics import PushMetrics
from push_client.owner_routes import OwnerPolicy, OwnerRoutes
from push_client.parking import LOG_EVERY_S, ParkingLot, Refusal, same_refusal
from push_client.partition_outage import PartitionOutage, PartitionOutages
from push_client.tailer import Chunk, Phase, TailedFile
from push_client.transport import (
    PARTITION_UNAVAILABLE,
    GatewayClient,
    InstallationUnavailable,
    PartitionsUnavailable,
    Refused,
    Stopped,
)
from push_client.wire import WireChunk, encode_write_body

log = logging.getLogger("logbroker.push")

MAX_SESSIONS_PER_REQUEST = 5000
MAX_SESSION_JOBS = 2
_OWNER_CHECK_INTERVAL_S = 0.5
_MIN_CHUNK_BYTES = 4096
"""The smallest chunk cut for a gateway that refuses larger ones (config's chunk_bytes floor)."""
_STATED_LIMIT = re.compile(r"over the limit of (\d+) bytes")


def encoded_for(codec: str, chunk: Chunk) -> bytes | memoryview:
    """The chunk's data as its section sends it: compressed by ``codec``."""
    if chunk.encoded is not None and chunk.encoded_with == codec:
        return chunk.encoded.result()
    return compress(codec, chunk.data)


@dataclass(eq=False)
class _WriteJob:
    installation: Installation
    sections: list[tuple[TailedFile, list[Chunk]]]
    future: concurrent.futures.Future[dict[str, Any]] = field(init=False)
    probe: PartitionOutage | None = None
    """The partition outage this request probes (its one file waits for that partition)."""
    behind: list[bool] = field(init=False)
    """Per section: whether, when it was sent, chunks before it were not acknowledged yet
    (it was pipelined behind them, so an ``out_of_order`` answer means it overtook them)."""

    def __post_init__(self) -> None:
        self.behind = [tailed.acked < chunks[0].start for tailed, chunks in self.sections]


@dataclass(eq=False)
class _SessionJob:
    installation: Installation
    census: bool
    """Only asking where the log ends there (no fence, no handover)."""
    files: list[TailedFile]
    future: concurrent.futures.Future[list[dict[str, Any]]] = field(init=False)


class Shipper:
    """Opens sessions, sends chunks and applies the answers; owned by the loop thread."""

    def __init__(
        self,
        config: PushConfig,
        files: FileSet,
        counters: Counters,
        installations: InstallationSet,
        clients: dict[str, GatewayClient],
        metrics: PushMetrics,
        parking: ParkingLot,
        *,
        stop: threading.Event,
        wake: Callable[[], None],
        save_state: Callable[[], None],
        audit: PushAuditCounts,
    ) -> None:
        self.config = config
        self.files = files
        self.counters = counters
        self.installations = installations
        self.clients = clients
        self.metrics = metrics
        self.parking = parking
        self._stop = stop
        self._wake = wake
        self._save_state = save_state
        self._results: queue.SimpleQueue[_WriteJob | _SessionJob] = queue.SimpleQueue()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.max_in_flight + MAX_SESSION_JOBS, thread_name_prefix="push-send"
        )
        self.writes: set[_WriteJob] = set()
        self.session_jobs = 0
        self.state_dirty = False
        self._said_cuts: set[int] = set()
        """The chunk sizes a refusal made files cut at, said once each."""
        self._said_census_refusals: set[tuple[str, str]] = set()
        """(installation, refusal) of census answers that were refusals, said once each."""
        self._seen_version = installations.version
        self._seen_current = installations.current().name
        self.audit = audit
        """The chunks sent and the lines each installation's log holds, per topic and window
        of their create time (tier push-client, see :mod:`push_client.audit_publishing`)."""
        self.outages = PartitionOutages(config.max_backoff_s, config.max_in_flight - 1)
        """Partitions without a reachable owner, and the files waiting for each."""
        self.owner_routes: dict[str, OwnerRoutes] = {}
        """Per installation, the partitions' owners (only with ``direct_to_owner``)."""
        self.configure_owners()
        self._next_owner_check = 0.0
        # An idle client learns no installation's health from requests: probe the idle ones.
        installations.watch_idle(config.failover_after_s)
        self._refresher = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="push-owners"
        )

    @property
    def writes_in_flight(self) -> int:
        return len(self.writes)

    @property
    def multi(self) -> bool:
        return self.installations.multi

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._refresher.shutdown(wait=False, cancel_futures=True)

    def _finished(self, job: _WriteJob | _SessionJob) -> None:
        self._results.put(job)
        self._wake()

    # -- installations --------------------------------------------------------------------------
    def follow_installations(self) -> None:
        """An installation went down or came back: move each file to where it belongs now."""
        if self.installations.version == self._seen_version:
            return
        self._seen_version = self.installations.version
        current = self.installations.current().name
        if current != self._seen_current:
            # A refusal is one installation's answer (a token one data center does not take):
            # a file parked by the one left is tried at the one written to now, not only
            # after park_retry_s (it waited up to a minute after its own data center came back).
            self._seen_current = current
            self.parking.release_all(
                self.files, f"its data goes to installation {current} now", token_only=False
            )
        for tailed in self.files:
            if not tailed.session_ready:
                continue
            if self._target(tailed) != tailed.session_installation:
                tailed.session_ready = False
                self.outages.forget(tailed)  # a partition of the installation it leaves
                self.counters.buffered -= tailed.drop_pending()

    # -- sessions -------------------------------------------------------------------------------
    def open_pending_sessions(self, now: float) -> None:
        groups: dict[tuple[str, bool], list[TailedFile]] = {}
        alone: list[tuple[str, bool, TailedFile]] = []
        current = self.installations.current().name
        for tailed in self.files:
            if (
                tailed.session_ready
                or tailed.session_asked
                or tailed.session_retry_at > now
                or tailed.phase is Phase.DONE
                or tailed.in_flight
                or tailed.parked is not None
                or tailed.handover.has_failures
            ):
                continue
            plan = tailed.handover
            census = False
            if self.multi and plan.census:
                if not plan.census_pending(now):
                    log.warning(
                        "%s: installations %s did not answer within position_wait_s; going "
                        "on from byte %d (lines they hold beyond it may be written twice)",
                        tailed.path,
                        ", ".join(plan.census_missed()),
                        plan.frontier,
                    )
                    plan.census.clear()
                elif plan.census != {plan.target(current, self.installations.is_up)}:
                    name = next(
                        (n for n in sorted(plan.census) if self.installations.is_up(n)), None
                    )
                    if name is None:
                        continue  # wait for one of them to come back
                    target, census = name, True
                # else: the session goes to the one installation asked anyway, and its answer
                # is the census's (a clean restart with every installation up costs nothing)
            if not census:
                target = plan.target(current, self.installations.is_up) if self.multi else current
                if self.multi and plan.asked_at_start:
                    asked = plan.to_ask(target, self.installations.is_up)
                    if asked is not None:
                        target, census = asked, True
            if tailed.alone:
                alone.append((target, census, tailed))
            else:
                groups.setdefault((target, census), []).append(tailed)
        batches = [(name, census, files) for (name, census), files in groups.items()]
        batches += [(name, census, [tailed]) for name, census, tailed in alone]
        for name, census, batch in batches:
            if self.session_jobs >= MAX_SESSION_JOBS:
                return
            member = self.installations.get(name)
            if member is None or not member.up:
                continue  # every installation is down: the prober says when one is back
            self._submit_sessions(member, census, batch[:MAX_SESSIONS_PER_REQUEST])

    def _submit_sessions(self, member: Installation, census: bool, files: list[TailedFile]) -> None:
        multi = self.multi
        sessions: list[dict[str, Any]] = []
        for tailed in files:
            tailed.session_asked = True
            request: dict[str, Any] = dict(tailed.meta.as_dict())
            if not census:
                request.update(tailed.handover.session_fields(member.name, multi))
            sessions.append(request)
        job = _SessionJob(member, census, files)
        job.future = self._pool.submit(self.clients[member.name].open_sessions, sessions)
        self.session_jobs += 1
        job.future.add_done_callback(lambda _f: self._finished(job))

    def _target(self, tailed: TailedFile) -> str:
        current = self.installations.current().name
        return tailed.handover.target(current, self.installations.is_up) if self.multi else current

    def _on_sessions(self, job: _SessionJob, results: list[dict[str, Any]]) -> None:
        job.installation.answered()
        name = job.installation.name
        moved = False
        for tailed, result in zip(job.files, results, strict=True):
            if tailed.phase is Phase.DONE or tailed.source_id not in self.files.files:
                continue
            if not job.census and "error" not in result and self._target(tailed) != name:
                continue  # the installations changed meanwhile: ask where it belongs now
            if "error" in result:
                refusal = Refusal.from_result(result)
                if not (job.census and self._census_refused(tailed, name, refusal)):
                    self._park(tailed, refusal)
                continue
            last_seqno = int(result.get("last_seqno", 0))
            if not tailed.in_flight:
                # chunks sent there whose answer never came (before a restart too) are in
                # its log up to last_seqno: counted for the audit now
                self.audit.settle(name, tailed.source_id, last_seqno)
            if job.census:
                self._say_overlap(tailed, tailed.handover.on_census(name, last_seqno))
                continue
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
                self.counters.buffered -= tailed.drop_pending()
                tailed.resume_at(last_seqno, epoch)
                tailed.size = size
                self.files.on_truncated(tailed)
                continue
            before = tailed.handover.installation
            step = tailed.handover.on_session(name, last_seqno, self.multi)
            self._say_overlap(tailed, step.overlap)
            if step.reopen:
                continue
            self.counters.buffered -= tailed.drop_pending()
            tailed.resume_at(step.resume_at, epoch)
            self.outages.forget(tailed)  # its partition's owner answered the session
            tailed.session_installation = name
            if tailed.session_refusal:
                log.info("%s: the gateway takes it again", tailed.path)
            tailed.session_refusal, tailed.session_backoff = "", None
            tailed.size = size
            if step.until is not None:
                log.info(
                    "%s: resending bytes %d..%d to %s, which went down before it answered",
                    tailed.path,
                    step.resume_at,
                    step.until,
                    name,
                )
            elif before and before != name:
                log.info(
                    "%s: handed over from %s to %s at byte %d",
                    tailed.path,
                    before,
                    name,
                    step.resume_at,
                )
            moved = moved or before != tailed.handover.installation
            self.state_dirty = True
        if moved and self.multi:
            # Where a source's newest data goes is durable before the first byte goes there:
            # a restart must know which installation may hold more than the state says.
            self._save_state()

    def _say_overlap(self, tailed: TailedFile, overlap: Overlap | None) -> None:
        """An installation holds bytes of ``tailed`` that were sent to another one too (the
        client's positions were older than its log): say which, and count them."""
        if overlap is None:
            return
        self.metrics.overlap_bytes += overlap.size
        log.error(
            "source %s (%s): installation %s holds it beyond byte %d, from which it was sent "
            "to installation %s: bytes %d..%d (%d bytes) are in both %s and %s, written twice "
            "(the client's positions were older than %s's log: a state dir restored from a "
            "snapshot or a backup, or %s was down past position_wait_s)",
            tailed.source_id,
            display_path(tailed.path),
            overlap.installation,
            overlap.start,
            overlap.elsewhere,
            overlap.start,
            overlap.end,
            overlap.size,
            overlap.installation,
            overlap.elsewhere,
            overlap.installation,
            overlap.installation,
        )

    def _census_refused(self, tailed: TailedFile, name: str, refusal: Refusal) -> bool:
        """An installation asked only how far it holds ``tailed`` refuses to say, lastingly
        (a token it does not take, say): go on without its position instead of parking the
        file, which the installation written to may well take; False for an answer that may
        pass (408, 429: asked again after a backoff).

        Parking it held every file of a fresh client for good while one other data center
        refused it, though the one written to took it.  An installation only asked at the
        start (``asked_at_start``, not waited for) is not asked again after any refusal: a
        503 for a partition without an owner there would otherwise hold the file back.
        """
        waited_for = name in tailed.handover.census
        if waited_for and (not 400 <= refusal.status < 500 or refusal.status in (408, 429)):
            return False
        tailed.handover.census.discard(name)
        tailed.handover.asked_at_start.discard(name)
        said = (name, str(refusal))
        if said not in self._said_census_refusals:
            self._said_census_refusals.add(said)
            log.warning(
                "%s: installation %s refuses to say how far it holds it (%s); going on "
                "without its position (lines it holds beyond byte %d may be written twice; "
                "said once for all the files it refuses so)",
                tailed.path,
                name,
                refusal,
                tailed.handover.frontier,
            )
        return True

    def _session_failed(self, job: _SessionJob, exc: BaseException) -> None:
        for tailed in job.files:
            tailed.session_asked = False
        if isinstance(exc, InstallationUnavailable):
            self.installations.mark_down(job.installation, str(exc))
        elif isinstance(exc, (Refused, PartitionsUnavailable)):
            # A partition without an owner is named, not its sources (a new file's partition
            # is not known yet): found like a refusal, its file waiting a backoff (a 503).
            refusal = (
                Refusal(exc.status, exc.error, exc.reason)
                if isinstance(exc, Refused)
                else Refusal(503, PARTITION_UNAVAILABLE, exc.reason)
            )
            if len(job.files) == 1:
                tailed = job.files[0]
                if not (
                    job.census and self._census_refused(tailed, job.installation.name, refusal)
                ):
                    self._park(tailed, refusal)
            else:
                log.error(
                    "gateway did not open a batch of %d sessions (%s); asking for each alone",
                    len(job.files),
                    refusal,
                )
                for tailed in job.files:
                    tailed.alone = True
        elif not isinstance(exc, (Stopped, concurrent.futures.CancelledError)):
            log.error("opening sessions failed: %s", exc)

    # -- sending --------------------------------------------------------------------------------
    def sendable(self) -> list[TailedFile]:
        depth = self.config.pipeline_depth
        now = time.monotonic()
        outages = self.outages
        probes = outages.probes() if outages else 0
        return [
            t
            for t in self.files.files.values()
            if t.session_ready
            and t.parked is None
            and t.pending
            and t.in_flight < (1 if t.pipeline_blocked else depth)
            and (t.outage is None or outages.due(t, now, probes))
        ]

    def dispatch(self, now: float) -> float:
        """Send what is ready; return how long the oldest unsent chunk may still linger."""
        linger_s = self.config.linger_ms / 1000.0
        stopping = self._stop.is_set()
        while self.writes_in_flight < self.config.max_in_flight:
            ready = self.sendable()
            if not ready:
                return self.config.poll_interval_s
            total = sum(t.pending_bytes for t in ready)
            oldest = min(t.pending[0].read_at for t in ready)
            if total < self.config.request_bytes and now - oldest < linger_s and not stopping:
                return linger_s - (now - oldest)
            ready.sort(key=lambda t: t.pending[0].read_at)
            first = ready[0]
            name = first.session_installation
            owner = self._owner_of(first, now)
            room = self.config.request_bytes
            sections: list[tuple[TailedFile, list[Chunk]]] = []
            group = [first] if _alone(first) else ready
            for tailed in group:
                if room <= 0:
                    break
                if tailed.session_installation != name or (_alone(tailed) and tailed is not first):
                    continue
                if tailed is not first and self._owner_of(tailed, now) != owner:
                    continue  # a request goes to one owner (or to the gateways)
                chunks = tailed.take(room)
                room -= sum(len(c.data) for c in chunks)
                sections.append((tailed, chunks))
            member = self.installations.get(name)
            assert member is not None
            self._submit_write(member, sections, owner, first.outage)
        return self.config.poll_interval_s

    # -- owners ---------------------------------------------------------------------------------
    def configure_owners(self) -> None:
        """(Re)build the owners' maps from ``config.direct_to_owner`` (empty: off)."""
        config = self.config
        self.owner_routes = {
            member.name: OwnerRoutes(
                OwnerPolicy.for_servers(config.direct_to_owner, member.spec.servers),
                refresh_s=config.owner_refresh_s,
            )
            for member in self.installations.members
            if config.direct_to_owner
        }

    def _owner_of(self, tailed: TailedFile, now: float) -> str | None:
        """The owner URL a section of ``tailed`` goes to first, or None: the gateways."""
        routes = self.owner_routes.get(tailed.session_installation)
        if routes is None or not tailed.topic or tailed.partition < 0:
            return None
        return routes.owner(tailed.entry.log_type, tailed.topic, tailed.partition, now)

    def refresh_owners(self, now: float) -> None:
        """Ask for the owners' maps that are due (one request at a time, in the background)."""
        if not self.owner_routes or now < self._next_owner_check:
            return
        self._next_owner_check = now + _OWNER_CHECK_INTERVAL_S
        for name, routes in self.owner_routes.items():
            log_types = {
                t.entry.log_type
                for t in self.files.files.values()
                if t.session_installation == name and t.topic
            }
            due = routes.due(sorted(log_types), now)
            if not due:
                continue
            routes.refreshing = True
            self._refresher.submit(self._refresh, name, routes, due)

    def _refresh(self, name: str, routes: OwnerRoutes, log_types: list[str]) -> None:
        client = self.clients[name]
        try:
            for log_type in log_types:
                routes.on_answer(log_type, client.get_owners(log_type), time.monotonic())
            with client.stats.lock:
                client.stats.owner_partitions[name] = routes.known()
        finally:
            routes.refreshing = False

    def _submit_write(
        self,
        member: Installation,
        sections: list[tuple[TailedFile, list[Chunk]]],
        owner_url: str | None = None,
        probe: PartitionOutage | None = None,
    ) -> None:
        payload = [(t.section_meta(chunks), t.entry.codec, chunks) for t, chunks in sections]
        # journaled before it goes out: a client killed before the answer learns at its
        # restart which of them the log holds
        self.audit.sent(
            member.name,
            [
                (t.source_id, c.seqno, t.topic, c.create_time_ms, count_lines("raw", c.data))
                for t, chunks in sections
                for c in chunks
            ],
        )
        job = _WriteJob(member, sections, probe)
        if probe is not None:
            probe.probing = True
        job.future = self._pool.submit(
            self._send_write, self.clients[member.name], payload, owner_url
        )
        self.writes.add(job)
        job.future.add_done_callback(lambda _f: self._finished(job))

    def _send_write(
        self,
        client: GatewayClient,
        payload: list[tuple[bytes, str, list[Chunk]]],
        owner_url: str | None = None,
    ) -> dict[str, Any]:
        """Runs in a sender thread: compress, frame, POST until acknowledged.

        With ``owner_url``: one attempt there first; if it fails, the same body goes to the
        configured gateways (resending is safe: seqnos and ``prev_seqno`` decide what lands).
        """
        sections = [
            (
                meta,
                [WireChunk(c.seqno, c.create_time_ms, encoded_for(codec, c)) for c in chunks],
            )
            for meta, codec, chunks in payload
        ]
        body = encode_write_body(sections)
        self.metrics.observe_request_bytes(len(body))
        if owner_url is None or self._stop.is_set():
            return client.write(body)
        attempt = client.write_to_owner(owner_url, body, self.config.owner_timeout_s)
        routes = self.owner_routes.get(self._installation_of(client))
        if attempt.answer is not None:
            if attempt.forwarded and routes is not None:
                routes.on_moved()
                self._wake()  # the loop refreshes the owners' map
            return attempt.answer
        if routes is not None:
            routes.on_failed(owner_url, time.monotonic())
        self._wake()  # the loop refreshes the owners' map
        try:
            return client.write(body)
        except InstallationUnavailable as exc:
            if attempt.maybe_written and not exc.maybe_written:
                raise InstallationUnavailable(str(exc), maybe_written=True) from exc
            raise

    def _installation_of(self, client: GatewayClient) -> str:
        return next((name for name, c in self.clients.items() if c is client), "")

    # -- answers --------------------------------------------------------------------------------
    def collect(self) -> None:
        while True:
            try:
                job = self._results.get_nowait()
            except queue.Empty:
                return
            if isinstance(job, _SessionJob):
                self.session_jobs -= 1
                try:
                    results = job.future.result()
                except BaseException as exc:  # the next tick asks again
                    self._session_failed(job, exc)
                    continue
                for tailed in job.files:
                    tailed.session_asked = False
                self._on_sessions(job, results)
                continue
            self.writes.discard(job)
            if job.probe is not None:
                job.probe.probing = False
            try:
                answer = job.future.result()
            except BaseException as exc:
                self._write_failed(job, exc)
            else:
                self._on_write(job, answer)
            for tailed, _ in job.sections:
                self._after_request(tailed, job.installation.name)

    def _write_failed(self, job: _WriteJob, exc: BaseException) -> None:
        if isinstance(exc, PartitionsUnavailable):
            self._partitions_unavailable(job, exc)
        elif isinstance(exc, InstallationUnavailable):
            self.installations.mark_down(job.installation, str(exc))
            self._in_doubt(job, maybe_written=exc.maybe_written)
        elif isinstance(exc, (Stopped, concurrent.futures.CancelledError)) and self.multi:
            # Stopping with a request unanswered: it may still land there.
            self._in_doubt(job, maybe_written=True)
        elif isinstance(exc, Refused):
            self._refused_request(job, Refusal(exc.status, exc.error, exc.reason))
        else:
            if not isinstance(exc, (Stopped, concurrent.futures.CancelledError)):
                log.error("write failed: %s", exc)
            self._abandon(job)

    def _partitions_unavailable(self, job: _WriteJob, exc: PartitionsUnavailable) -> None:
        """The gateway answered that partitions of the request have no reachable owner: the
        files it names wait for theirs; the others are sent again at once (their sections
        were written: a resend is answered ``duplicate``).  The installation is not given up:
        it answers.  An answer that names none of the request's files holds back all."""
        waits = [exc.affects(t.source_id, t.topic, t.partition) for t, _ in job.sections]
        if not any(waits):
            waits = [True] * len(job.sections)
        name = job.installation.name
        for (tailed, chunks), held in zip(job.sections, waits, strict=True):
            tailed.finished(chunks)
            self.counters.buffered -= tailed.give_back(chunks)
            if held:
                topic, partition = exc.sources.get(
                    tailed.source_id, (tailed.topic, tailed.partition)
                )
                reason = exc.reason_for(topic, partition)
                pin = (topic, partition) in exc.pins
                self.outages.wait(tailed, name, topic, partition, reason, job.probe, pin=pin)

    def _abandon(self, job: _WriteJob) -> None:
        """Unanswered: the chunks go back among the pending ones and are sent again."""
        for tailed, chunks in job.sections:
            tailed.finished(chunks)
            self.counters.buffered -= tailed.give_back(chunks)

    def _in_doubt(self, job: _WriteJob, *, maybe_written: bool) -> None:
        name = job.installation.name
        for tailed, chunks in job.sections:
            tailed.finished(chunks)
            self.counters.buffered -= sum(len(c.data) for c in chunks)
            tailed.handover.on_failed(name, chunks[0].start, chunks[-1].seqno, maybe_written)
            tailed.session_ready = False

    def _after_request(self, tailed: TailedFile, name: str) -> None:
        """Once none of a file's requests is in flight: settle failures and finished resends."""
        if tailed.in_flight:
            return
        if tailed.handover.has_failures:
            self.counters.buffered -= tailed.drop_pending()
            doubt = tailed.handover.settle_failures()
            tailed.session_ready = False
            if doubt is not None:
                log.warning(
                    "%s: bytes %d..%d were sent to %s, which went down before answering; they "
                    "are sent nowhere else until it says what it holds",
                    tailed.path,
                    doubt.start,
                    doubt.end,
                    doubt.installation,
                )
            self.state_dirty = True
            self._save_state()
            return
        limit = tailed.read_limit
        if limit is not None and tailed.session_ready and tailed.acked >= limit:
            tailed.handover.resend_done(name, tailed.acked)
            log.info("%s: bytes up to %d are settled at %s", tailed.path, limit, name)
            tailed.session_ready = False
            self.counters.buffered -= tailed.drop_pending()
            self.state_dirty = True

    def _refused_request(self, job: _WriteJob, refusal: Refusal) -> None:
        """A 4xx for the request as a whole: park its file, or find which of its files."""
        if len(job.sections) == 1:
            tailed, chunks = job.sections[0]
            tailed.finished(chunks)
            self.counters.buffered -= sum(len(c.data) for c in chunks)
            self._park(tailed, refusal, chunks)
            return
        log.error(
            "gateway refused a request of %d files (%s); sending each alone to find which",
            len(job.sections),
            refusal,
        )
        for tailed, chunks in job.sections:
            tailed.alone = True
            tailed.finished(chunks)
            self.counters.buffered -= tailed.give_back(chunks)

    def _park(self, tailed: TailedFile, refusal: Refusal, chunks: Sequence[Chunk] = ()) -> None:
        if refusal.error == "chunk_too_large":
            if self._cut_smaller(tailed, refusal, chunks):
                return
            if tailed.parked is None:
                log.warning(
                    "%s: one line of it is longer than the gateway takes (%s): raise the "
                    "gateway's max_chunk_bytes (the file is tried again every park_retry_s and "
                    "at a reload), or have such lines cut into pieces: max_line_bytes below it "
                    "and a restart of this client (a reload applies it to files found later)",
                    tailed.path,
                    refusal,
                )
        if 400 <= refusal.status < 500 and refusal.status not in (408, 429):
            self.counters.buffered -= self.parking.park(
                tailed, refusal, time.monotonic(), time.time()
            )
        else:
            # It may pass (a 429 limit_reached, a 408, a 5xx for this file alone): ask again
            # after a backoff, not at once (that was hundreds of requests a second), and say
            # so once per refusal.
            tailed.session_ready = False
            self.counters.buffered -= tailed.drop_pending()
            if tailed.session_backoff is None:
                tailed.session_backoff = Backoff(base_s=0.5, cap_s=self.config.max_backoff_s)
            delay = tailed.session_backoff.next_delay()
            tailed.session_retry_at = time.monotonic() + delay
            said = str(refusal)
            first = not same_refusal(said, tailed.session_refusal)
            tailed.session_refusal = said  # --status shows the latest
            if first:
                log.warning(
                    "%s: the gateway cannot take it now (%s); asking again every %.0f s at most",
                    tailed.path,
                    said,
                    self.config.max_backoff_s,
                )

    def _cut_smaller(self, tailed: TailedFile, refusal: Refusal, chunks: Sequence[Chunk]) -> bool:
        """A chunk of several lines over the gateway's ``max_chunk_bytes``: cut the file's
        chunks at the limit the gateway states (or at half the refused size) and send them
        again; False when that cannot help (one line over the limit: the file is parked, as
        a line is never cut below ``max_line_bytes``).

        Parking such a file parked it for good (a retry cut the same chunks), and with a
        gateway whose limit is below ``chunk_bytes`` that was every file written fast.
        """
        refused = max((len(c.data) for c in chunks), default=0)
        if not any(_several_lines(c) for c in chunks):
            return False
        stated = _STATED_LIMIT.search(refusal.reason)
        limit = int(stated.group(1)) if stated else 0
        cut = max(limit if 0 < limit < refused else refused // 2, _MIN_CHUNK_BYTES)
        if cut >= tailed.chunk_bytes:
            return False  # as small as it gets
        tailed.chunk_bytes = cut
        tailed.session_ready = False  # resume from the gateway's last seqno
        self.counters.buffered -= tailed.drop_pending()
        if cut not in self._said_cuts:
            self._said_cuts.add(cut)
            log.warning(
                "%s: the gateway refused a chunk of %d bytes (%s); its chunks are cut at %d "
                "bytes from now on (so are those of any other file it refuses so; set "
                "chunk_bytes to at most the gateway's max_chunk_bytes to cut them so from the "
                "start)",
                tailed.path,
                refused,
                refusal,
                cut,
            )
        return True

    def _on_write(self, job: _WriteJob, answer: dict[str, Any]) -> None:
        job.installation.answered()
        raw = answer.get("results", [])
        results = [r if isinstance(r, dict) else {} for r in raw]
        by_source = {r.get("source_id"): r for r in results}
        now = time.monotonic()
        counters = self.counters
        acked: list[tuple[str, int]] = []
        for index, (tailed, chunks) in enumerate(job.sections):
            tailed.finished(chunks)
            result = results[index] if index < len(results) else {}
            if result.get("source_id") != tailed.source_id:
                result = by_source.get(tailed.source_id, {})
            if "error" in result:
                counters.buffered -= sum(len(c.data) for c in chunks)
                self._park(tailed, Refusal.from_result(result), chunks)
                continue
            if result.get("topic"):
                tailed.topic = str(result["topic"])
                tailed.partition = int(result.get("partition", -1))
            acks = result.get("acks", [])
            statuses = {a.get("status") for a in acks}
            if "fenced" in statuses:
                self._on_fenced(tailed, chunks)
                continue
            if "out_of_order" in statuses:
                self._on_out_of_order(tailed, chunks, job.behind[index])
                continue
            acked_seqnos = {
                int(a["seqno"]): a.get("status")
                for a in acks
                if a.get("status") in ("written", "duplicate")
            }
            unacked: list[Chunk] = []
            for chunk in chunks:
                status = acked_seqnos.get(chunk.seqno)
                if status is None:
                    unacked.append(chunk)
                    continue
                tailed.on_acked(chunk.seqno)
                acked.append((tailed.source_id, chunk.seqno))
                counters.buffered -= len(chunk.data)
                counters.acked_bytes += len(chunk.data)
                counters.acked_chunks += 1
                if status == "duplicate":
                    counters.duplicate_chunks += 1
            if tailed.outage is not None and acked_seqnos:
                self.outages.back(tailed)
            if not tailed.in_flight:
                tailed.pipeline_blocked = False
            if unacked:
                log.error(
                    "gateway did not acknowledge %d chunks of %s; sending them again",
                    len(unacked),
                    tailed.source_id,
                )
                counters.buffered -= tailed.give_back(unacked)
            else:
                tailed.alone = False
            self.state_dirty = True
        self.audit.acked(job.installation.name, acked)
        counters.last_activity = now
        counters.last_ack_at = time.time()

    def _on_out_of_order(self, tailed: TailedFile, chunks: list[Chunk], behind: bool) -> None:
        """The section was refused because the log does not yet hold what precedes it."""
        self.counters.out_of_order += 1
        if behind:
            # It overtook its predecessor (sent before it, not acknowledged when this one
            # left; with several gateways the two may take different ways).  Send it again
            # after the predecessor, at once if that one was acknowledged meanwhile.
            tailed.pipeline_blocked = bool(tailed.in_flight)
            self.counters.buffered -= tailed.give_back(chunks)
            return
        # Nothing of ours precedes it: the log ends below what it acknowledged to us (its
        # data was lost or replaced).  Its last seqno is the truth: resume from there.
        log.error(
            "the log holds less of %s than it acknowledged (below byte %d); resuming from "
            "the gateway's position",
            tailed.source_id,
            chunks[0].start,
        )
        self.counters.buffered -= sum(len(c.data) for c in chunks) + tailed.drop_pending()
        tailed.session_ready = False

    def _on_fenced(self, tailed: TailedFile, chunks: list[Chunk]) -> None:
        """Another session of this source started after ours: nothing of ours was written.

        That is another client shipping the same file (or a clock-skewed restart of this one),
        or the source's topic deleted and made again (its sessions went with it).
        Open the session again (fencing in turn) and resume from the gateway's last seqno:
        whoever writes has read the log's end after its fence, so no bytes are written twice.
        """
        # Two clients shipping one file fence each other many times a second, each time
        # resuming where the other left off (every line once): said once, then once a minute
        # with the count, not each time (it was dozens of ERROR lines a second).
        now = time.monotonic()
        said_at = tailed.fenced_said_at
        if said_at is None:
            log.error(
                "writes of %s (%s) were fenced: the gateway holds another session of this "
                "source (a second client shipping this file, or its topic deleted and made "
                "again); reopening the session and resuming from the gateway's position (said "
                "again once a minute at most while it goes on)",
                tailed.source_id,
                tailed.path,
            )
            tailed.fenced_said_at = now
        elif now - said_at >= LOG_EVERY_S:
            log.error(
                "writes of %s (%s) were fenced %d more times in %.0f s: another client ships "
                "this file too (each resumes where the other left off; stop one of them)",
                tailed.source_id,
                tailed.path,
                tailed.fenced_unsaid + 1,
                now - said_at,
            )
            tailed.fenced_said_at, tailed.fenced_unsaid = now, 0
        else:
            tailed.fenced_unsaid += 1
        self.counters.buffered -= sum(len(c.data) for c in chunks) + tailed.drop_pending()
        tailed.session_ready = False
        self.counters.fenced += 1

    # -- stopping -------------------------------------------------------------------------------
    def give_up_in_flight(self) -> None:
        """At the stop deadline: requests still unanswered may land; in doubt with several
        installations (a single one answers the truth at the next start anyway)."""
        if not self.multi:
            return
        for job in list(self.writes):
            self._in_doubt(job, maybe_written=True)
            for tailed, _ in job.sections:
                tailed.handover.settle_failures()
        self.writes.clear()


def census_all(files: Sequence[TailedFile], names: Sequence[str], deadline: float) -> None:
    """The client's positions were lost: learn every installation's before sending."""
    for tailed in files:
        tailed.handover.census.update(names)
        tailed.handover.census_deadline = deadline


def _alone(tailed: TailedFile) -> bool:
    """Sent in requests of its own: to find a refused file, or as a partition's probe."""
    return tailed.alone or tailed.outage is not None


def _several_lines(chunk: Chunk) -> bool:
    """Whether ``chunk`` holds more than one line (it ends with one's newline)."""
    return bytes(chunk.data).find(b"\n", 0, len(chunk.data) - 1) >= 0
