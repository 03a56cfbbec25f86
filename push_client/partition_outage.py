"""A file whose partition has no reachable owner waits; the host's other files keep shipping.

On Kafka every partition has one owner gateway.  While a partition has none (its owner was
killed and the group has not handed the partition on yet) or its owner cannot be reached, a
write to it is answered 503 ``partition_unavailable``, naming the sources that wait; the
sections of other partitions in the same request were written.  The gateway works, so the
installation is not given up: each file named *waits for its partition*.  Its chunks go back
among its pending ones, unchanged (a chunk the owner took before it became unreachable is
answered ``duplicate`` when sent again; the same chunks, not ones cut again, so no byte can
land twice), and the other files of the request are sent again at once (what of them was
written is answered ``duplicate``).

The files waiting for one partition share one :class:`PartitionOutage`: one of them at a time
is sent, alone, after a backoff (up to ``max_backoff_s``) as the partition's *probe*, and its
first acknowledgement ends the wait of them all.  A probe may wait for the gateway's answer up
to its operation timeout: probes use at most ``max_in_flight - 1`` of the requests in flight,
so files on healthy partitions always have one.

Not parking (``push_client.parking``): a partition outage passes by itself, no operator acts.
With several installations the files stay on their installation: it answers, only one of its
partitions is away for a while (the group hands it on within its session timeout).

The wait shows in ``--status`` (phase ``waiting``), in the metrics and in the log (when a file
starts waiting, and when its partition takes writes again), naming the file and the partition.

The partition a file waits for is not always the one its data goes to: a source that a gateway
routes for the first time (another gateway wrote it so far) needs its pin, kept in the state
of the partition its pin key hashes to; when that one has no reachable owner the gateway names
it with ``"pins": true``, and the file is said to wait for the partition that holds its pin, with
the partition its data goes to beside it (:func:`waits_for`), so that the log agrees with
``--status``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from push_client.backoff import Backoff

if TYPE_CHECKING:
    from push_client.tailer import TailedFile

log = logging.getLogger("logbroker.push")

_FIRST_RETRY_S = 1.0


@dataclass(eq=False)
class PartitionOutage:
    """One partition of one installation without a reachable owner, and the files waiting."""

    installation: str
    topic: str
    partition: int
    reason: str
    """What the gateway said last (whose owner, what failed)."""
    since: float
    """Wall-clock time of the first answer that named it."""
    started: float
    """The same instant on the monotonic clock."""
    backoff: Backoff = field(repr=False)
    retry_at: float = 0.0
    """Monotonic time before which no probe is sent."""
    retry_wall: float = 0.0
    """The same instant on the wall clock, for the status (read once, with ``retry_at``)."""
    probing: bool = False
    """A probe (a request of one waiting file) is in flight."""
    answers: int = 0
    """Answers that named it so far."""
    files: set[TailedFile] = field(default_factory=set, repr=False)
    pin_files: set[TailedFile] = field(default_factory=set, repr=False)
    """The files of ``files`` that wait because the partition holds their pin."""

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}"

    def _next_try(self) -> None:
        delay = self.backoff.next_delay()
        now, wall = time.monotonic(), time.time()
        self.retry_at, self.retry_wall = now + delay, wall + delay


def data_partition(where: str, topic: str, partition: int) -> str:
    """Where the data of a file waiting for the partition holding its pin (``where``) goes:
    ``topic``/``partition`` are its data's (-1 when not known yet)."""
    if partition < 0:
        return "its data partition is not known yet"
    if f"{topic}/{partition}" == where:
        return "its data goes there too"
    return f"its data goes to {topic}/{partition}"


def waits_for(where: str, pin: bool, topic: str, partition: int) -> str:
    """The partition a file waits for, said so that the one holding its pin is not taken for
    its data's partition."""
    if not pin:
        return f"partition {where}"
    return f"partition {where}, which holds its pin ({data_partition(where, topic, partition)}),"


class PartitionOutages:
    """The partitions without a reachable owner now; owned by the loop thread."""

    def __init__(self, cap_s: float, max_probes: int) -> None:
        self.cap_s = max(cap_s, _FIRST_RETRY_S)
        self.max_probes = max(1, max_probes)
        """Probes in flight at most (``max_in_flight - 1``, at least 1)."""
        self._outages: dict[tuple[str, str, int], PartitionOutage] = {}

    def __len__(self) -> int:
        return len(self._outages)

    def wait(
        self,
        tailed: TailedFile,
        installation: str,
        topic: str,
        partition: int,
        reason: str,
        probe: PartitionOutage | None,
        *,
        pin: bool = False,
    ) -> None:
        """The gateway said ``tailed``'s partition has no reachable owner: hold it back.

        ``probe`` is the outage the failed request probed (None: a request sent before the
        wait began, or one that was no probe): only a failed probe moves the next try on.
        ``pin``: the partition named holds the file's pin (the gateway routes its source for
        the first time), not necessarily its data.  The caller gave the file's chunks back.
        """
        key = (installation, topic, partition)
        outage = self._outages.get(key)
        if outage is None:
            outage = self._outages[key] = PartitionOutage(
                installation,
                topic,
                partition,
                reason,
                time.time(),
                time.monotonic(),
                Backoff(base_s=_FIRST_RETRY_S, cap_s=self.cap_s),
            )
            outage._next_try()
        elif probe is outage:
            outage._next_try()
            log.debug("partition %s still has no owner: %s", outage.where, reason)
        outage.answers += 1
        outage.reason = reason
        if tailed.outage is not outage:
            self.forget(tailed)
            tailed.outage = outage
            outage.files.add(tailed)
        elif (tailed in outage.pin_files) == pin:
            return  # said already
        if pin:
            outage.pin_files.add(tailed)
        else:
            outage.pin_files.discard(tailed)
        log.warning(
            "%s: %s has no reachable owner now (%s); this file waits, tried again every "
            "%.0f s at most (the files not waiting for it ship on)",
            tailed.path,
            waits_for(outage.where, pin, tailed.topic, tailed.partition),
            reason,
            self.cap_s,
        )

    def due(self, tailed: TailedFile, now: float, probes: int) -> bool:
        """Whether ``tailed`` may be sent now (``probes``: probes in flight now)."""
        outage = tailed.outage
        if outage is None:
            return True
        return not outage.probing and outage.retry_at <= now and probes < self.max_probes

    def probes(self) -> int:
        return sum(1 for o in self._outages.values() if o.probing)

    def back(self, tailed: TailedFile) -> None:
        """A write of ``tailed`` was acknowledged: its partition takes writes again, for
        every file that waited for it."""
        outage = tailed.outage
        if outage is None:
            return
        self._outages.pop((outage.installation, outage.topic, outage.partition), None)
        for waiting in outage.files:
            waiting.outage = None
        outage.pin_files.clear()
        log.info(
            "partition %s takes writes again: %d files ship on after %.1f s (%s)",
            outage.where,
            len(outage.files),
            time.monotonic() - outage.started,
            ", ".join(sorted(t.path for t in outage.files)[:5])
            + (", ..." if len(outage.files) > 5 else ""),
        )

    def forget(self, tailed: TailedFile) -> None:
        """``tailed`` waits no more (its session is opened again, elsewhere or anew, or it
        was let go); the outage goes when no file waits for it."""
        outage = tailed.outage
        if outage is None:
            return
        tailed.outage = None
        outage.files.discard(tailed)
        outage.pin_files.discard(tailed)
        if not outage.files:
            self._outages.pop((outage.installation, outage.topic, outage.partition), None)
