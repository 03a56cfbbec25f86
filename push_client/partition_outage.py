"""A file whose partition has no reachable owner waits; the host's other files keep shipping.

On Kafka every partition has one owner gateway.  While a partition has none (its owner was
killed and the group has not handed the partition on yet) or its owner cannot be reached, a
write to it is answered 503 ``partition_unavailable``, naming the sources that wait; the
sections of other partitions in the same request were written.  The gateway works, so the
installation is not given up: each file named *waits for its partition*.  Its chunks go back
among its pending ones, unchanged (a chunk the owner took before it became unreachable is
answered ``duplicate`` when sent again; the same chunks, not ones cut again, so no byte can
land twice), and it is tried again after a backoff (up to ``max_backoff_s``), in requests of
its own, one at a time, so that a try that waits for the gateway's answer holds no other file
back.  The first acknowledgement ends the wait.  The other files of the request are sent again
at once (what of them was written is answered ``duplicate``).

Not parking (``push_client.parking``): a partition outage passes by itself, no operator acts.
With several installations the file stays on its own: the installation answers, only one of
its partitions is away for a while (the group hands it on within its session timeout).

The wait shows in ``--status`` (phase ``waiting``), in the metrics and in the log (once when
it starts, once when it ends), naming the file and the partition.
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


@dataclass
class PartitionOutage:
    """Why and since when a file waits for its partition, and when it is tried next."""

    topic: str
    partition: int
    reason: str
    """What the gateway said (whose owner, what failed)."""
    since: float
    """Wall-clock time of the first answer that named the file."""
    started: float
    """The same instant on the monotonic clock."""
    retry_at: float
    """Monotonic time before which the file is not sent."""
    retry_wall: float
    """The same instant on the wall clock, for the status (read once, with ``retry_at``)."""
    backoff: Backoff = field(repr=False)
    tries: int = 1
    """Answers that named the file so far."""

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}"


def wait_for_partition(
    tailed: TailedFile, topic: str, partition: int, reason: str, cap_s: float
) -> None:
    """``tailed``'s partition has no reachable owner: hold the file back until its next try.

    The caller gave its chunks back.  An answer to a request sent before the wait began (one
    pipelined behind the first) moves the next try no further.
    """
    now, wall = time.monotonic(), time.time()
    outage = tailed.outage
    if outage is None:
        outage = tailed.outage = PartitionOutage(
            topic,
            partition,
            reason,
            wall,
            now,
            now,
            wall,
            Backoff(base_s=_FIRST_RETRY_S, cap_s=max(cap_s, _FIRST_RETRY_S)),
        )
        log.warning(
            "%s: partition %s has no reachable owner now (%s); this file waits, tried again "
            "every %.0f s at most (the other files ship on)",
            tailed.path,
            outage.where,
            reason,
            outage.backoff.cap_s,
        )
    else:
        outage.tries += 1
        outage.reason = reason
        if outage.retry_at > now:
            return
        log.debug("%s: partition %s still has no owner: %s", tailed.path, outage.where, reason)
    delay = outage.backoff.next_delay()
    outage.retry_at, outage.retry_wall = now + delay, wall + delay
    # tried again in requests of its own, one at a time: a try waits for the gateway's answer
    # (up to its operation timeout) and must not hold other files back
    tailed.alone = True
    tailed.pipeline_blocked = True


def partition_back(tailed: TailedFile) -> None:
    """A write of ``tailed`` was acknowledged: its partition takes writes again."""
    outage = tailed.outage
    if outage is None:
        return
    tailed.outage = None
    log.info(
        "%s: partition %s takes writes again; shipping on after %.1f s (%d answers said it "
        "had no owner)",
        tailed.path,
        outage.where,
        time.monotonic() - outage.started,
        outage.tries,
    )


def forget_outage(tailed: TailedFile) -> None:
    """The file's session is opened again (elsewhere, or anew): its wait, if any, is over."""
    tailed.outage = None
