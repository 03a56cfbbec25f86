"""Gateways grouped by installation, and which installation the client writes to now.

An *installation* is one log (one data dir, or one Kafka cluster) behind any number of
gateways; each has its own exactly-once state.  ``--server URL,URL`` names one installation
with several gateways (a request moves on to the next gateway at once, or once it has been
unanswered for ``stall_after_s``).  Named groups,
``--server dc1=http://a:8080,http://b:8080 --server dc2=http://c:8080``, are installations in
order of preference: the client writes to the first one that is up; one whose gateways all
fail (or hang, unanswered for ``stall_after_s``) for ``failover_after_s`` is marked down and
the next takes over; a prober asks every installation that is down for ``/readyz`` (at waits
growing from ``probe_interval_s`` to ``probe_max_interval_s``, see ``push_client.backoff``)
and marks it up again, so new data goes back to the preferred installation once it returns.

Health is learned from requests, so an installation that is up and has had nothing to answer
for ``probe_max_interval_s`` (an idle client) is probed too (``watch_idle``): one that does
not answer is shown "not answering since ..." (``unanswered_since``), probed again every
``probe_interval_s``, and, with several installations, marked down once its probes have failed
for ``failover_after_s``, as its requests would have been; new data then goes to the next one
at once instead of waiting ``failover_after_s`` again.  A request or probe answered clears it.

What moves where, and how a line acknowledged by one installation is never sent to another,
is ``push_client.handover``'s part; this module only knows who is up.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

# the one splitter of every --server URL[,URL...], the commands' and the loader's too
from delivery.gateway_retry import gateway_urls
from push_client.backoff import CLOSE_WAIT_S, ProbeSchedule

if TYPE_CHECKING:
    from push_client.gateway_check import GatewayCheck

log = logging.getLogger("logbroker.push")

DEFAULT_NAME = "default"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAMED = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})=(.*)", re.DOTALL)


@dataclass(frozen=True)
class InstallationSpec:
    """One installation: a name and the URLs of its gateways."""

    name: str
    servers: tuple[str, ...]


def parse_servers(values: Sequence[str]) -> tuple[InstallationSpec, ...]:
    """Installations from ``--server`` values: ``URL[,URL...]`` or ``NAME=URL[,URL...]``.

    Unnamed values all belong to one installation (as before installations existed); named
    ones are installations in the order given.  Raises ``ValueError`` on a mix of both, a name
    given twice or an empty group.
    """
    named: list[InstallationSpec] = []
    unnamed: list[str] = []
    for value in values:
        match = _NAMED.fullmatch(value.strip())
        if match is not None and "://" not in match.group(1):
            urls = gateway_urls(match.group(2))
            if not urls:
                raise ValueError(f"installation {match.group(1)!r} has no gateway URL")
            if any(spec.name == match.group(1) for spec in named):
                raise ValueError(f"installation {match.group(1)!r} is given twice")
            named.append(InstallationSpec(match.group(1), urls))
        else:
            unnamed.extend(gateway_urls(value))
    if named and unnamed:
        raise ValueError(
            "give every --server as NAME=URL[,URL...] or none: installations cannot be mixed "
            f"with unnamed gateways ({unnamed[0]})"
        )
    if named:
        return tuple(named)
    return (InstallationSpec(DEFAULT_NAME, tuple(unnamed)),) if unnamed else ()


class Installation:
    """One installation's gateways and whether it is up (shared with sender threads)."""

    def __init__(self, spec: InstallationSpec) -> None:
        self.spec = spec
        self.down_since: float | None = None
        self.last_error = ""
        self.last_answered = time.monotonic()
        """When a request or probe of it was last answered (monotonic; or when it was made)."""
        self.unanswered_since: float | None = None
        """Wall-clock time of the first failed probe of it while up and idle (None: answers)."""
        self.idle_probe_at = 0.0
        """When it is probed next while up and idle (monotonic; see ``watch_idle``)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def up(self) -> bool:
        return self.down_since is None

    def is_down(self) -> bool:
        """For the transport: whether requests to this installation should stop at once."""
        return self.down_since is not None

    def answered(self) -> None:
        """A request to it (or a probe) was answered: it is not idle, and it answers."""
        self.last_answered = time.monotonic()
        self.unanswered_since = None


class InstallationSet:
    """The installations in order of preference, their health, and the prober.

    ``version`` changes whenever one goes down or comes back, so the daemon's loop can notice
    without locks.  With a single installation nothing is ever marked down: its requests are
    retried until they succeed, as they always were.
    """

    def __init__(
        self,
        specs: Sequence[InstallationSpec],
        *,
        probe_interval_s: float,
        wake: Callable[[], None],
        probe_max_interval_s: float = 60.0,
        probe_timeout_s: float = 2.0,
        check: GatewayCheck | None = None,
    ) -> None:
        if not specs:
            raise ValueError("no installation")
        self.members = [Installation(spec) for spec in specs]
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self._probes = ProbeSchedule(probe_interval_s, probe_max_interval_s)
        """When each installation that is down is probed next, by name."""
        self._wake = wake
        self._check = check
        """Which installation each gateway belongs to: one of another installation than its
        group's does not make its group up (see ``push_client.gateway_check``)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self.version = 0
        self.failovers = 0
        self.probe_max_interval_s = probe_max_interval_s
        self._failover_after_s: float | None = None
        self._watch_idle = False

    @property
    def multi(self) -> bool:
        """Whether data may go to more than one installation (and so needs handovers)."""
        return len(self.members) > 1

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def get(self, name: str) -> Installation | None:
        return next((m for m in self.members if m.name == name), None)

    def is_up(self, name: str) -> bool:
        member = self.get(name)
        return member is not None and member.up

    def current(self) -> Installation:
        """The most preferred installation that is up (the first, if none is)."""
        return next((m for m in self.members if m.up), self.members[0])

    def mark_down(self, member: Installation, reason: str) -> None:
        """Requests to ``member`` failed for too long: leave it until the prober sees it up."""
        if not self.multi:
            return
        with self._lock:
            if member.down_since is not None:
                return
            before = self.current()
            member.down_since = time.monotonic()
            member.last_error = reason
            # The requests that failed for failover_after_s were its first try.
            self._probes.failed(member.name)
            self.version += 1
            after = self.current()
            if after is not before:
                self.failovers += 1
        log.error(
            "installation %s is down (%s); writing to %s until it is back",
            member.name,
            reason,
            after.name if after.up else "none (every installation is down)",
        )
        self._start_prober()
        self._wake()

    def watch_idle(self, failover_after_s: float) -> None:
        """Probe installations that are up and idle (see the module's docstring)."""
        self._failover_after_s = failover_after_s
        self._watch_idle = True
        self._start_prober()

    def mark_up(self, member: Installation) -> None:
        with self._lock:
            if member.down_since is None or self._stop.is_set():
                return
            before = self.current()
            member.down_since = None
            # Up again: the reason it went down is history (the log said it), not its state.
            member.last_error = ""
            member.last_answered = time.monotonic()
            member.unanswered_since = None
            self._probes.answered(member.name)
            self.version += 1
            after = self.current()
            if after is not before:
                self.failovers += 1
        log.info("installation %s is up again; now writing to %s", member.name, after.name)
        self._wake()

    def next_probe_at(self, member: Installation) -> float | None:
        """Wall-clock time ``member`` is probed next while it is down (None while it is up)."""
        return self._probes.next_probe_at(member.name)

    # -- probing --------------------------------------------------------------------------------
    def _start_prober(self) -> None:
        with self._lock:
            if self._prober is not None or self._stop.is_set():
                return
            self._prober = threading.Thread(target=self._probe_loop, name="push-probe", daemon=True)
            self._prober.start()

    def _probe_loop(self) -> None:
        probes = self._probes
        with httpx.Client(timeout=self.probe_timeout_s) as http:
            while not self._stop.is_set():
                for name in probes.due(self._down()):
                    member = self.get(name)
                    if member is None or self._stop.is_set():
                        continue
                    healthy = self._healthy(http, member)
                    if self._stop.is_set():
                        # Closed while the probe waited: what it found is nobody's news now.
                        return
                    if healthy:
                        self.mark_up(member)
                        continue
                    with self._lock:
                        if not member.up:
                            probes.failed(name)
                idle_wait = self._probe_idle(http) if self._watch_idle else self.probe_interval_s
                # Wakes at least every probe_interval_s: one marked down meanwhile is due.
                wait = probes.until_due(self._down(), self.probe_interval_s)
                self._stop.wait(max(0.0, min(wait, idle_wait)))

    def _probe_idle(self, http: httpx.Client) -> float:
        """Probe each installation that is up and idle when due; the wait until the next is."""
        wait = self.probe_interval_s
        for member in self.members:
            if self._stop.is_set():
                break
            now = time.monotonic()
            if not member.up:
                continue
            if member.unanswered_since is None:
                due = max(member.last_answered + self.probe_max_interval_s, member.idle_probe_at)
            else:
                due = member.idle_probe_at
            if now < due:
                wait = min(wait, due - now)
                continue
            healthy = self._healthy(http, member)
            if self._stop.is_set():
                return 0.0
            member.idle_probe_at = time.monotonic() + self.probe_interval_s
            if healthy:
                member.answered()
                continue
            with self._lock:
                since = member.unanswered_since
                if not member.up:
                    continue
                first = since is None
                if since is None:
                    since = member.unanswered_since = time.time()
            if first:
                log.warning(
                    "installation %s is idle and its gateways do not answer /readyz", member.name
                )
                self._wake()  # the status shows it
            failing_s = time.time() - since
            if (
                self.multi
                and self._failover_after_s is not None
                and failing_s >= self._failover_after_s
            ):
                self.mark_down(
                    member,
                    f"idle, no gateway answered /readyz for {failing_s:.1f} s",
                )
        return wait

    def _healthy(self, http: httpx.Client, member: Installation) -> bool:
        """Whether a gateway of ``member`` can take writes (``/readyz``; ``/healthz`` for a
        gateway too old to have it) and belongs to it: a probe may be the first to reach it,
        or to reach it back after it failed (as another installation's, or, refused before,
        as its own again)."""
        check = self._check
        for url in member.spec.servers:
            if not _ready(http, url):
                if check is not None:
                    check.suspect(member.name, url)
                continue
            if check is None or check.check(member.name, url, http) is None:
                return True
        return False

    def _down(self) -> list[str]:
        return [m.name for m in self.members if not m.up]

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop probing, waiting at most ``wait_s`` for a probe in flight.

        A probe still waiting for an installation that hangs is left to its (daemon) thread,
        and what it finds is dropped: probes are never data, and a stopping client used to
        wait up to twice ``probe_timeout_s`` for one, past its ``shutdown_timeout_s``.
        """
        self._stop.set()
        prober = self._prober
        if prober is not None:
            prober.join(wait_s)


def _ready(http: httpx.Client, url: str) -> bool:
    """Whether the gateway at ``url`` can take writes (``/readyz``: its store is there, e.g.
    its Kafka answers); ``/healthz`` for a gateway too old to have ``/readyz``."""
    try:
        status = http.get(url + "/readyz").status_code
        if status == 404:
            status = http.get(url + "/healthz").status_code
    except httpx.HTTPError:
        return False
    return status == 200
