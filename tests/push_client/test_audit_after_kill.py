"""The push-client's audit counts survive a SIGKILL: a restarted client goes on with the totals
of the same instance, so the source tier of the audit equals the gateway's, and nothing shows
as duplicated that was written once.  Also the counts' journal on its own: a crash between
the save of the totals and the start of a new journal, a torn last line, a lost state file.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from audit.ledger import AuditLedger
from log_store import open_store
from push_client.audit_publishing import JOURNAL_NAME, PushAuditCounts
from tests.audit.test_end_to_end_audit import TOPIC, audit_windows, tier_lines
from tests.delivery.conftest import wait_until
from tests.push_client.conftest import (
    BackgroundWriter,
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)


def _instances(data: Path) -> set[str]:
    ledger = AuditLedger()
    with contextlib.closing(open_store(data, read_only=True)) as store:
        ledger.refresh(store)
    return {
        instance
        for (topic, _), tiers in ledger.series.items()
        if topic == TOPIC
        for label, series in tiers.items()
        if label == "push-client"
        for instance in series.latest
    }


@pytest.mark.fault
def test_a_push_client_killed_mid_stream_and_restarted_counts_every_line_once(
    tmp_path: Path, start_gateway: Any, start_push: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")
    data = tmp_path / "data"
    gateway = start_gateway(data)
    # The client publishes seldom: the kill comes well after its last publication, with
    # lines acknowledged since (the old client lost their counts: gateway > push-client).
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "4")
    path = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("k")
    writer.append(path, 500)
    push = start_push(gateway.url, state, path).wait_started(state)
    with BackgroundWriter(path, writer, lines_per_tick=20):
        wait_until(lambda: "push-client" in tier_lines(data), 30, "a first publication")
        time.sleep(2.0)
        push.kill()
        published = tier_lines(data).get("push-client", 0)
        shipped = read_delivered(data, "app").count()
        assert shipped > published  # what the killed client acknowledged since it published
        push = start_push(gateway.url, state, path).wait_started(state)
        time.sleep(1.0)
    total = len(writer.ids)
    wait_for_lines(data, "app", total, timeout_s=60)
    assert_exactly_once(read_delivered(data, "app"), writer)
    wait_until(
        lambda: tier_lines(data) == {"push-client": total, "gateway": total},
        30,
        f"both tiers at {total} lines",
    )
    assert push.stop() == 0
    assert _instances(data) == {_instance_of(state)}  # the restart went on as the same one
    db = tmp_path / "audit.db"
    code, lines, shown = audit_windows(db, data)
    assert lines == {"push-client": total, "gateway": total}, shown
    assert code == 0, shown


@pytest.mark.fault
def test_a_request_in_flight_at_the_kill_is_counted_by_the_restart_that_finds_it_written(
    tmp_path: Path, start_gateway: Any, start_push: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")
    data = tmp_path / "data"
    gateway = start_gateway(data)
    path = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("f")
    writer.append(path, 300)
    push = start_push(gateway.url, state, path).wait_started(state)
    wait_until(lambda: tier_lines(data) == {"push-client": 300, "gateway": 300}, 30, "300 counted")
    gateway.proc.send_signal(signal.SIGSTOP)  # takes the request, answers nothing
    try:
        writer.append(path, 200)
        time.sleep(1.5)
        push.kill()  # its request is in flight: no answer, no ack, nothing counted for it
    finally:
        gateway.proc.send_signal(signal.SIGCONT)
    # the gateway writes (and counts) the request of the client that is gone
    assert wait_for_lines(data, "app", 500, timeout_s=30).count() == 500
    push = start_push(gateway.url, state, path).wait_started(state)
    wait_until(
        lambda: tier_lines(data) == {"push-client": 500, "gateway": 500},
        30,
        "both tiers at 500 lines",
    )
    assert push.stop() == 0
    assert_exactly_once(read_delivered(data, "app"), writer)


def _instance_of(state: Path) -> str:
    body = (state / "state.json").read_bytes().split(b"\n", 1)[0]
    return str(orjson.loads(body)["audit"]["instance"])


def _totals(counts: PushAuditCounts, name: str = "default") -> dict[tuple[str, int], Any]:
    return counts.of(name).snapshot()


def _ship(counts: PushAuditCounts, source: str, seqno: int, create_ms: int, lines: int) -> None:
    counts.sent("default", [(source, seqno, "dc1.app", create_ms, lines)])


T0 = 1_800_000_000_000
"""A create time (ms) at the start of a window."""
W0 = T0 // 1000


def test_the_counts_come_back_from_the_saved_totals_and_the_journal_after_them(
    tmp_path: Path,
) -> None:
    first = PushAuditCounts(tmp_path)
    first.restore(None)
    _ship(first, "a", 100, T0, 10)
    _ship(first, "a", 150, T0 + 1_000, 5)
    first.acked("default", [("a", 100), ("a", 150)])
    saved = first.to_state()
    first.saved(saved)
    _ship(first, "a", 200, T0 + 2_000, 7)
    first.acked("default", [("a", 200)])
    first.acked("default", [("a", 200)])  # answered twice (sent twice): one chunk
    _ship(first, "a", 260, T0 + 700_000, 1)  # in flight at the kill, not answered
    expected = _totals(first)
    assert expected == {("dc1.app", W0): (3, 22)}

    # killed here: the next client reads the totals saved and the journal written after them
    again = PushAuditCounts(tmp_path)
    again.restore(saved)
    assert _totals(again) == expected
    assert again.instance == first.instance and again.restored_from_journal == 3
    # its session learns that the log holds the source up to 260: the chunk in flight landed
    again.settle("default", "a", 260)
    expected[("dc1.app", W0 + 600)] = (1, 1)
    assert _totals(again) == expected and not again.sent_chunks

    # a crash after the totals of the next generation were saved, before a new journal: the
    # journal (of the generation before) holds nothing they lack, and is not added again
    later = again.to_state()
    assert later["generation"] == saved["generation"] + 1
    third = PushAuditCounts(tmp_path)
    third.restore(later)
    assert _totals(third) == expected
    _ship(third, "a", 300, T0 + 3_000, 3)
    third.acked("default", [("a", 300)])
    _ship(third, "a", 400, T0 + 4_000, 9)  # in flight at the kill, never written
    with open(tmp_path / JOURNAL_NAME, "ab") as f:
        f.write(b'{"i":"default","c":[["dc1.app",1799')  # torn by a crash of the machine
    fourth = PushAuditCounts(tmp_path)
    fourth.restore(later)
    assert _totals(fourth)[("dc1.app", W0)] == (4, 25)
    fourth.settle("default", "a", 300)  # the log ends below it: not counted, forgotten
    assert _totals(fourth)[("dc1.app", W0)] == (4, 25) and not fourth.sent_chunks
    for counts in (first, again, third, fourth):
        counts.close()


def test_a_state_dir_without_readable_counts_starts_a_new_instance(tmp_path: Path) -> None:
    first = PushAuditCounts(tmp_path)
    first.restore(None)
    _ship(first, "a", 100, T0, 10)
    first.acked("default", [("a", 100)])
    first.close()
    # a lost state file (or one of an earlier version): the journal of the old instance is not
    # taken, a new instance counts from zero and the old one's records stay in the audit
    for saved in (None, {"instance": 3}, {"instance": "x", "generation": 0, "counts": {"d": 1}}):
        fresh = PushAuditCounts(tmp_path)
        fresh.restore(saved)
        assert _totals(fresh) == {}
        assert fresh.instance and fresh.instance != "x"
        fresh.close()


def test_a_client_given_several_installations_counts_them_as_new_instances(
    tmp_path: Path,
) -> None:
    one = PushAuditCounts(tmp_path)
    one.restore(None)
    _ship(one, "a", 100, T0, 10)
    one.acked("default", [("a", 100)])
    saved = one.to_state()
    one.saved(saved)
    one.close()
    # its records stay in the audit under the one instance; the installations count anew
    several = PushAuditCounts(tmp_path, multi=True)
    several.restore(saved)
    assert several.label("dc1") == f"{one.instance}-dc1" and _totals(several, "dc1") == {}
    assert several.counts[one.instance].snapshot() == {("dc1.app", W0): (1, 10)}
    assert several.to_state()["counts"][one.instance] == [["dc1.app", W0, 1, 10]]
    several.close()


def test_a_source_id_with_a_path_that_is_not_utf8_is_journaled_and_read_back(
    tmp_path: Path,
) -> None:
    source = "host:/var/log/caf\udce9.log"  # an id of an earlier version, a Latin-1 name
    first = PushAuditCounts(tmp_path)
    first.restore(None)
    saved = first.to_state()
    first.saved(saved)
    _ship(first, source, 100, T0, 10)
    first.close()
    again = PushAuditCounts(tmp_path)
    again.restore(saved)
    again.settle("default", source, 100)
    assert _totals(again) == {("dc1.app", W0): (1, 10)}
    again.close()
