"""Audit of a log store: the exactly-once invariants checked against the data itself.

For every topic and partition: offsets increasing (and dense, where the store's offsets are:
on Kafka transaction markers take offsets too), every batch's checksum good, every value an
envelope; per source, seqnos strictly increasing and all in one partition (the pin); and the
dedup table in the partition's state area equal to what the log says each source wrote last.
A ``handover`` record (a push-client failed over from another installation) counts in the
source's seqno order like a chunk without data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from delivery.internal_state import is_internal
from log_store import LogbrokerError, LogStore
from session_dedup.envelope import decode
from session_dedup.seqno_table import SEQUENCED_KINDS, decode_seqno, seqno_key


@dataclass
class PartitionAudit:
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    records: int = 0
    sources: int = 0
    legacy_records: int = 0
    handovers: int = 0
    """Handover records: a source's data up to their seqno went to another installation."""
    mirrored: bool = False
    """A mirror's copy: its sources have no seqno table here (the source installation's
    gateway keeps it); the log's own invariants are checked all the same."""
    damaged: bool = False
    """Its files are damaged (the store cannot serve it): named once as a problem, not read."""
    unread_from: int | None = None
    """The offset a read failed at (a damaged batch): the records from there on are not
    checked, nor is the dedup table, which would name every source written past it."""


@dataclass
class AuditReport:
    partitions: list[PartitionAudit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_store(
    store: LogStore, topics: list[str] | None = None, max_problems: int = 100
) -> AuditReport:
    """Read every record of ``topics`` (default: all) and check the invariants."""
    report = AuditReport()
    names = topics or [t.name for t in store.list_topics() if not is_internal(t.name)]
    for name in names:
        pinned: dict[str, int] = {}
        for part in store.describe_topic(name).partitions:
            audit = PartitionAudit(name, part.partition, part.start_offset, part.end_offset)
            report.partitions.append(audit)
            if part.damaged is not None:
                # the topic's other partitions are audited all the same
                audit.damaged = True
                report.problems.append(f"{name}/{part.partition}: unreadable: {part.damaged}")
                continue
            _audit_partition(store, audit, pinned, report.problems)
    del report.problems[max_problems:]
    return report


_CATCH_UP_ROUNDS = 5
"""Times the log is read on to a live writer's new end before a table ahead of it counts."""


def _audit_partition(
    store: LogStore, audit: PartitionAudit, pinned: dict[str, int], problems: list[str]
) -> None:
    """Check one partition's records, then its dedup table against what they say.

    The table is read after the log: with gateways writing, it may already hold commits made
    after the log's end was taken.  A source the table has ahead of the log is then looked
    for further on: the log is read on to its new end (a few rounds), and only a difference
    left after that is a problem.
    """
    where = f"{audit.topic}/{audit.partition}"
    last: dict[str, int] = {}
    offset = _scan(store, audit, audit.start_offset, pinned, last, problems)
    audit.sources = len(last)
    if not last or audit.unread_from is not None:
        return
    for attempt in range(_CATCH_UP_ROUNDS + 1):
        raws = {
            source_id: store.get_state(audit.topic, audit.partition, seqno_key(source_id))
            for source_id in last
        }
        if all(raw is None for raw in raws.values()):
            # No source of the partition has a seqno key: it was filled by a mirror's replica
            # appends (a gateway records every source it writes), so there is no table to
            # compare.
            audit.mirrored = True
            return
        stored = {source_id: decode_seqno(raw) for source_id, raw in raws.items()}
        ahead = any(stored[source_id] > seqno for source_id, seqno in last.items())
        if not ahead or attempt == _CATCH_UP_ROUNDS:
            break
        end = store.end_offset(audit.topic, audit.partition)
        if end <= offset:
            break
        audit.end_offset = end
        offset = _scan(store, audit, offset, pinned, last, problems)
        audit.sources = len(last)
    for source_id, seqno in last.items():
        if stored[source_id] != seqno:
            problems.append(
                f"{where}: the dedup table says source {source_id!r} wrote up to "
                f"{stored[source_id]}, the log says {seqno}"
            )


def _scan(
    store: LogStore,
    audit: PartitionAudit,
    offset: int,
    pinned: dict[str, int],
    last: dict[str, int],
    problems: list[str],
) -> int:
    """Check the records from ``offset`` to ``audit.end_offset``; return where it stopped."""
    where = f"{audit.topic}/{audit.partition}"
    dense = store.capabilities.dense_offsets
    while offset < audit.end_offset:
        try:
            result = store.read(audit.topic, audit.partition, offset, 4 << 20)
        except LogbrokerError as exc:
            audit.unread_from = offset
            problems.append(
                f"{where}@{offset}: unreadable: {exc} (the records from there on and the "
                "dedup table are not checked)"
            )
            return audit.end_offset
        if not result.records:
            if dense:
                problems.append(f"{where}: no record at {offset}, below the end {audit.end_offset}")
            return audit.end_offset
        for record in result.records:
            if record.offset != offset if dense else record.offset < offset:
                problems.append(f"{where}: offset {record.offset} where {offset} was due")
            offset = record.offset + 1
            audit.records += 1
            try:
                env = decode(record.value)
            except ValueError as exc:
                problems.append(f"{where}@{record.offset}: not an envelope: {exc}")
                continue
            if env.kind not in SEQUENCED_KINDS:
                audit.legacy_records += 1
                continue
            if env.kind == "handover":
                audit.handovers += 1
            home = pinned.setdefault(env.source_id, audit.partition)
            if home != audit.partition:
                problems.append(
                    f"{audit.topic}: source {env.source_id!r} is in partitions {home} "
                    f"and {audit.partition}"
                )
            previous = last.get(env.source_id, 0)
            if env.seqno <= previous:
                problems.append(
                    f"{where}@{record.offset}: source {env.source_id!r} seqno {env.seqno} "
                    f"after {previous} (duplicate or out of order)"
                )
            last[env.source_id] = max(previous, env.seqno)
    return offset
