"""``logbroker audit --windows`` on audit records written into a real store: the reconciled
rows, the sqlite-utils database, exit 1 for a closed window incomplete past its grace, and
exit 2 with a message for bad usage."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from audit.publisher import AuditPublisher
from audit.sinks import StoreAuditSink
from audit.windows import WINDOW_S, WindowCounts
from log_store import open_store
from session_dedup.exactly_once import ExactlyOnceWriter
from tests.conftest import REPO, logbroker_cmd
from tests.metrics_text import sample

OLD_WINDOW = 1_700_000_400  # long closed
TOPIC = "dc1.web"


def publish(data_dir: Path, tier: str, instance: str, lines: int, dc: str = "dc1") -> None:
    """A tier instance's counts of TOPIC in OLD_WINDOW, published through the write path."""
    counts = WindowCounts()
    counts.add(TOPIC, OLD_WINDOW * 1000 + 5, lines // 10, lines)
    with open_store(data_dir) as store:
        writer = ExactlyOnceWriter(store, dc=dc, partitions=2)
        AuditPublisher(tier, instance, counts, StoreAuditSink(writer)).publish()


def publish_windows(data_dir: Path, tier: str, instance: str, lines: dict[int, int]) -> None:
    """A tier instance's counts of TOPIC in several windows (window start -> lines)."""
    counts = WindowCounts()
    for window, n in lines.items():
        counts.add(TOPIC, window * 1000 + 5, max(1, n // 10), n)
    with open_store(data_dir) as store:
        writer = ExactlyOnceWriter(store, dc="dc1", partitions=2)
        AuditPublisher(tier, instance, counts, StoreAuditSink(writer)).publish()


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("audit", "--windows", *args),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_a_closed_window_a_tier_lacks_lines_of_fails_the_audit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = tmp_path / "audit.db"
    publish(data, "push-client", "host-a", 1000)
    publish(data, "gateway", "gw-1", 600)
    publish(data, "gateway", "gw-2", 390)  # two gateway processes: their totals add up
    done = audit("--data-dir", str(data), "--db", str(db))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"INCOMPLETE: {TOPIC} window {OLD_WINDOW}: gateway lost 10" in done.stdout
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT tier, lines, lost_lines, completeness FROM tiers ORDER BY tier"
        ).fetchall()
        window = conn.execute("SELECT complete, closed, source_lines FROM windows").fetchone()
    assert rows == [("gateway", 990, 10, 0.99), ("push-client", 1000, 0, 1.0)]
    assert window == (0, 1, 1000)


def test_a_later_total_replaces_an_earlier_one_and_completes_the_window(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = tmp_path / "audit.db"
    publish(data, "push-client", "host-a", 1000)
    publish(data, "gateway", "gw-1", 400)
    publish(data, "gateway", "gw-1", 1000)  # the same instance's later cumulative total
    done = audit("--data-dir", str(data), "--db", str(db), "--topic", "dc1.*")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of 1 window(s) complete" in done.stdout
    again = audit("--data-dir", str(data), "--db", str(db))  # upserted, not added
    assert again.returncode == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tiers").fetchone()[0] == 2
        assert conn.execute("SELECT complete FROM windows").fetchone()[0] == 1


def test_a_window_within_its_grace_does_not_fail(tmp_path: Path) -> None:
    data = tmp_path / "data"
    publish(data, "push-client", "host-a", 100)
    publish(data, "gateway", "gw-1", 50)
    grace = str(10**10)
    done = audit("--data-dir", str(data), "--db", str(tmp_path / "a.db"), "--grace", grace)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 of 1 window(s) complete" in done.stdout


def test_the_verdict_is_left_for_the_alert_as_a_metrics_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    prom = tmp_path / "textfile" / "logbroker-audit.prom"
    prom.parent.mkdir()
    publish(data, "push-client", "host-a", 1000)
    publish(data, "gateway", "gw-1", 990)
    args = ["--data-dir", str(data), "--db", str(tmp_path / "a.db"), "--metrics-file", str(prom)]
    done = audit(*args)
    assert done.returncode == 1, done.stdout + done.stderr
    text = prom.read_text()
    assert sample(text, "logbroker_audit_window_incomplete", topic=TOPIC) == 1.0
    assert sample(text, "logbroker_audit_last_run_timestamp_seconds") is not None
    publish(data, "gateway", "gw-1", 1000)  # the gateway's later total completes the window
    done = audit(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sample(prom.read_text(), "logbroker_audit_window_incomplete", topic=TOPIC) == 0.0
    assert [p.name for p in prom.parent.iterdir()] == [prom.name]  # no staged file left


def test_bad_usage_exits_2_with_a_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    publish(data, "push-client", "host-a", 100)
    cases = [
        ([], "--windows needs --server URL, --data-dir DIR or --store kafka"),
        (["--data-dir", str(data), "--since", "-5"], "must not be negative"),
        (["--data-dir", str(data), "--grace", "nan"], "--grace: must be a finite"),  # never late
        (["--data-dir", str(data), "--server", "http://127.0.0.1:9"], "not both"),
        (["--data-dir", str(data), "--db", str(tmp_path)], "is a directory"),
        (["--data-dir", str(tmp_path / "typo")], "no data directory"),
        (["--data-dir", str(data), "--topic", "a", "--topic", "b"], "one --topic glob"),
        (["--data-dir", str(data), "--metrics-file", str(tmp_path / "no" / "a.prom")], "no dir"),
    ]
    for args, message in cases:
        done = audit(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr
        assert "Traceback" not in done.stderr
    assert WINDOW_S == 600


def test_finding_no_window_is_not_a_complete_audit(tmp_path: Path) -> None:
    """A misspelt glob or data dir must not keep a cron job or the alert green for ever."""
    data = tmp_path / "data"
    with open_store(data) as store:
        ExactlyOnceWriter(store, dc="dc1", partitions=1)  # a store, no audit records yet
    db = str(tmp_path / "a.db")
    empty = audit("--data-dir", str(data), "--db", db)
    assert empty.returncode == 2, empty.stdout + empty.stderr
    assert empty.stderr == (
        f"logbroker audit: no audit records in {data}: no tier has published counts there yet "
        "(tiers publish every 10 s what they counted)\n"
    )
    publish(data, "push-client", "host-a", 100)
    typo = audit("--data-dir", str(data), "--db", db, "--topic", "dc9.*")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert typo.stderr == (
        f"logbroker audit: no audited topic in {data} matches 'dc9.*' (audited: {TOPIC})\n"
    )
    late = audit("--data-dir", str(data), "--db", db, "--since", str(OLD_WINDOW + 3600))
    assert late.returncode == 2, late.stdout + late.stderr
    assert f"since {OLD_WINDOW + 3600} (the last starts at {OLD_WINDOW})" in late.stderr
    assert audit("--data-dir", str(data), "--db", db).returncode == 0


def test_lines_other_clients_write_after_the_push_clients_stopped_are_not_their_loss(
    tmp_path: Path,
) -> None:
    """A push-client fed the topic in one window and stopped; other clients (curl, the legacy
    API) wrote into it in a later window.  The push-client lost none of those lines: the
    gateway is that window's source, and the window is complete."""
    data = tmp_path / "data"
    db = tmp_path / "audit.db"
    later = OLD_WINDOW + WINDOW_S
    publish_windows(data, "push-client", "host-a", {OLD_WINDOW: 30_000})
    publish_windows(data, "gateway", "gw-1", {OLD_WINDOW: 30_000, later: 10})
    publish_windows(data, "loader", "table-1", {OLD_WINDOW: 30_000, later: 10})
    done = audit("--data-dir", str(data), "--db", str(db), "--grace", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "INCOMPLETE" not in done.stdout
    assert "2 of 2 window(s) complete" in done.stdout
    assert (
        f"{TOPIC} window {later}: no push-client counted it; its 10 line(s) were written by "
        "other clients (the gateway is its source)"
    ) in done.stdout
    with sqlite3.connect(db) as conn:
        tiers = conn.execute(
            "SELECT tier, lines, lost_lines FROM tiers WHERE window_start = ? ORDER BY tier",
            (later,),
        ).fetchall()
        window = conn.execute(
            "SELECT source_tier, source_lines, complete FROM windows WHERE window_start = ?",
            (later,),
        ).fetchone()
    assert tiers == [("gateway", 10, 0), ("loader", 10, 0)]
    assert window == ("gateway", 10, 1)


def test_a_push_client_topic_still_shows_loss_and_duplication_in_every_window(
    tmp_path: Path,
) -> None:
    """Beside the window other clients wrote alone: the gateway lacking lines the push-client
    counted is lost, the gateway counting more is duplicated, a gateway that stopped
    publishing while the push-client counted is lost, and a tier after the gateway that
    stopped is lost in a window only other clients wrote."""
    data = tmp_path / "data"
    w = [OLD_WINDOW + i * WINDOW_S for i in range(5)]
    publish_windows(data, "push-client", "host-a", {w[0]: 1000, w[1]: 1000, w[2]: 100, w[3]: 50})
    publish_windows(data, "gateway", "gw-1", {w[0]: 1000, w[1]: 990, w[2]: 130, w[4]: 20})
    publish_windows(data, "loader", "table-1", {w[0]: 1000, w[1]: 990, w[2]: 130})
    done = audit("--data-dir", str(data), "--db", str(tmp_path / "a.db"), "--grace", "0")
    assert done.returncode == 1, done.stdout + done.stderr
    incomplete = sorted(line for line in done.stdout.splitlines() if "INCOMPLETE" in line)
    assert incomplete == [
        f"INCOMPLETE: {TOPIC} window {w[1]}: gateway lost 10 dup 0, loader lost 10 dup 0",
        f"INCOMPLETE: {TOPIC} window {w[2]}: gateway lost 0 dup 30, loader lost 0 dup 30",
        f"INCOMPLETE: {TOPIC} window {w[3]}: gateway lost 50 dup 0, loader lost 50 dup 0",
        f"INCOMPLETE: {TOPIC} window {w[4]}: loader lost 20 dup 0",
    ]
    assert "1 of 5 window(s) complete" in done.stdout
