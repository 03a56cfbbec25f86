"""Pages of a partition's state keys in key order, for finding state nobody uses any more.

The Kafka backend keeps a partition's state area as a table in memory (at the partition's
owner, and as a replay of its changelog elsewhere), not in an ordered index.  A scan
(``LogStore.scan_state`` of :class:`~log_store.interface.StateScan`) that starts
(``after == ""``) takes a sorted listing of the table's keys under the prefix; its later
pages are cut from that listing, which is dropped after the last page.  So a scan of 100,000
keys sorts once, not once a page.

Pages are a hint: the table goes on changing while a scan pages through it, and a listing
may be as old as the scan.  Whatever a scan finds is checked again inside a transaction of
the partition (idle source expiry, see ``session_dedup.source_expiry``).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

Entry = tuple[str, bytes]


class StateListings:
    """The sorted listings of the scans under way, by (topic id, partition, prefix)."""

    def __init__(self) -> None:
        self._listings: dict[tuple[str, int, str], tuple[list[str], list[Entry]]] = {}
        self._lock = threading.Lock()

    def page(
        self,
        topic_id: str,
        partition: int,
        prefix: str,
        after: str,
        limit: int,
        entries: Callable[[], list[Entry]],
    ) -> list[Entry]:
        """Up to ``limit`` entries whose key sorts after ``after``, in key order.

        ``entries()`` gives the table's entries under ``prefix`` (any order); it is called
        when a scan starts, or when a scan goes on whose listing is gone."""
        where = (topic_id, partition, prefix)
        with self._lock:
            listing = None if after == "" else self._listings.get(where)
        if listing is None:
            ordered = sorted(entries())
            listing = ([key for key, _value in ordered], ordered)
        keys, ordered = listing
        start = bisect.bisect_right(keys, after)
        page = ordered[start : start + limit]
        with self._lock:
            if start + limit < len(ordered):
                self._listings[where] = listing
            else:
                self._listings.pop(where, None)
        return page
