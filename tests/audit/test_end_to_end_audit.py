"""The end-to-end audit on real processes: a push-client, two gateways (dc1, dc2), a mirror and
the loader (Parquet table, local Spark).

Each tier publishes its counts every second; ``logbroker audit --windows`` reads both DCs'
stores and reconciles them.  The mirror is SIGKILLed mid-window: the audit shows it behind
(lines lost so far) while the push-client and gateway are complete, and complete again once a
new mirror has caught up.  The loader's counts come from its table, so a line deleted from the
table by hand shows as lost.  The invariant audit then passes on the mirror's destination.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

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


def load(server: str, warehouse: Path, *extra: str) -> None:
    done = subprocess.run(
        logbroker_cmd(
            "load",
            "--server",
            server,
            "--warehouse",
            str(warehouse),
            "--topics",
            TOPIC,
            "--table-format",
            "parquet",
            "--master",
            "local[1]",
            *extra,
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def delete_one_row(warehouse: Path) -> None:
    """Rewrite one of the table's Parquet files without its first row (an operator's edit)."""
    path = next(p for p in sorted(warehouse.rglob("*.parquet")) if "_loader" not in p.parts)
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)


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
            lambda: audit_windows(db, dc1.data_dir, dc2.data_dir)[1] == want,
            60,
            f"every tier to count 300 lines: {audit_windows(db, dc1.data_dir, dc2.data_dir)}",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        append_lines(log_file, 300, 200)
        lagging = {"push-client": 500, "gateway": 500, "mirror@dc2": 300}
        wait_until(
            lambda: audit_windows(db, dc1.data_dir, dc2.data_dir)[1] == lagging,
            60,
            f"the audit to show the mirror behind: {audit_windows(db, dc1.data_dir, dc2.data_dir)}",
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
            lambda: audit_windows(db, dc1.data_dir, dc2.data_dir)[1] == done,
            60,
            f"the restarted mirror to catch up: {audit_windows(db, dc1.data_dir, dc2.data_dir)}",
        )
        with sqlite3.connect(db) as conn:
            assert (
                conn.execute(
                    "SELECT COUNT(*) FROM windows WHERE topic = ? AND complete = 0", (TOPIC,)
                ).fetchone()[0]
                == 0
            )

        # the gateway of the destination answers the same reconciliation (its own DC's tiers
        # and the mirrored records of dc1)
        answer = httpx.get(f"{dc2.url}/v1/audit/windows", params={"topic": "dc1.*"}).json()
        windows = answer["windows"]
        assert windows and all(w["topic"] == TOPIC for w in windows)
        assert sum(w["tiers"]["mirror@dc2"]["lines"] for w in windows) == 500
        assert all(set(w) >= {"topic", "window_start", "tiers", "complete"} for w in windows)

        # the loader fills a table from dc2; its counts are the table's own
        warehouse = tmp_path / "warehouse"
        load(dc2.url, warehouse)
        loaded = {**done, "loader@dc2": 500}
        wait_until(
            lambda: audit_windows(db, dc1.data_dir, dc2.data_dir)[1] == loaded,
            30,
            f"the loader's counts: {audit_windows(db, dc1.data_dir, dc2.data_dir)}",
        )
        # a line deleted by hand from the table is reported lost at the loader
        delete_one_row(warehouse)
        load(dc2.url, warehouse, "--audit-only")
        wait_until(
            lambda: (
                audit_windows(db, dc1.data_dir, dc2.data_dir)[1] == {**loaded, "loader@dc2": 499}
            ),
            30,
            f"the deleted line to show: {audit_windows(db, dc1.data_dir, dc2.data_dir)}",
        )
        _, _, shown = audit_windows(db, dc1.data_dir, dc2.data_dir)
        with sqlite3.connect(db) as conn:
            assert (
                conn.execute(
                    "SELECT SUM(lost_lines) FROM tiers WHERE topic = ? AND tier = 'loader@dc2'",
                    (TOPIC,),
                ).fetchone()[0]
                == 1
            )

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
