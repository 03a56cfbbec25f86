"""The records tiers publish to the audit topic ``<dc>.logbroker-audit``.

Each record is one JSON line: a tier instance's *cumulative* messages and lines of one topic
in one window, as of ``published_ms``.  A later record of the same (tier, instance, topic,
window) replaces the earlier one, so a record written twice, or replayed, never counts twice.
The records of one instance are one source of the audit topic, written through the ordinary
exactly-once write path (seqnos strictly increasing), so they travel and mirror like any data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import orjson

AUDIT_LOG_TYPE = "logbroker-audit"
TIERS = ("push-client", "gateway", "mirror", "push", "loader")
"""The tiers in the order a line passes them; the first present in a window is its source."""


def is_audit_topic(topic: str) -> bool:
    """Whether ``topic`` holds audit records (never counted by the tiers themselves)."""
    return topic.endswith("." + AUDIT_LOG_TYPE)


def in_prefix(topic: str, prefix: str) -> bool:
    """Whether a reader of ``prefix`` (e.g. ``dc1.``) reads ``topic``: audit topics only when
    the prefix names them, so readers of a whole DC get its logs, not the audit's records."""
    if not topic.startswith(prefix):
        return False
    return not is_audit_topic(topic) or AUDIT_LOG_TYPE in prefix


def audit_source_id(tier: str, instance: str) -> str:
    """The source id under which one tier instance writes its records."""
    return f"audit:{tier}:{instance}"[:200]


@dataclass(frozen=True)
class CountRecord:
    tier: str
    instance: str
    topic: str
    window_start: int
    messages: int
    lines: int
    published_ms: int


def encode_records(records: Iterable[CountRecord]) -> bytes:
    """Whole JSON lines, one per record."""
    return b"".join(orjson.dumps(asdict(r)) + b"\n" for r in records)


def decode_records(data: bytes) -> list[CountRecord]:
    """The records in a chunk's data; lines that are not a record are skipped."""
    out = []
    for line in data.splitlines():
        try:
            doc = orjson.loads(line)
            out.append(
                CountRecord(
                    tier=str(doc["tier"]),
                    instance=str(doc["instance"]),
                    topic=str(doc["topic"]),
                    window_start=int(doc["window_start"]),
                    messages=int(doc["messages"]),
                    lines=int(doc["lines"]),
                    published_ms=int(doc["published_ms"]),
                )
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return out
