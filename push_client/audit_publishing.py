"""The push-client's tier of the audit: each installation's counts, published to whichever of
its gateways answers.

A chunk is counted (tier ``push-client``) when a gateway acknowledges it, in the counts of the
installation that acknowledged it, and each installation's counts are published to that
installation's log: the audit reads a DC's audit topic as that DC's tiers, so counts of one
installation's topics written into another's would show there as another DC's tier
(``push-client@dc2``), not as the source the gateway tier is compared with.

Within an installation the counts follow the data: they go first to the gateway the data goes
to now (:attr:`GatewayClient.current_server`, the last one that answered), then to the others
in the configured order, so a gateway that died does not keep the tier out of the audit.  An
installation whose gateways all fail keeps its counts until the next publication (every
interval, see :mod:`audit.publisher`); at exit the last publication gets one try at each of its
gateways, and what it could not publish is said in one line.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

from audit.publisher import AuditPublisher, interval_from_env
from audit.sinks import AuditForbidden, AuditWriteFailed, HttpAuditSink, incarnation_id
from audit.windows import WindowCounts
from push_client.installations import InstallationSet
from push_client.transport import GatewayClient

TIER = "push-client"
WRITE_TIMEOUT_S = 10.0
"""How long one gateway is given for one audit write before the next one is tried."""


def gateways_in_order(client: GatewayClient) -> list[str]:
    """The installation's gateways, the one its data goes to now first."""
    current = client.current_server
    return [current, *(url for url in client.servers if url != current)]


class FailoverAuditSink:
    """Writes an audit chunk to the first gateway of ``servers()`` that takes it.

    Trying the next gateway with the same chunk is safe: the gateways of one installation share
    one log, which answers a chunk it holds already as a duplicate (and the publisher then
    writes it again above it).  A token that may not write the audit log type is refused by
    every gateway alike, so that refusal ends the attempt at once.
    """

    def __init__(
        self,
        servers: Callable[[], Sequence[str]],
        *,
        auth_headers: Callable[[], dict[str, str]] | None = None,
        timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self._servers = servers
        self._auth_headers = auth_headers
        self._timeout_s = timeout_s
        self._sinks: dict[str, HttpAuditSink] = {}
        self._lock = threading.Lock()
        self.last_server = ""
        """The gateway that took the last write."""

    def _sink(self, url: str) -> HttpAuditSink:
        with self._lock:
            sink = self._sinks.get(url)
            if sink is None:
                sink = HttpAuditSink(
                    url, auth_headers=self._auth_headers, timeout_s=self._timeout_s
                )
                self._sinks[url] = sink
            return sink

    def write(self, source_id: str, seqno: int, data: bytes) -> tuple[bool, int]:
        failures = []
        for url in self._servers():
            try:
                answer = self._sink(url).write(source_id, seqno, data)
            except AuditForbidden:
                raise
            except AuditWriteFailed as exc:
                failures.append(f"{url}: {exc}")
                continue
            self.last_server = url
            return answer
        raise AuditWriteFailed("no gateway took it: " + "; ".join(failures))


class PushAuditPublishers:
    """One started :class:`AuditPublisher` per installation, of the counts it acknowledged.

    The instance name is the process's (:func:`audit.sinks.incarnation_id`), with the
    installation's name added when there are several: two installations may hold topics of
    the same name, and the audit adds the totals of different instances.
    """

    def __init__(
        self,
        counts: dict[str, WindowCounts],
        installations: InstallationSet,
        clients: dict[str, GatewayClient],
        *,
        auth_headers: Callable[[], dict[str, str]] | None = None,
        interval_s: float | None = None,
    ) -> None:
        incarnation = incarnation_id()
        self.sinks: dict[str, FailoverAuditSink] = {}
        self.publishers: dict[str, AuditPublisher] = {}
        for member in installations.members:
            client = clients[member.name]
            sink = FailoverAuditSink(
                functools.partial(gateways_in_order, client), auth_headers=auth_headers
            )
            instance = f"{incarnation}-{member.name}" if installations.multi else incarnation
            self.sinks[member.name] = sink
            self.publishers[member.name] = AuditPublisher(
                TIER,
                instance,
                counts[member.name],
                sink,
                interval_s=interval_from_env() if interval_s is None else interval_s,
            )

    def start(self) -> PushAuditPublishers:
        for publisher in self.publishers.values():
            publisher.start()
        return self

    def stop(self, timeout_s: float) -> None:
        """Publish what is left of every installation at once, taking at most ``timeout_s``
        (each publisher says in one line what it could not publish)."""
        stoppers = [
            threading.Thread(
                target=publisher.stop,
                args=(timeout_s,),
                name=f"audit-stop-{name}",
                daemon=True,
            )
            for name, publisher in self.publishers.items()
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            # each stop keeps to timeout_s itself; the margin is for starting its threads.
            # The sinks stay open: a last publish left to itself may still be using one.
            stopper.join(timeout_s + 1.0)
