"""The gateway's audit journal: counts a killed gateway had not published come back.

The real-process tests SIGKILL a gateway between two publications (embedded store here, Kafka
in tests/kafka/test_gateway_audit_after_kill.py); the others take the journal apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import audit.journal
from audit.journal import CountJournal, journal_counts, read_journal, recover_journals
from audit.windows import WINDOW_S, Key, WindowCounts
from tests.delivery.conftest import Writer, wait_until

TOPIC = "dc1.app"


def _journaled(directory: Path, instance: str) -> tuple[WindowCounts, CountJournal]:
    counts = WindowCounts()
    journal = CountJournal(directory, instance)
    journal_counts(counts, journal)
    return counts, journal


def _recovered(directory: Path) -> dict[str, dict[Key, tuple[int, int]]]:
    """Each recovered journal's totals, by ``<tier> <instance>``."""
    found: dict[str, dict[Key, tuple[int, int]]] = {}
    recover_journals(
        directory, lambda tier, instance, totals: found.update({f"{tier} {instance}": totals})
    )
    return found


def test_a_journal_nobody_holds_gives_back_every_count_and_is_removed(tmp_path: Path) -> None:
    counts, journal = _journaled(tmp_path, "gw1-100-1")
    counts.add(TOPIC, 1_000, 1, 10)
    counts.add_many([(TOPIC, 2_000, 2, 5), ("dc1.web", WINDOW_S * 1000, 1, 1)])
    counts.add_chunk(TOPIC, 3_000, "zstd", b"not counted until a snapshot")  # deferred
    # held by its live process: left alone (flock is per open file, so also in this process)
    assert _recovered(tmp_path) == {}
    journal.close(remove=False)  # as a SIGKILL leaves it: the kernel drops the lock
    assert _recovered(tmp_path) == {
        "gateway gw1-100-1": {(TOPIC, 0): (3, 15), ("dc1.web", WINDOW_S): (1, 1)}
    }
    assert list(tmp_path.iterdir()) == []


def test_the_journal_holds_what_a_snapshot_counted_late_and_a_line_cut_short_is_skipped(
    tmp_path: Path,
) -> None:
    counts, journal = _journaled(tmp_path, "gw")
    counts.add_chunk(TOPIC, 0, "gzip", b"\x1f\x8b not gzip")  # counted (0 lines) at the snapshot
    counts.snapshot()
    counts.add(TOPIC, 0, 1, 7)
    journal.close(remove=False)
    with journal.path.open("ab") as f:
        f.write(b'["dc1.app", 0, 5')  # the kill cut the last write short
    assert read_journal(journal.path) == ("gateway", "gw", {(TOPIC, 0): (2, 7)})


def test_a_compacted_journal_holds_the_totals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit.journal, "COMPACT_BYTES", 200)
    counts, journal = _journaled(tmp_path, "gw")
    for i in range(100):
        counts.add(TOPIC, (i % 3) * WINDOW_S * 1000, 1, 2)
    grown = journal.path.stat().st_size
    totals = counts.snapshot()  # compacts
    assert journal.path.stat().st_size < grown / 10
    counts.add(TOPIC, 0, 1, 1)
    journal.close(remove=False)
    assert read_journal(journal.path) == (
        "gateway",
        "gw",
        {
            (TOPIC, 0): (35, 69),
            (TOPIC, WINDOW_S): totals[(TOPIC, WINDOW_S)],
            (TOPIC, 2 * WINDOW_S): totals[(TOPIC, 2 * WINDOW_S)],
        },
    )


def test_a_journal_whose_publication_fails_stays_for_the_next_start(tmp_path: Path) -> None:
    counts, journal = _journaled(tmp_path, "gw")
    counts.add(TOPIC, 0, 1, 1)
    journal.close(remove=False)

    def fail(tier: str, instance: str, totals: dict[Key, tuple[int, int]]) -> None:
        raise OSError("the log is away")

    assert recover_journals(tmp_path, fail) == 0
    assert journal.path.exists()
    assert _recovered(tmp_path) == {"gateway gw": {(TOPIC, 0): (1, 1)}}


def _gateway_lines(url: str) -> int:
    doc = httpx.get(url + "/v1/audit/windows", params={"topic": TOPIC}, timeout=30).json()
    return sum(w["tiers"].get("gateway", {}).get("lines", 0) for w in doc["windows"])


def write_then_kill_then_restart(gateway: Any, restart: Any, lines: int) -> None:
    """Write ``lines`` lines (one a chunk) to a gateway that publishes once an hour, SIGKILL
    it, and start the next one on its data dir: the audit's gateway tier counts them all."""
    writer = Writer(gateway.url)
    try:
        acks = writer.write("host1:/var/log/app.log", range(1, lines + 1))
    finally:
        writer.close()
    assert [a["status"] for a in acks] == ["written"] * lines
    gateway.kill()
    gateway.proc.wait(10)
    after = restart()
    wait_until(
        lambda: _gateway_lines(after.url) == lines,
        60,
        f"the gateway tier to count the {lines} lines the killed gateway wrote",
    )
    # the killed instance's journal is gone once published; the new instance's remains
    journals = gateway.data_dir / "audit-gateway"
    assert len(list(journals.iterdir())) == 1
    assert after.stop() == 0
    assert list(journals.iterdir()) == []  # a stop that published removes its journal


@pytest.mark.fault
def test_a_gateway_killed_between_publications_loses_no_count(
    start_gateway: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "3600")
    data = tmp_path / "data"
    write_then_kill_then_restart(start_gateway(data), lambda: start_gateway(data), 40)


def test_a_journal_that_missed_a_change_is_given_up_not_published_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts, journal = _journaled(tmp_path, "gw")
    counts.add(TOPIC, 0, 1, 1)

    def disk_full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(audit.journal.os, "write", disk_full)
        counts.add(TOPIC, 0, 1, 1)
    counts.add(TOPIC, 0, 1, 1)
    assert journal.failed and not journal.path.exists()
    assert counts.snapshot() == {(TOPIC, 0): (3, 3)}  # counted in memory all the same
    journal.close(remove=False)
    assert _recovered(tmp_path) == {}  # nothing that would publish 1 or 2 over the 3
