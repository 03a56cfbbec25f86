"""The audit topics read back: the latest record per (dc, tier, instance, topic, window).

An instance's records are one source, so they sit in one partition in the order they were
written; reading every partition in offset order and keeping the last record of each key gives
each instance's latest totals.  Every record is also kept in the key's history, from which the
reconciler finds when a tier reached the source's count.  :meth:`AuditLedger.refresh` reads
only what was appended since the previous call.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from audit.records import CountRecord, decode_records, is_audit_topic
from log_store import LogbrokerError, LogStore
from session_dedup.envelope import decode

READ_BYTES = 4 << 20


@dataclass
class TierSeries:
    """One tier's records (all its instances) for one (topic, window), in log order."""

    records: list[CountRecord] = field(default_factory=list)
    latest: dict[str, CountRecord] = field(default_factory=dict)
    """Per instance: the record of its highest seqno."""
    _seqnos: dict[str, int] = field(default_factory=dict)

    def add(self, record: CountRecord, seqno: int) -> None:
        self.records.append(record)
        # The same records are read twice where a DC holds a mirrored copy of another's
        # audit topic, and the copy may be behind: the highest seqno wins, not the last read.
        if seqno >= self._seqnos.get(record.instance, -1):
            self._seqnos[record.instance] = seqno
            self.latest[record.instance] = record

    @property
    def messages(self) -> int:
        return sum(r.messages for r in self.latest.values())

    @property
    def lines(self) -> int:
        return sum(r.lines for r in self.latest.values())


def tier_label(tier: str, audit_topic: str, topic: str) -> str:
    """``tier``, or ``tier@dc`` when it counted in another DC than the topic's (a mirror)."""
    audit_dc = audit_topic.split(".", 1)[0]
    return tier if audit_dc == topic.split(".", 1)[0] else f"{tier}@{audit_dc}"


class AuditLedger:
    """Every audit record of a store, read incrementally."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, int], dict[str, TierSeries]] = {}
        """(topic, window) -> tier label -> series."""
        self._positions: dict[tuple[str, str, int], int] = {}
        self._lock = threading.Lock()

    def add(self, audit_topic: str, records: Iterable[CountRecord], seqno: int) -> None:
        """Records of one chunk of the audit topic (its seqno orders an instance's records)."""
        for record in records:
            label = tier_label(record.tier, audit_topic, record.topic)
            tiers = self.series.setdefault((record.topic, record.window_start), {})
            tiers.setdefault(label, TierSeries()).add(record, seqno)

    def refresh(self, store: LogStore) -> None:
        """Read what the audit topics gained since the last call."""
        with self._lock:
            for info in store.list_topics():
                if not is_audit_topic(info.name):
                    continue
                try:
                    partitions = store.describe_topic(info.name).partitions
                except (LogbrokerError, sqlite3.Error, KeyError):
                    # deleted, or (read-only handle) still being created: next time
                    continue
                for part in partitions:
                    self._read_partition(
                        store,
                        info.name,
                        info.topic_id,
                        part.partition,
                        part.start_offset,
                        part.end_offset,
                    )

    def _read_partition(
        self, store: LogStore, topic: str, topic_id: str, partition: int, start: int, end: int
    ) -> None:
        key = (topic, topic_id, partition)
        offset = max(self._positions.get(key, start), start)
        while offset < end:
            try:
                result = store.read(topic, partition, offset, READ_BYTES)
            except LogbrokerError:
                break
            if not result.records:
                break
            for record in result.records:
                offset = record.offset + 1
                try:
                    envelope = decode(record.value)
                except ValueError:
                    continue
                if envelope.kind == "chunk" and envelope.codec == "raw":
                    self.add(topic, decode_records(envelope.data), envelope.seqno)
        self._positions[key] = offset
