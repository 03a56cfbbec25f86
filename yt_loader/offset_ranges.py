"""Offset ranges: the unit of work the driver plans and an executor reads.

The driver fixes every range before any task runs, so a task's output depends only on its
range, never on when it ran: that is what lets the loader name its files after the range and
lets Spark rerun a task without changing the result.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from audit.records import AUDIT_LOG_TYPE, is_audit_topic
from yt_loader.errors import BadSourceOptions

DEFAULT_MAX_RANGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``start .. end-1`` of one partition of one topic."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}[{self.start}..{self.end})"


def topic_patterns(spec: str) -> list[str]:
    """The globs of a ``topics`` option: comma-separated, e.g. ``dc1.*,dc2.nginx-*``."""
    patterns = [p.strip() for p in spec.split(",") if p.strip()]
    if not patterns:
        raise BadSourceOptions("topics must name at least one topic or glob, e.g. 'dc1.*'")
    return patterns


def matching_topics(names: list[str], spec: str) -> list[str]:
    """The topics among ``names`` that match any glob of ``spec``, sorted."""
    patterns = topic_patterns(spec)
    return sorted(
        n
        for n in names
        if any(
            fnmatch.fnmatchcase(n, p) and (not is_audit_topic(n) or AUDIT_LOG_TYPE in p)
            for p in patterns
        )
    )


def split_range(
    topic: str,
    partition: int,
    start: int,
    end: int,
    bytes_per_offset: float,
    max_range_bytes: int = DEFAULT_MAX_RANGE_BYTES,
) -> list[OffsetRange]:
    """``start .. end-1`` cut into ranges of about ``max_range_bytes`` each (at least one)."""
    if end <= start:
        return []
    per_range = max(1, int(max_range_bytes / bytes_per_offset)) if bytes_per_offset > 0 else end
    ranges = []
    first = start
    while first < end:
        last = min(end, first + per_range)
        ranges.append(OffsetRange(topic, partition, first, last))
        first = last
    return ranges
