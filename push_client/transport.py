"""Talking to one installation's gateways: retries with backoff and jitter, failover across URLs.

A request is retried until it gets a 200 or the client stops: a transport error, a timeout, a
408, a 429, a 5xx or a 503 means nothing is known to be acknowledged, and resending is safe
because the gateway answers chunks it already holds with ``duplicate``.

Three answers end the retries early:

- a 4xx (other than 408 and 429) means the gateway refused the request as a whole and wrote
  nothing: :class:`Refused`.  The daemon finds the file to blame (resending per file) and parks
  it; the data stays in the file, nothing is dropped.
- a 503 ``partition_unavailable`` means the gateway works but partitions of the request have
  no reachable owner now (the sections of other partitions were written):
  :class:`PartitionsUnavailable`, naming the sources that wait.  The shipper holds back those
  files only and sends the others again at once.
- with installations to fail over to, a request whose gateways all keep failing for
  ``failover_after_s`` (or whose installation another request found down meanwhile) raises
  :class:`InstallationUnavailable`, telling whether the request may have been written there.

A gateway first reached is asked its installation before its first request, and again
before the first after it failed (``push_client.gateway_check``: it may come back as another
installation's): one of another installation than the client's group for it is sent nothing,
its attempts failing at once with :class:`OtherInstallation` (as a gateway that is down; the
request goes on at the group's other gateways).

A gateway that takes a request and does not answer it for ``stall_after_s`` is failing too
(frozen, or waiting for its Kafka): the request goes on at the next gateway while the hung
attempt is still awaited, see :meth:`GatewayClient.post` for why that writes nothing twice.
With several gateways left, the next is the first of them to answer a probe asked of all at
once, so that a request passes any number of hung gateways in about one ``stall_after_s``.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from delivery.gateway_retry import MAX_RETRY_AFTER_S, retry_after_given
from log_store.errors import LogbrokerError
from push_client.backoff import CLOSE_WAIT_S, Backoff, ProbeSchedule
from push_client.gateway_check import GatewayCheck, InstallationUnknown, OtherInstallation
from push_client.owner_routes import FORWARDED_HEADER, OWNERS_PATH
from push_client.stall import StallWatch
from push_client.token import BearerToken
from push_client.wire import CONTENT_TYPE

log = logging.getLogger("logbroker.push")


class Stopped(LogbrokerError):
    """The client is stopping; the request was abandoned without an answer."""


class Refused(LogbrokerError):
    """The gateway answered the request as a whole with a 4xx: nothing of it was written."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(f"HTTP {status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason


class InstallationUnavailable(LogbrokerError):
    """Every gateway of the installation kept failing: time to write to the next one.

    ``maybe_written`` is true when an attempt got past connecting (the gateway may have
    written the request before it died or before its answer was lost); false when no attempt
    ever reached a gateway, so nothing of the request can be there.
    """

    def __init__(self, reason: str, *, maybe_written: bool) -> None:
        super().__init__(reason)
        self.maybe_written = maybe_written


PARTITION_UNAVAILABLE = "partition_unavailable"


class PartitionsUnavailable(LogbrokerError):
    """The gateway works, but partitions of the request have no reachable owner now (a 503
    ``partition_unavailable``): the sections of its other partitions were written.

    ``partitions`` are the (topic, partition) pairs it names; ``sources`` the source ids it
    names, each with its pair (a gateway names them for a write, not for sessions).  Raised
    at the first such answer, not retried: the gateway already waited for an owner."""

    def __init__(
        self,
        reason: str,
        partitions: tuple[tuple[str, int], ...],
        sources: dict[str, tuple[str, int]],
        reasons: dict[tuple[str, int], str] | None = None,
        pins: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.partitions = partitions
        self.sources = sources
        self.reasons = reasons or {}
        """Each partition's own reason, where the gateway gave one (``reason`` joins them)."""
        self.pins = pins
        """The partitions named as holding the pins of the sources named (sources the gateway
        routes for the first time), not their data: ``"pins": true`` in the body."""

    def reason_for(self, topic: str, partition: int) -> str:
        """Why ``topic/partition`` waits: its own reason, not another partition's."""
        return self.reasons.get((topic, partition), self.reason)

    def affects(self, source_id: str, topic: str, partition: int) -> bool:
        """Whether the answer names this source (or, if it names no source, its partition)."""
        if self.sources:
            return source_id in self.sources
        return (topic, partition) in self.partitions

    @classmethod
    def from_body(cls, body: object) -> PartitionsUnavailable | None:
        """The answer in a 503's body, or None if it is another 503 (or an older gateway's
        ``store_unavailable``: the request is retried as a whole, as before)."""
        if not isinstance(body, dict) or body.get("error") != PARTITION_UNAVAILABLE:
            return None
        named = body.get("partitions")
        if not isinstance(named, list) or not named:
            return None
        partitions: list[tuple[str, int]] = []
        sources: dict[str, tuple[str, int]] = {}
        reasons: dict[tuple[str, int], str] = {}
        pins: set[tuple[str, int]] = set()
        for item in named:
            if not isinstance(item, dict):
                return None
            topic, partition = item.get("topic"), item.get("partition")
            if not isinstance(topic, str) or not isinstance(partition, int):
                return None
            partitions.append((topic, partition))
            if isinstance(item.get("reason"), str):
                reasons[topic, partition] = item["reason"][:500]
            if item.get("pins") is True:
                pins.add((topic, partition))
            ids = item.get("source_ids", [])
            for source_id in ids if isinstance(ids, list) else ():
                if isinstance(source_id, str):
                    sources[source_id] = (topic, partition)
        return cls(
            str(body.get("reason", ""))[:500], tuple(partitions), sources, reasons, frozenset(pins)
        )


@dataclass(frozen=True)
class OwnerAttempt:
    """What one attempt at a partition's owner gave: its answer, or None if it failed."""

    answer: dict[str, Any] | None
    maybe_written: bool
    """The attempt got past connecting: the owner may have written it."""
    forwarded: int = 0
    """Sections the gateway wrote through another one (``Logbroker-Forwarded``): it no
    longer owns their partitions, so the owners' map is stale."""


PROBE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 2.0
"""How long connecting to a gateway may take (or a request's whole timeout, if shorter)."""

# Errors raised before the request left this host: the gateway cannot have seen it.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    OtherInstallation,
    InstallationUnknown,
)


@dataclass
class TransportStats:
    """Counters the metrics endpoint exports; updated from sender threads."""

    requests: dict[str, int] = field(default_factory=dict)
    owner_writes: dict[str, int] = field(default_factory=dict)
    """Write requests sent to a partition's owner directly: ``owner`` (it answered) or
    ``fallback`` (it failed; the request went to the configured gateways)."""
    owner_partitions: dict[str, int] = field(default_factory=dict)
    """Per installation, partitions whose owner is known and allowed (``direct_to_owner``)."""
    retries: int = 0
    failovers: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stall: StallWatch = field(default_factory=StallWatch)
    """Whether the gateways answer requests at all (a one-shot run gives up when not)."""

    def count(self, outcome: str) -> None:
        with self.lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def count_owner_write(self, outcome: str) -> None:
        with self.lock:
            self.owner_writes[outcome] = self.owner_writes.get(outcome, 0) + 1

    def count_retry(self) -> None:
        """A request failed (what failed and whether it still does is the gateways' part:
        :meth:`GatewayClient.failing`, which the status shows)."""
        with self.lock:
            self.retries += 1


_POLL_S = 0.25
"""How often a request waiting for its attempts looks whether the client stops or another
request found the installation down."""


@dataclass(eq=False)
class _Attempt:
    """One HTTP request of :meth:`GatewayClient.post`, made in a thread of its own."""

    index: int
    server: str
    started: float
    """Monotonic time it was sent."""
    stall_id: int
    """Its id in :class:`StallWatch`."""
    response: httpx.Response | None = None
    error: BaseException | None = None
    sent: bool = False
    """The request left for the gateway (its installation was known or confirmed first)."""
    stalled: bool = False
    """Unanswered for ``stall_after_s``: counted as a failure of its gateway, still awaited."""
    probe: bool = False
    """Not the request: a ``GET /readyz`` of its gateway, asked of every gateway left once one
    hung (see :meth:`GatewayClient.post`); it never carries the request."""
    outcome: str = ""
    maybe_written: bool = False
    wait_at_least: float = 0.0


@dataclass
class _Failure:
    """A gateway failing now: what it answered last and when it was last tried."""

    kind: str
    """The kind of the last failure (``ConnectError``, ``HTTP 503``)."""
    outcome: str
    """The last failure as said in the log."""
    since: float
    """Monotonic time of the first failure."""
    since_wall: float
    failures: int
    """Requests that failed there (probes not counted)."""
    tried_at: float
    """Wall-clock time of the last request or probe that failed there."""
    tried_by: str
    """``request`` or ``probe``: what tried it last (when it is probed next is the
    :class:`ProbeSchedule`'s)."""


class GatewayClient:
    """POSTs to the first healthy gateway of one installation; thread-safe.

    ``failover_after_s`` (None: retry forever) and ``is_down`` let a request give up on the
    installation, see :class:`InstallationUnavailable`.
    """

    def __init__(
        self,
        servers: tuple[str, ...],
        *,
        token: BearerToken,
        stop: threading.Event,
        stats: TransportStats,
        max_backoff_s: float = 5.0,
        pool_size: int = 8,
        failover_after_s: float | None = None,
        is_down: Callable[[], bool] | None = None,
        request_timeout_s: float = 60.0,
        probe_interval_s: float | None = None,
        probe_max_interval_s: float = 60.0,
        stall_after_s: float | None = None,
        group: str = "",
        check: GatewayCheck | None = None,
    ) -> None:
        self.servers = servers
        self._group = group
        self._check = check
        """Which installation each gateway belongs to: one of another installation than
        ``group`` is written nothing (see ``push_client.gateway_check``)."""
        self.stall_after_s = (
            stall_after_s if stall_after_s and stall_after_s < request_timeout_s else None
        )
        """A request unanswered this long also goes to the next gateway (None: only once it
        fails or times out), see :meth:`post`."""
        self._preferred = 0
        self._lock = threading.Lock()
        self._stop = stop
        self.stop_deadline = 0.0
        self.max_backoff_s = max_backoff_s
        self.stats = stats
        self._token = token
        self.failover_after_s = failover_after_s
        self._is_down = is_down or (lambda: False)
        self._failing: dict[str, _Failure] = {}
        """Gateways failing now, by URL: until a request or a probe there succeeds."""
        self._recovered: dict[str, Any] | None = None
        """The last gateway that answered again: ``server``, ``failing_since`` and
        ``recovered_at`` (wall clock)."""
        self.probe_interval_s = probe_interval_s
        self._probes = (
            None
            if probe_interval_s is None
            else ProbeSchedule(probe_interval_s, probe_max_interval_s)
        )
        """When each failing gateway is probed next (requests' failures count as tries)."""
        self._prober: threading.Thread | None = None
        self._closed = threading.Event()
        self._http = httpx.Client(
            headers={"User-Agent": "logbroker-push/1"},
            timeout=httpx.Timeout(
                request_timeout_s, connect=min(CONNECT_TIMEOUT_S, request_timeout_s)
            ),
            # An attempt left hanging at a gateway (see post) holds its connection until
            # request_timeout_s: room for one per request at every gateway.
            limits=httpx.Limits(
                max_connections=pool_size * len(servers), max_keepalive_connections=pool_size
            ),
        )

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop probing, waiting at most ``wait_s`` for a probe in flight, and close the
        connections.  A probe of a gateway that hangs is left to its (daemon) thread and what
        it finds is dropped: a stopping client used to wait up to ``2 * PROBE_TIMEOUT_S + 1``
        for it, past its ``shutdown_timeout_s``."""
        self._closed.set()
        prober = self._prober
        if prober is not None:
            prober.join(wait_s)
        self._http.close()

    @property
    def current_server(self) -> str:
        """The gateway requests go to first now (the last one that answered), passing over
        one of another installation while another is left."""
        usable = self.usable_servers
        for offset in range(len(self.servers)):
            server = self._server(offset)[1]
            if server in usable:
                return server
        return self._server(0)[1]

    @property
    def usable_servers(self) -> list[str]:
        """The gateways not found to belong to another installation than this one's."""
        return [s for s in self.servers if self._refusal(s) is None]

    @property
    def confirmed_servers(self) -> list[str]:
        """The gateways known to belong to this installation now: each said so since it
        last failed (see ``push_client.gateway_check``)."""
        if self._check is None:
            return list(self.servers)
        return [s for s in self.servers if self._check.confirmed(self._group, s)]

    def _refusal(self, server: str) -> str | None:
        """Why nothing is written to ``server`` (another installation), if so."""
        return None if self._check is None else self._check.refusal(self._group, server)

    def _server(self, attempt_offset: int) -> tuple[int, str]:
        with self._lock:
            index = (self._preferred + attempt_offset) % len(self.servers)
        return index, self.servers[index]

    def _prefer(self, index: int, failed_at: int | None) -> None:
        """A request answered at ``index`` after failing at the gateway preferred then
        (``failed_at``; None: it did not fail): requests go to ``index`` first from now on.

        Only a request that saw the preferred gateway fail moves the preference, and only
        from that gateway: requests in flight when a gateway dies or restarts are answered in
        any order, and a late 200 from the old gateway, or a second request's move to the
        same gateway, would otherwise flip it back and forth (and log each flip).
        """
        if failed_at is None or index == failed_at:
            return
        with self._lock:
            if self._preferred != failed_at:
                return
            self._preferred = index
        with self.stats.lock:
            self.stats.failovers += 1
        log.info("now sending to %s", self.servers[index])

    def post(
        self, path: str, body: bytes, content_type: str, *, flush: bool = False
    ) -> dict[str, Any]:
        """POST until a 200 answers; return its JSON.

        Raises :class:`Stopped` when stopping, :class:`Refused` on a 4xx other than 408/429,
        and :class:`InstallationUnavailable` (only with ``failover_after_s``) when the
        installation is given up.  With ``flush``, a request is still retried after stopping
        began, until ``stop_deadline`` (monotonic): a stopping client tries to get its
        in-flight chunks acknowledged.  Other requests stop at once.

        **A request unanswered for ``stall_after_s`` is a failure of its gateway**, as a
        timeout would be, only sooner: the same body goes to the next gateway of the
        installation at once, and the gateway that holds it counts as failing (for
        ``failover_after_s``, and in the status) until it answers.  The attempt that hangs
        is not cancelled: whichever attempt answers first answers the request.  Why that
        keeps every line once:

        - *at the same installation* the resend is the retry every timed-out or 5xx request
          always got (it may have been written before its answer was lost): each section
          names ``prev_seqno`` and the source's session ``epoch``, so whichever of the two
          copies reaches the log second is answered ``duplicate`` (its seqnos are not above
          the source's last), ``out_of_order`` (the log moved on and did not end at its
          ``prev_seqno``) or ``fenced`` (the source's session was opened again since):
          never written twice.  The hung copy's late answer, if any, is dropped.
        - *leaving the installation*: when every gateway of it has failed or hung for
          ``failover_after_s``, :class:`InstallationUnavailable` says ``maybe_written``
          (a hung attempt got past connecting, or may have), so the shipper keeps the
          request's ranges as *doubts* at that installation (``push_client.handover``),
          exactly as for a request whose gateway died after taking it: they are sent nowhere
          else until that installation answers a session saying how far it holds the source
          (a hung write still in its queue lands before that session, or is fenced by it).

        A gateway that is slow but answers within ``stall_after_s`` is never left; one slower
        than that costs a second copy of the request at the next gateway (answered
        ``duplicate`` there if the first lands first), not a failover: see ``stall_after_s``
        in docs/push-client.md for how it was chosen.

        **When an attempt hangs** (or times out), the gateways left (holding no attempt of
        this request) are each asked ``GET /readyz`` at once (its installation first, if it
        is to be asked, see ``push_client.gateway_check``), each within
        :data:`PROBE_TIMEOUT_S` (2 s, or ``stall_after_s`` if less), and the request goes to
        the first that answers (not a 5xx, 408 or 429): several hung gateways cost one
        ``stall_after_s`` and a probe's timeout at most, not one ``stall_after_s`` each.  A
        probe carries no part of the request, so it changes nothing of the above: the copies
        of the request are the ones described there, at gateways of this installation, and
        ``maybe_written`` is what the copies sent say.  A gateway whose probe fails or does
        not answer in time is failing, as if its attempt had; when every probe failed the
        request goes on as before (the next gateway, after a backoff).
        """
        backoff = Backoff(cap_s=self.max_backoff_s)
        offset = 0
        failing_since: float | None = None
        maybe_written = False
        failed_at: int | None = None
        """The preferred gateway when this request first failed (see :meth:`_prefer`)."""
        outcome = ""
        finished: queue.SimpleQueue[_Attempt] = queue.SimpleQueue()
        attempts: list[_Attempt] = []
        """Attempts of this request still unanswered (hung ones included)."""
        launch_at = 0.0
        """Monotonic time the next attempt may start (None: none is due until one ends)."""
        want_attempt = True
        count = len(self.servers)
        try:
            while True:
                now = time.monotonic()
                if self._stop.is_set() and (not flush or now >= self.stop_deadline):
                    raise Stopped("stopping before the gateway answered")
                if self.failover_after_s is not None:
                    if self._is_down():
                        raise InstallationUnavailable(
                            "the installation is down",
                            maybe_written=maybe_written or any(not a.probe for a in attempts),
                        )
                    if (
                        failing_since is not None
                        and offset >= count
                        and now - failing_since >= self.failover_after_s
                        and all(a.stalled or a.probe for a in attempts)
                    ):
                        raise InstallationUnavailable(outcome, maybe_written=maybe_written)
                if want_attempt and now >= launch_at:
                    busy = {a.index for a in attempts}
                    for skip in range(count):
                        index, server = self._server(offset + skip)
                        if index not in busy:
                            offset += skip
                            attempts.append(
                                self._launch(index, server, path, body, content_type, finished)
                            )
                            break
                    want_attempt = False
                wait = _POLL_S
                if want_attempt:
                    wait = min(wait, launch_at - now)
                if self.stall_after_s is not None:
                    for attempt in attempts:
                        if not attempt.stalled and not attempt.probe:
                            wait = min(wait, attempt.started + self.stall_after_s - now)
                if failing_since is not None and self.failover_after_s is not None:
                    wait = min(wait, failing_since + self.failover_after_s - now)
                try:
                    ended: _Attempt | None = finished.get(timeout=max(0.0, wait))
                except queue.Empty:
                    ended = None
                now = time.monotonic()
                failure: _Attempt | None = None
                wait_at_least = 0.0
                if ended is not None and ended.probe:
                    attempts.remove(ended)
                    probe_failure = self._probe_failure(ended)
                    if probe_failure is None:
                        if not any(not a.probe and not a.stalled for a in attempts):
                            # The first gateway left that answers: the request goes there.
                            attempts.append(
                                self._launch(
                                    ended.index, ended.server, path, body, content_type, finished
                                )
                            )
                        continue
                    outcome = probe_failure
                    self._failed(ended.server, outcome)
                    offset += 1
                    if not any(a.probe or not a.stalled for a in attempts):
                        # No gateway left answered: on as before, after a backoff.
                        want_attempt = True
                        launch_at = now + self._backoff_delay(backoff, 0.0, failing_since, now)
                    continue
                if ended is not None:
                    attempts.remove(ended)
                    answer = self._answer(ended, failed_at)
                    if answer is not None:
                        return answer
                    outcome = ended.outcome
                    maybe_written = maybe_written or ended.maybe_written
                    wait_at_least = ended.wait_at_least
                    want_attempt = True  # its gateway is free for the request again
                    if ended.stalled:
                        # Counted as a failure when it hung; now it says how it failed.
                        self._failed(ended.server, outcome)
                        # While the gateways left are probed, the first to answer is next.
                        want_attempt = not any(a.probe for a in attempts)
                        continue
                    failure = ended
                elif self.stall_after_s is not None:
                    failure = next(
                        (
                            a
                            for a in attempts
                            if not a.stalled
                            and not a.probe
                            and now - a.started >= self.stall_after_s
                        ),
                        None,
                    )
                    if failure is not None:
                        failure.stalled = True
                        hung_s = now - failure.started
                        outcome = (
                            f"{failure.server}: Stalled: no answer for {hung_s:.1f} s"
                            f" (stall_after_s {self.stall_after_s:g})"
                        )
                        # It got past connecting or may have: it may be written (see above).
                        maybe_written = True
                        self.stats.count("stalled")
                        self.stats.stall.ended(failure.stall_id, outcome)
                        want_attempt = True
                if failure is None:
                    continue
                self.stats.count_retry()
                self._failed(failure.server, outcome)
                if failed_at is None:
                    failed_at = failure.index
                failing_since = failing_since if failing_since is not None else now
                # Move on to the next gateway at once; back off once every gateway was tried.
                offset += 1
                launch_at = now
                if offset % count == 0 or wait_at_least:
                    launch_at = now + self._backoff_delay(
                        backoff, wait_at_least, failing_since, now
                    )
                elif failure.stalled or isinstance(failure.error, httpx.TimeoutException):
                    # It hung (or timed out asked its installation): so may the next ones.
                    left = self._left(offset, attempts)
                    if left:
                        # Which of the gateways left answers: asked of all at once (see above).
                        attempts.extend(self._launch_probe(i, url, finished) for i, url in left)
                        want_attempt = False
        finally:
            for attempt in attempts:
                # Left to its thread; what it finds is nobody's news now.
                if not attempt.stalled and not attempt.probe:
                    self.stats.stall.dropped(attempt.stall_id)

    def _backoff_delay(
        self, backoff: Backoff, wait_at_least: float, failing_since: float | None, now: float
    ) -> float:
        """The wait before a request's next attempt once every gateway was tried."""
        delay = backoff.next_delay(wait_at_least)
        if self.failover_after_s is not None and failing_since is not None:
            # Wake when the installation may be given up, not a backoff later: a dead
            # installation was left up to max_backoff_s after failover_after_s.
            until_failover = failing_since + self.failover_after_s - now
            if until_failover > 0:
                delay = min(delay, until_failover)
        return delay

    def _left(self, offset: int, attempts: list[_Attempt]) -> list[tuple[int, str]]:
        """The gateways holding no attempt of the request, in the order it tries them."""
        busy = {a.index for a in attempts}
        left = [self._server(offset + skip) for skip in range(len(self.servers))]
        return [(index, url) for index, url in left if index not in busy]

    def _launch_probe(
        self, index: int, server: str, finished: queue.SimpleQueue[_Attempt]
    ) -> _Attempt:
        """Ask ``server`` whether it takes writes (``GET /readyz``, its installation first if
        it is to be asked), each within :data:`PROBE_TIMEOUT_S` (``stall_after_s`` if less),
        in a thread of its own; put on ``finished`` when it ends."""
        timeout_s = min(self.stall_after_s or PROBE_TIMEOUT_S, PROBE_TIMEOUT_S)
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        attempt = _Attempt(index, server, time.monotonic(), -1, probe=True)

        def run() -> None:
            try:
                if self._check is not None:
                    attempt.response = self._check.confirm(
                        self._group, server, self._http, timeout_s=timeout_s
                    )
                if attempt.response is None:
                    attempt.response = self._http.get(server + "/readyz", timeout=timeout)
                    if attempt.response.status_code == 404:  # a gateway too old to have it
                        attempt.response = self._http.get(server + "/healthz", timeout=timeout)
            except BaseException as exc:  # handed to the request's thread
                attempt.error = exc
            finished.put(attempt)

        threading.Thread(target=run, name="push-send-probe", daemon=True).start()
        return attempt

    def _probe_failure(self, attempt: _Attempt) -> str | None:
        """How an ended probe of :meth:`post` failed, as logged (None: it answered 200)."""
        server, exc = attempt.server, attempt.error
        if exc is not None:
            if not isinstance(exc, httpx.HTTPError):
                raise exc
            if isinstance(exc, httpx.ReadTimeout):
                return (
                    f"{server}: Stalled: no answer to GET /readyz for"
                    f" {time.monotonic() - attempt.started:.1f} s"
                )
            return f"{server}: {failure_text(exc, server)}"
        assert attempt.response is not None
        status = attempt.response.status_code
        if status < 500 and status not in (408, 429):
            return None  # it answers (a 4xx: the request will say what it refuses)
        return f"{server}: HTTP {status} to GET /readyz"

    def _launch(
        self,
        index: int,
        server: str,
        path: str,
        body: bytes,
        content_type: str,
        finished: queue.SimpleQueue[_Attempt],
    ) -> _Attempt:
        """Start one HTTP request of :meth:`post` in a thread of its own (so that the request
        can go on elsewhere while it hangs); it is put on ``finished`` when it ends."""
        headers = {"Content-Type": content_type, **self._token.headers()}
        attempt = _Attempt(index, server, time.monotonic(), self.stats.stall.started())

        def run() -> None:
            try:
                if self._check is not None:
                    # A gateway first reached, or failing since it was last asked, says its
                    # installation before anything is sent to it: a 5xx of /healthz is this
                    # attempt's answer (it cannot take the request now).
                    attempt.response = self._check.confirm(self._group, server, self._http)
                if attempt.response is None:
                    attempt.sent = True
                    attempt.response = self._http.post(server + path, content=body, headers=headers)
            except BaseException as exc:  # handed to the request's thread
                attempt.error = exc
            finished.put(attempt)

        threading.Thread(target=run, name="push-send-attempt", daemon=True).start()
        return attempt

    def _answer(self, attempt: _Attempt, failed_at: int | None) -> dict[str, Any] | None:
        """What an ended attempt means: its JSON (a 200); None for a failure (``outcome``,
        ``maybe_written`` and ``wait_at_least`` set on it); raises for an answer that ends
        the request (:class:`Refused`, :class:`PartitionsUnavailable`) or an error that is
        not the gateway's."""
        server, index = attempt.server, attempt.index
        exc = attempt.error
        if exc is not None:
            if not isinstance(exc, httpx.HTTPError):
                if not attempt.stalled:
                    self.stats.stall.dropped(attempt.stall_id)
                raise exc
            attempt.outcome = f"{server}: {failure_text(exc, server)}"
            self.stats.count("transport_error")
            attempt.maybe_written = attempt.sent and not isinstance(exc, _NOT_SENT)
            if not attempt.stalled:
                self.stats.stall.ended(attempt.stall_id, attempt.outcome)
            return None
        response = attempt.response
        assert response is not None
        status = response.status_code
        if status == 200 or (400 <= status < 500 and status not in (408, 429)):
            # An answer: the gateway works.
            if attempt.stalled:
                self.stats.stall.answered()
            else:
                self.stats.stall.ended(attempt.stall_id, None)
        if status == 200:
            self.stats.count("ok")
            if self._failing:
                self._answered(server)
            self._prefer(index, failed_at)
            parsed: dict[str, Any] = orjson.loads(response.content)
            return parsed
        attempt.outcome = f"{server}: HTTP {status}: {response.text[:300]}"
        unavailable = _partitions_unavailable(response)
        if unavailable is not None:
            # An answer: the gateway works, partitions of the request have no owner.
            if attempt.stalled:
                self.stats.stall.answered()
            else:
                self.stats.stall.ended(attempt.stall_id, None)
            self.stats.count(PARTITION_UNAVAILABLE)
            if self._failing:
                self._answered(server)
            self._prefer(index, failed_at)
            raise unavailable
        if 400 <= status < 500 and status not in (408, 429):
            # An answer: the gateway works, the request is what it refuses.
            self.stats.count("rejected")
            self.stats.count_retry()
            if self._failing:
                self._answered(server)
            raise _refused(response)
        self.stats.count(f"http_{status}")
        attempt.maybe_written = attempt.sent and status >= 500
        retry_after = retry_after_given(response)
        if retry_after is not None:
            attempt.wait_at_least = min(retry_after, MAX_RETRY_AFTER_S)
        if not attempt.stalled:
            self.stats.stall.ended(attempt.stall_id, attempt.outcome)
        return None

    def _failed(self, server: str, outcome: str) -> None:
        """A request to ``server`` failed: said when it starts failing, or fails otherwise
        (another HTTP status, another error), not at every retry of every request in flight
        (with the gateway down for an hour, a line a second said nothing new)."""
        kind = outcome.removeprefix(f"{server}: ").split(":", 1)[0]
        if self._check is not None and kind != OtherInstallation.__name__:
            # It may come back as another installation's (a name moved meanwhile).
            self._check.suspect(self._group, server)
        wall = time.time()
        with self._lock:
            # Under the lock (the schedule's is taken inside it): the schedule holds the
            # gateways that fail, no more.
            if self._probes is not None:
                self._probes.failed(server)
            known = self._failing.get(server)
            said = known is not None and known.kind == kind
            if known is None:
                self._failing[server] = _Failure(
                    kind, outcome, time.monotonic(), wall, 1, wall, "request"
                )
            else:
                known.failures += 1
                known.kind, known.outcome = kind, outcome
                known.tried_at, known.tried_by = wall, "request"
        if said:
            log.debug("request failed, retrying: %s", outcome)
            return
        log.warning(
            "request failed, retrying: %s (said again when it answers or fails otherwise)",
            outcome,
        )
        self._start_prober()

    def failing(self) -> list[dict[str, Any]]:
        """The gateways failing now (their last request or probe failed): ``server``,
        ``error`` (its kind), ``outcome`` (as logged), ``since`` and ``tried_at`` (wall
        clock), ``tried_by`` (``request`` or ``probe``), ``retries`` (requests that failed
        there), ``current`` (whether requests go there first now) and ``next_probe_at``
        (wall clock; None when requests retry it: it is the one they go to first and its
        installation is not down).  A gateway requests do not go to is probed, at waits
        growing from ``probe_interval_s`` to ``probe_max_interval_s``, until it answers."""
        current = self.current_server
        probes = self._probes
        down = self._is_down()
        with self._lock:
            failing = sorted(self._failing.items())
            return [
                {
                    "server": server,
                    "error": f.kind,
                    "outcome": f.outcome,
                    "since": f.since_wall,
                    "retries": f.failures,
                    "tried_at": f.tried_at,
                    "tried_by": f.tried_by,
                    "current": server == current,
                    "next_probe_at": probes.next_probe_at(server)
                    if probes is not None and (down or server != current)
                    else None,
                }
                for server, f in failing
            ]

    def recovered(self) -> dict[str, Any] | None:
        """The last gateway that answered again after failing (None if none did)."""
        with self._lock:
            return None if self._recovered is None else dict(self._recovered)

    def _answered(self, server: str, *, by_probe: bool = False) -> None:
        now = time.time()
        with self._lock:
            if by_probe and self._closed.is_set():
                return
            if self._probes is not None:
                self._probes.answered(server)
            known = self._failing.pop(server, None)
            if known is not None:
                self._recovered = {
                    "server": server,
                    "failing_since": known.since_wall,
                    "recovered_at": now,
                }
        if known is not None:
            log.info(
                "%s answers again, after %.1f s of failures (%d retries%s)",
                server,
                time.monotonic() - known.since,
                known.failures,
                "; a probe saw it" if by_probe else "",
            )

    # -- probing --------------------------------------------------------------------------------
    def _start_prober(self) -> None:
        """A gateway that failed is probed while no request tries it (one the client moved
        away from is never tried again otherwise), so that what the status says stays true."""
        if self.probe_interval_s is None:
            return
        with self._lock:
            if self._prober is not None or self._closed.is_set():
                return
            self._prober = threading.Thread(
                target=self._probe_loop, name="push-gateway-probe", daemon=True
            )
            self._prober.start()

    def _probe_loop(self) -> None:
        probes = self._probes
        assert probes is not None and self.probe_interval_s is not None
        with httpx.Client(
            headers={"User-Agent": "logbroker-push/1"}, timeout=PROBE_TIMEOUT_S
        ) as http:
            while not self._closed.is_set() and not self._stop.is_set():
                for server in probes.due(self._unused_failing()):
                    if self._closed.is_set() or self._stop.is_set():
                        return
                    failure = _probe(http, server)
                    refusal = None
                    if failure is None and self._check is not None:
                        # It answers: a probe may be the first to reach it, or to reach it
                        # back, so it asks (one refused is asked again: it may be back).
                        refusal = self._check.check(self._group, server, http)
                    elif self._check is not None:
                        self._check.suspect(self._group, server)
                    if refusal is not None:
                        failure = f"OtherInstallation: {refusal}"
                    if self._closed.is_set():
                        # Closed while the probe waited: what it found is nobody's news now.
                        return
                    if failure is None:
                        self._answered(server, by_probe=True)
                        continue
                    wall = time.time()
                    with self._lock:
                        known = self._failing.get(server)
                        if known is not None:  # else a request saw it answer meanwhile
                            known.kind = failure.split(":", 1)[0]
                            known.outcome = f"{server}: {failure}"
                            known.tried_at, known.tried_by = wall, "probe"
                            probes.failed(server)
                # Wakes at least every probe_interval_s: a gateway requests stopped going
                # to (or that began to fail) may be due by then.
                self._closed.wait(probes.until_due(self._unused_failing(), self.probe_interval_s))

    def _unused_failing(self) -> list[str]:
        """The failing gateways requests do not try: all but the one they go to first, or
        all if the installation was given up (its requests stopped); and those of another
        installation (requests send them nothing: only a probe sees one come back)."""
        current = None if self._is_down() else self.current_server
        with self._lock:
            failing = list(self._failing)
        return [s for s in failing if s != current or self._refusal(s) is not None]

    def _sleep(self, delay_s: float, flush: bool) -> None:
        if not self._stop.is_set():
            self._stop.wait(delay_s)
            return
        remaining = self.stop_deadline - time.monotonic() if flush else 0.0
        if remaining <= 0:
            raise Stopped("stopping before the gateway answered")
        time.sleep(min(delay_s, remaining))

    def write(self, body: bytes) -> dict[str, Any]:
        return self.post("/v1/write", body, CONTENT_TYPE, flush=True)

    def write_to_owner(self, owner_url: str, body: bytes, timeout_s: float) -> OwnerAttempt:
        """One attempt of ``POST /v1/write`` at a partition owner's URL (no retry, no failover),
        answered within ``timeout_s`` (connecting within 2 s).

        The caller checked ``owner_url`` against its :class:`~push_client.owner_routes.
        OwnerPolicy` (the token goes there).  Anything but a 200 in time is a failure: the
        caller sends the same body to the configured gateways, which deduplicate what landed.
        """
        headers = {"Content-Type": CONTENT_TYPE, **self._token.headers()}
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        try:
            response = self._http.post(
                owner_url + "/v1/write", content=body, headers=headers, timeout=timeout
            )
        except httpx.HTTPError as exc:
            self.stats.count_owner_write("fallback")
            self.stats.count_retry()
            return OwnerAttempt(None, maybe_written=not isinstance(exc, _NOT_SENT))
        if response.status_code != 200:
            self.stats.count_owner_write("fallback")
            self.stats.count_retry()
            return OwnerAttempt(None, maybe_written=response.status_code >= 500)
        self.stats.count_owner_write("owner")
        self.stats.stall.answered()
        parsed: dict[str, Any] = orjson.loads(response.content)
        forwarded = response.headers.get(FORWARDED_HEADER, "0")
        return OwnerAttempt(
            parsed, maybe_written=True, forwarded=int(forwarded) if forwarded.isdigit() else 0
        )

    def get_owners(self, log_type: str) -> dict[str, Any] | None:
        """``GET /v1/owners?log_type=`` from the preferred gateway, once; None if it failed."""
        server = self.current_server
        if self._refusal(server) is not None:
            return None  # another installation's owners are not this one's
        try:
            if (
                self._check is not None
                and self._check.confirm(self._group, server, self._http) is not None
            ):
                return None  # it cannot say its installation now: nor its owners
            response = self._http.get(
                server + OWNERS_PATH,
                params={"log_type": log_type},
                headers=self._token.headers(),
                timeout=10.0,
            )
        except httpx.HTTPError as exc:
            log.info(
                "asking %s for the owners of %s: %s", server, log_type, failure_text(exc, server)
            )
            return None
        if response.status_code != 200:
            if response.status_code != 404:  # 404: no topic yet
                log.warning(
                    "asking %s for the owners of %s: HTTP %d %s",
                    server,
                    log_type,
                    response.status_code,
                    response.text[:200],
                )
            return None
        try:
            parsed = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, dict) else None

    def open_sessions(self, sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The batch form of ``POST /v1/sessions``: answers in the request's order.

        A session asked with ``"fence": true`` starts a new epoch for its source, so that
        writes of an earlier incarnation of this client (killed with a request in flight) are
        refused from now on.  An answer may be a refusal of that one session (``"error"``).
        """
        answer = self.post("/v1/sessions", orjson.dumps({"sessions": sessions}), "application/json")
        results = answer.get("sessions")
        if not isinstance(results, list) or len(results) != len(sessions):
            raise LogbrokerError(f"gateway answered sessions with a bad body: {answer!r:.300}")
        return results


def _probe(http: httpx.Client, server: str) -> str | None:
    """Whether ``server`` can take writes (``GET /readyz``; ``/healthz`` for a gateway too
    old to have it): None if it can, else what failed (``ConnectError: ...``, ``HTTP 503``)."""
    try:
        response = http.get(server + "/readyz")
        if response.status_code == 404:
            response = http.get(server + "/healthz")
    except httpx.HTTPError as exc:
        return failure_text(exc, server)
    if response.status_code == 200:
        return None
    return f"HTTP {response.status_code}"


def failure_text(exc: httpx.HTTPError, url: str) -> str:
    """A request's failure as logged and shown: ``Kind: detail``.

    A host name that does not resolve is said as such, naming the host
    (``NameResolutionError: cannot resolve host gw1.example: Name or service not known``):
    httpx calls it a ``ConnectError`` like a refused connection, with only the resolver's
    message (``[Errno -2] Name or service not known``), which names nothing.
    """
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < 8:
        if isinstance(cause, socket.gaierror):
            host = httpx.URL(url).host or url
            return f"NameResolutionError: cannot resolve host {host}: {cause.strerror or cause}"
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return f"{type(exc).__name__}: {exc}"


def _partitions_unavailable(response: httpx.Response) -> PartitionsUnavailable | None:
    if response.status_code != 503:
        return None
    try:
        return PartitionsUnavailable.from_body(orjson.loads(response.content))
    except orjson.JSONDecodeError:
        return None


def _refused(response: httpx.Response) -> Refused:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        return Refused(
            response.status_code, str(body.get("error", "")), str(body.get("reason", ""))[:500]
        )
    return Refused(response.status_code, "http_error", response.text[:300])
