"""The end-to-end audit on real processes: a push-client, two gateways (dc1, dc2) and a mirror.

Each tier publishes its counts every second; ``logbroker audit --windows`` reads both DCs'
stores and reconciles them.  The mirror is SIGKILLed mid-window: the audit shows it behind
(lines lost so far) while the push-client and gateway are complete, and complete again once a
new mirror has caught up.  The invariant audit then passes on the mirror's destination.  (The
loader's tier, and a line deleted from its table, are in tests/yt_loader/test_loader_audit.py,
where the Spark session is shared.)
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.ledger import AuditLedger
from audit.reconcile import reconcile
from log_store import open_store
from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import wait_until
from tests.push_client.conftest import FAST_FLAGS, PushProcess

TOPIC = "dc1.app"


@pytest.fixture(autouse=True)
def fast_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")


@pytest.fixture
def mirrors() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def start_mirror(src: str, dst: str, log: Path, started: list[Any]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        logbroker_cmd("mirror", "--from", src, "--to", dst, "--prefix", "dc1."),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),  # noqa: SIM115 - kept open for the child's lifetime
    )
    started.append(proc)
    return proc


def audit_windows(db: Path, *data_dirs: Path) -> tuple[int, dict[str, int], str]:
    """Run ``logbroker audit --windows``; the exit code, lines per tier (all windows of TOPIC)
    and its output."""
    dirs = [arg for d in data_dirs for arg in ("--data-dir", str(d))]
    done = subprocess.run(
        logbroker_cmd("audit", "--windows", *dirs, "--topic", TOPIC, "--db", str(db)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    with sqlite3.connect(db) as conn:
        lines = dict(
            conn.execute(
                "SELECT tier, SUM(lines) FROM tiers WHERE topic = ? GROUP BY tier", (TOPIC,)
            ).fetchall()
        )
    return done.returncode, lines, done.stdout


def tier_lines(*data_dirs: Path) -> dict[str, int]:
    """Lines per tier over all windows of TOPIC, reconciled in this process (what the command
    prints, without starting it at every poll)."""
    ledger = AuditLedger()
    for data_dir in data_dirs:
        with contextlib.closing(open_store(data_dir, read_only=True)) as store:
            ledger.refresh(store)
    totals: dict[str, int] = {}
    for row in reconcile(ledger, topic_glob=TOPIC):
        for tier in row.tiers:
            totals[tier.tier] = totals.get(tier.tier, 0) + tier.lines
    return totals


def append_lines(path: Path, start: int, count: int) -> None:
    with path.open("ab") as f:
        f.write(
            b"".join(b"line %06d of the audited log\n" % n for n in range(start, start + count))
        )


@pytest.mark.slow
@pytest.mark.fault
def test_audit_shows_a_killed_mirror_behind_and_complete_after_its_restart(
    start_gateway: Any, tmp_path: Path, mirrors: list[subprocess.Popen[bytes]]
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    log_file = tmp_path / "app.log"
    append_lines(log_file, 0, 300)
    state = tmp_path / "push-state"
    push = PushProcess(
        [
            "--server",
            dc1.url,
            "--log-type",
            "app",
            "--state-dir",
            str(state),
            *FAST_FLAGS,
            str(log_file),
        ],
        tmp_path / "push.log",
    ).start()
    db = tmp_path / "audit.db"
    try:
        first = start_mirror(dc1.url, dc2.url, tmp_path / "mirror-1.log", mirrors)
        want = {"push-client": 300, "gateway": 300, "mirror@dc2": 300}
        wait_until(
            lambda: tier_lines(dc1.data_dir, dc2.data_dir) == want,
            60,
            "every tier to count 300 lines",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        append_lines(log_file, 300, 200)
        lagging = {"push-client": 500, "gateway": 500, "mirror@dc2": 300}
        wait_until(
            lambda: tier_lines(dc1.data_dir, dc2.data_dir) == lagging,
            60,
            "the audit to show the mirror behind",
        )
        code, _, shown = audit_windows(db, dc1.data_dir, dc2.data_dir)
        assert code == 0, shown  # behind, but the window is open (or within its grace)
        with sqlite3.connect(db) as conn:
            lost = conn.execute(
                "SELECT SUM(lost_lines) FROM tiers WHERE topic = ? AND tier = 'mirror@dc2'",
                (TOPIC,),
            ).fetchone()[0]
            incomplete = conn.execute(
                "SELECT COUNT(*) FROM windows WHERE topic = ? AND complete = 0", (TOPIC,)
            ).fetchone()[0]
        assert lost == 200 and incomplete >= 1
        assert "mirror@dc2" in shown

        start_mirror(dc1.url, dc2.url, tmp_path / "mirror-2.log", mirrors)
        done = {"push-client": 500, "gateway": 500, "mirror@dc2": 500}
        wait_until(
            lambda: tier_lines(dc1.data_dir, dc2.data_dir) == done,
            60,
            "the restarted mirror to catch up",
        )

        # the gateway of the destination answers the same reconciliation (its own DC's tiers
        # and the mirrored records of dc1): complete again
        def windows_at_dc2() -> list[dict[str, Any]]:
            answer = httpx.get(f"{dc2.url}/v1/audit/windows", params={"topic": "dc1.*"})
            return list(answer.json()["windows"])

        wait_until(
            lambda: all(w["complete"] for w in windows_at_dc2()), 30, "dc2 to see it complete"
        )
        windows = windows_at_dc2()
        assert windows and all(w["topic"] == TOPIC for w in windows)
        assert sum(w["tiers"]["mirror@dc2"]["lines"] for w in windows) == 500
        assert sum(w["tiers"]["push-client"]["lines"] for w in windows) == 500
        assert all(set(w) >= {"topic", "window_start", "tiers", "complete"} for w in windows)

        # the invariant audit works on the mirror's destination (no seqno table there)
        checked = subprocess.run(
            logbroker_cmd("audit", "--data-dir", str(dc2.data_dir)),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "(mirrored copy)" in checked.stdout
    finally:
        push.kill()
        print(push.log(), json.dumps([m.returncode for m in mirrors]))
