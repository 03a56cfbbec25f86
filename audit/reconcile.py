"""Tiers compared per window: completeness, lines lost and duplicated, time to 99.9% and 100%.

The *source* of a window is the first tier of :data:`audit.records.TIERS` that counted it in
the topic's own DC (the push-client, or the gateway for data written by other clients).  Each
tier is compared with the source's latest count: lines it lacks are *lost* (so far), lines
beyond it *duplicated*.  A tier after the source that ever counted a topic is expected in every
later window of that topic, so a tier that stopped publishing shows as lost, not as absent; a
push-client that counted nothing in a window the gateway counted is not expected there (the
gateway is the source: other clients wrote those lines).  Reach times are
seconds from the window's start to the first record that put the tier at 99.9% (100%) of the
source's latest count.
"""

from __future__ import annotations

import fnmatch
import math
import time
from dataclasses import dataclass, field
from typing import Any

from audit.ledger import AuditLedger, TierSeries
from audit.records import TIERS
from audit.windows import WINDOW_S


@dataclass
class TierRow:
    tier: str
    messages: int
    lines: int
    completeness: float
    lost_lines: int
    duplicated_lines: int
    reached_999_s: float | None
    reached_100_s: float | None


@dataclass
class WindowRow:
    topic: str
    window_start: int
    source_tier: str
    source_messages: int
    source_lines: int
    closed: bool
    complete: bool
    tiers: list[TierRow] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        """The shape of ``GET /v1/audit/windows``."""
        return {
            "topic": self.topic,
            "window_start": self.window_start,
            "window_end": self.window_start + WINDOW_S,
            "closed": self.closed,
            "complete": self.complete,
            "source_tier": self.source_tier,
            "tiers": {
                t.tier: {
                    "messages": t.messages,
                    "lines": t.lines,
                    "completeness": t.completeness,
                    "lost_lines": t.lost_lines,
                    "duplicated_lines": t.duplicated_lines,
                    "reached_999_s": t.reached_999_s,
                    "reached_100_s": t.reached_100_s,
                }
                for t in self.tiers
            },
        }


def row_from_json(doc: dict[str, Any]) -> WindowRow:
    """A row as ``GET /v1/audit/windows`` answered it."""
    tiers = doc.get("tiers", {})
    source = str(doc.get("source_tier", ""))
    return WindowRow(
        topic=str(doc["topic"]),
        window_start=int(doc["window_start"]),
        source_tier=source,
        source_messages=int(tiers.get(source, {}).get("messages", 0)),
        source_lines=int(tiers.get(source, {}).get("lines", 0)),
        closed=bool(doc.get("closed", False)),
        complete=bool(doc["complete"]),
        tiers=[
            TierRow(
                tier=name,
                messages=int(t["messages"]),
                lines=int(t["lines"]),
                completeness=float(t.get("completeness", 0.0)),
                lost_lines=int(t.get("lost_lines", 0)),
                duplicated_lines=int(t.get("duplicated_lines", 0)),
                reached_999_s=t.get("reached_999_s"),
                reached_100_s=t.get("reached_100_s"),
            )
            for name, t in tiers.items()
        ],
    )


_SOURCE_TIERS = ("push-client", "gateway")


def _order(label: str) -> tuple[int, str]:
    tier = label.partition("@")[0]
    base = tier.split(":", 1)[0]  # push:<subscription>
    return (TIERS.index(base) if base in TIERS else len(TIERS), label)


def _reached(series: TierSeries, target: int, window: int) -> float | None:
    """Seconds from the window's start to the first record putting the tier at ``target``."""
    if target <= 0:
        return 0.0
    latest: dict[str, int] = {}
    for record in sorted(series.records, key=lambda r: r.published_ms):
        latest[record.instance] = record.lines
        if sum(latest.values()) >= target:
            return max(0.0, record.published_ms / 1000 - window)
    return None


def reconcile(
    ledger: AuditLedger,
    *,
    topic_glob: str = "*",
    since: int = 0,
    now: float | None = None,
) -> list[WindowRow]:
    """Every window of topics matching ``topic_glob`` that starts at or after ``since``."""
    now = time.time() if now is None else now
    first_window: dict[tuple[str, str], int] = {}
    for (topic, window), tiers in ledger.series.items():
        for label in tiers:
            key = (topic, label)
            first_window[key] = min(first_window.get(key, window), window)
    rows = []
    for (topic, window), tiers in sorted(ledger.series.items()):
        if window + WINDOW_S <= since or not fnmatch.fnmatchcase(topic, topic_glob):
            continue
        labels = sorted(
            {label for (t, label), first in first_window.items() if t == topic and first <= window},
            key=_order,
        )
        source = next(
            (label for label in labels if label in _SOURCE_TIERS and label in tiers), None
        )
        if source is None:
            continue  # only tiers of other DCs counted it: its source's DC is not readable here
        # A source tier before the window's source counted none of its lines: a push-client
        # that fed the topic earlier (stopped since, or its topic deleted and made again) did
        # not lose the lines other clients wrote later.  It is not expected in this window.
        labels = [label for label in labels if label in tiers or _order(label) > _order(source)]
        source_series = tiers[source]
        source_lines = source_series.lines
        row = WindowRow(
            topic=topic,
            window_start=window,
            source_tier=source,
            source_messages=source_series.messages,
            source_lines=source_lines,
            closed=window + WINDOW_S <= now,
            complete=True,
        )
        for label in labels:
            series = tiers.get(label, TierSeries())
            lines = series.lines
            row.tiers.append(
                TierRow(
                    tier=label,
                    messages=series.messages,
                    lines=lines,
                    completeness=1.0 if source_lines == 0 else round(lines / source_lines, 6),
                    lost_lines=max(0, source_lines - lines),
                    duplicated_lines=max(0, lines - source_lines),
                    reached_999_s=_reached(series, math.ceil(source_lines * 0.999), window),
                    reached_100_s=_reached(series, source_lines, window),
                )
            )
            if lines != source_lines:
                row.complete = False
        rows.append(row)
    return rows
