"""The push-client's audit counts follow its data across gateways: real gateways over one data
dir, one of them SIGKILLed or never there, and ``logbroker audit --windows`` over the store.

Also the client's logs of what it cannot reach: the last publish at exit, lag reports refused
or failing, and which gateway it sends to while answers of the old one still come in.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from push_client.lag_report import LagReporter
from push_client.token import BearerToken
from push_client.transport import GatewayClient, TransportStats
from tests.audit.test_end_to_end_audit import TOPIC, audit_windows, tier_lines
from tests.conftest import free_port
from tests.delivery.conftest import wait_until
from tests.push_client.conftest import (
    BackgroundWriter,
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)
from tests.scripted_http import serving


@pytest.fixture
def fast_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")


def _duplicated_lines(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        value = conn.execute(
            "SELECT COALESCE(SUM(duplicated_lines), 0) FROM tiers WHERE topic = ?", (TOPIC,)
        ).fetchone()[0]
    return int(value)


@pytest.mark.slow
@pytest.mark.fault
def test_push_client_counts_move_with_the_data_when_the_first_gateway_is_killed(
    tmp_path: Path, start_gateway: Any, start_push: Any, fast_audit: None
) -> None:
    data = tmp_path / "data"
    first = start_gateway(data)
    second = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("k")
    writer.append(path, 1_000)
    push = start_push(f"{first.url},{second.url}", tmp_path / "state", path)
    wait_until(
        lambda: tier_lines(data) == {"push-client": 1_000, "gateway": 1_000},
        60,
        "both tiers to count the first 1000 lines",
    )
    with BackgroundWriter(path, writer, lines_per_tick=200):
        time.sleep(1.0)
        first.kill()
        time.sleep(2.0)
    total = len(writer.ids)
    wait_for_lines(data, "app", total, timeout_s=60)
    wait_until(
        lambda: tier_lines(data).get("push-client") == total,
        30,
        f"the push-client tier to reach {total} lines through the second gateway",
    )
    assert push.stop() == 0
    assert_exactly_once(read_delivered(data, "app"), writer)
    log = push.log()
    assert "counts failed" not in log and "counts are not published" not in log, log

    # The killed gateway lost what it counted since its last publication (the audit shows
    # those lines as lost at the gateway tier), but nothing shows as duplicated.
    tiers = tier_lines(data)
    assert tiers["push-client"] == total
    assert tiers["gateway"] <= total
    db = tmp_path / "audit.db"
    _, lines, shown = audit_windows(db, data)
    assert lines["push-client"] == total, shown
    assert _duplicated_lines(db) == 0, shown


@pytest.mark.slow
def test_push_client_counts_reach_the_audit_when_the_first_gateway_never_answers(
    tmp_path: Path, start_gateway: Any, start_push: Any, fast_audit: None
) -> None:
    data = tmp_path / "data"
    gateway = start_gateway(data)
    dead = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "app.log"
    writer = LineWriter("d")
    writer.append(path, 2_000)
    push = start_push(f"{dead},{gateway.url}", tmp_path / "state", path)
    wait_for_lines(data, "app", 2_000)
    writer.append(path, 500)
    wait_for_lines(data, "app", 2_500)
    wait_until(
        lambda: tier_lines(data) == {"push-client": 2_500, "gateway": 2_500},
        30,
        "both tiers to count 2500 lines",
    )
    assert push.stop() == 0
    log = push.log()
    assert "counts failed" not in log and "counts are not published" not in log, log
    db = tmp_path / "audit.db"
    code, lines, shown = audit_windows(db, data)
    assert code == 0, shown
    assert lines == {"push-client": 2_500, "gateway": 2_500}, shown
    assert _duplicated_lines(db) == 0, shown


@pytest.mark.slow
@pytest.mark.fault
def test_a_last_publish_that_no_gateway_takes_is_said_in_one_line(
    tmp_path: Path, start_gateway: Any, start_push: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no publication during the run: every count is owed to the last publish at exit
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "600")
    data = tmp_path / "data"
    first = start_gateway(data)
    second = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("x")
    writer.append(path, 300)
    push = start_push(f"{first.url},{second.url}", tmp_path / "state", path)
    wait_for_lines(data, "app", 300)
    time.sleep(0.5)  # the acknowledgements reach the client
    first.kill()
    second.kill()
    assert push.stop() == 0
    log = push.log()
    said = [line for line in log.splitlines() if "push-client counts are not published" in line]
    assert len(said) == 1, log
    assert first.url in said[0] and second.url in said[0], said  # both were tried
    # saved with the positions, they are late, not lost: it said "missing from the audit"
    state = tmp_path / "state"
    assert f"kept in the state dir {state}, and the next start with it publishes" in said[0]
    assert "missing" not in said[0], said
    third = start_gateway(data)
    again = start_push(third.url, state, path)
    time.sleep(1)  # its sessions open: the log holds every line already
    assert again.stop() == 0  # whose last publish (the interval is 600 s) carries them
    assert tier_lines(data).get("push-client") == 300, again.log()
    assert "retried later" not in log and "Traceback" not in log, log


# -- logs of the lag report and of the gateway preference: scripted HTTP endpoints -----------


_ROW = {"path": "/var/log/a.log", "log_type": "app", "size": 10, "acked": 5, "phase": "tail"}


def test_lag_reports_log_an_outage_once_and_each_lasting_refusal_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    statuses = iter([503, 503, 503, 200, 403, 403, 404, 404, 403])
    seen: list[int] = []

    def answer(_path: str) -> tuple[int, float]:
        status = next(statuses, 200)
        seen.append(status)
        return status, 0.0

    caplog.set_level(logging.DEBUG, logger="logbroker.push")
    with serving(answer) as server:
        reporter = LagReporter("test-client", BearerToken(None, None), interval_s=0.02)
        try:
            deadline = time.monotonic() + 10
            while len(seen) < 10 and time.monotonic() < deadline:
                reporter.offer(server.url, [_ROW])
                time.sleep(0.01)
        finally:
            reporter.close()
    assert len(seen) >= 10
    messages = [
        (r.levelno, r.getMessage()) for r in caplog.records if "lag report" in r.getMessage()
    ]
    above_debug = [m for level, m in messages if level > logging.DEBUG]
    failed = [m for m in above_debug if "failed" in m]
    assert len(failed) == 1 and "HTTP 503" in failed[0], messages
    assert not any("dashboard" in m and "503" in m for m in above_debug), messages
    refused = [m for m in above_debug if "refuses" in m]
    assert len(refused) == 2, messages  # 403 once, 404 once, however often each came
    assert "HTTP 403: scripted refusal" in refused[0] and "HTTP 404" in refused[1], messages


def test_a_late_answer_from_the_gateway_left_behind_does_not_move_the_client_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request in flight at the first gateway when another request found it failing (and
    moved to the second) is answered 200 afterwards: the client keeps sending to the second."""

    def first_answer(path: str) -> tuple[int, float]:
        return (200, 0.6) if path == "/slow" else (503, 0.0)

    caplog.set_level(logging.INFO, logger="logbroker.push")
    with serving(first_answer) as first, serving(lambda _p: (200, 0.0)) as second:
        client = GatewayClient(
            (first.url, second.url),
            token=BearerToken(None, None),
            stop=threading.Event(),
            stats=TransportStats(),
        )
        try:
            slow = threading.Thread(target=client.post, args=("/slow", b"{}", "application/json"))
            slow.start()
            wait_until(lambda: "/slow" in first.paths, 5, "the slow request to reach the first")
            client.post("/failing", b"{}", "application/json")
            assert client.current_server == second.url
            slow.join(10)
            assert not slow.is_alive()
            assert client.current_server == second.url
            client.post("/next", b"{}", "application/json")
            assert second.paths[-1] == "/next"
        finally:
            client.close()
    moves = [r.getMessage() for r in caplog.records if "now sending to" in r.getMessage()]
    assert moves == [f"now sending to {second.url}"]
