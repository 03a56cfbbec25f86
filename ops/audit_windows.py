"""``logbroker audit --windows``: the tiers reconciled per window, kept in an SQLite database.

The database is built with sqlite-utils, so users query it with the ``sqlite-utils`` CLI (or
Datasette): table ``windows`` has one row per (topic, window_start) and table ``tiers`` one
row per (topic, window_start, tier); both are upserted on every run, so the database always
holds each window's latest reconciliation.

With ``--metrics-file`` the run also leaves its verdict as Prometheus text for
node_exporter's textfile collector (:func:`write_metrics_file`): the alert
``LogbrokerAuditIncomplete`` reads ``logbroker_audit_window_incomplete`` from it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlite_utils

from audit.reconcile import TierRow, WindowRow
from audit.windows import WINDOW_S
from log_store.errors import BadRequest

DEFAULT_GRACE_S = 600
"""How long after its end a window may still be incomplete before the audit fails."""


def check_db(db_path: Path) -> None:
    """Refuse, before any work, a database the results could not be saved in: in a missing
    or unwritable directory, or a file that is not an SQLite database.  Raises BadRequest."""
    parent = db_path.parent
    if db_path.is_dir():
        raise BadRequest(f"--db {db_path} is a directory")
    if not parent.is_dir():
        raise BadRequest(f"--db {db_path}: no directory {parent}")
    if not db_path.exists():
        if not os.access(parent, os.W_OK | os.X_OK):
            raise BadRequest(f"--db {db_path}: cannot create a file in {parent}")
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=rw", uri=True)) as db:
            db.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as exc:
        raise BadRequest(f"--db {db_path}: {exc} (give another file)") from None


def save_rows(db_path: Path, rows: Sequence[WindowRow], now: float | None = None) -> None:
    """Upsert the reconciled windows and their tiers into the database at ``db_path``."""
    now = time.time() if now is None else now
    db = sqlite_utils.Database(db_path)
    windows = db.table("windows")
    windows.create(_WINDOW_COLUMNS, pk=("topic", "window_start"), if_not_exists=True)
    db.table("tiers").create(
        _TIER_COLUMNS, pk=("topic", "window_start", "tier"), if_not_exists=True
    )
    windows.upsert_all(
        [
            {
                "topic": r.topic,
                "window_start": r.window_start,
                "window_end": r.window_start + WINDOW_S,
                "source_tier": r.source_tier,
                "source_messages": r.source_messages,
                "source_lines": r.source_lines,
                "closed": int(r.closed),
                "complete": int(r.complete),
                "reconciled_at": int(now),
            }
            for r in rows
        ],
        pk=("topic", "window_start"),
        alter=True,
    )
    tiers = db.table("tiers")
    tiers.upsert_all(
        [_tier_row(r, t, now) for r in rows for t in r.tiers],
        pk=("topic", "window_start", "tier"),
        alter=True,
    )
    windows.create_index(["window_start"], if_not_exists=True)
    windows.create_index(["complete", "closed"], if_not_exists=True)
    tiers.create_index(["tier", "window_start"], if_not_exists=True)


_WINDOW_COLUMNS: dict[str, Any] = {
    "topic": str,
    "window_start": int,
    "window_end": int,
    "source_tier": str,
    "source_messages": int,
    "source_lines": int,
    "closed": int,
    "complete": int,
    "reconciled_at": int,
}
_TIER_COLUMNS: dict[str, Any] = {
    "topic": str,
    "window_start": int,
    "tier": str,
    "messages": int,
    "lines": int,
    "completeness": float,
    "lost_lines": int,
    "duplicated_lines": int,
    "reached_999_s": float,
    "reached_100_s": float,
    "reconciled_at": int,
}


def _tier_row(window: WindowRow, tier: TierRow, now: float) -> dict[str, Any]:
    return {
        "topic": window.topic,
        "window_start": window.window_start,
        "tier": tier.tier,
        "messages": tier.messages,
        "lines": tier.lines,
        "completeness": tier.completeness,
        "lost_lines": tier.lost_lines,
        "duplicated_lines": tier.duplicated_lines,
        "reached_999_s": tier.reached_999_s,
        "reached_100_s": tier.reached_100_s,
        "reconciled_at": int(now),
    }


def overdue(rows: Sequence[WindowRow], grace_s: float, now: float | None = None) -> list[WindowRow]:
    """Closed windows still incomplete ``grace_s`` after their end."""
    now = time.time() if now is None else now
    return [r for r in rows if not r.complete and r.window_start + WINDOW_S + grace_s <= now]


def metrics_text(rows: Sequence[WindowRow], late: Sequence[WindowRow], now: float) -> str:
    """Prometheus text: per topic reconciled, its closed windows incomplete past the grace
    (0 for a topic whose windows are fine), and when this run happened."""
    incomplete = dict.fromkeys(sorted({r.topic for r in rows}), 0)
    for row in late:
        incomplete[row.topic] += 1
    lines = [
        "# HELP logbroker_audit_window_incomplete closed audit windows of the topic still "
        "incomplete past the grace",
        "# TYPE logbroker_audit_window_incomplete gauge",
        *(
            f'logbroker_audit_window_incomplete{{topic="{topic}"}} {count}'
            for topic, count in incomplete.items()
        ),
        "# HELP logbroker_audit_last_run_timestamp_seconds when logbroker audit --windows ran",
        "# TYPE logbroker_audit_last_run_timestamp_seconds gauge",
        f"logbroker_audit_last_run_timestamp_seconds {now:.3f}",
    ]
    return "\n".join(lines) + "\n"


def write_metrics_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once: a collector reading it sees the old or the new."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def format_table(rows: Sequence[WindowRow]) -> str:
    """One line per (window, tier), as ``logbroker audit --windows`` prints it."""
    head = (
        f"{'topic':<28} {'window (UTC)':<16} {'tier':<18} {'messages':>9} {'lines':>10} "
        f"{'complete':>8} {'lost':>8} {'dup':>8} {'99.9%s':>7} {'100%s':>7}"
    )
    out = [head]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.window_start))
        for t in r.tiers:
            out.append(
                f"{r.topic:<28} {when:<16} {t.tier:<18} {t.messages:>9} {t.lines:>10} "
                f"{t.completeness:>8.2%} {t.lost_lines:>8} {t.duplicated_lines:>8} "
                f"{_seconds(t.reached_999_s):>7} {_seconds(t.reached_100_s):>7}"
            )
    return "\n".join(out)


def other_clients_notes(rows: Sequence[WindowRow]) -> list[str]:
    """One line per window of a push-client's topic that no push-client counted: the gateway
    is its source, and its lines were written by other clients (``curl``, the legacy API),
    not lost by the push-clients that fed the topic in other windows."""
    fed = {r.topic for r in rows if r.source_tier == "push-client"}
    return [
        f"{r.topic} window {r.window_start}: no push-client counted it; its "
        f"{r.source_lines} line(s) were written by other clients (the gateway is its source)"
        for r in rows
        if r.topic in fed and r.source_tier == "gateway"
    ]
