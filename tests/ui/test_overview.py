"""``GET /v1/ui/overview`` and the lag reports behind it, against real gateway processes: a real
mirror reports its lag to its destination; bad reports are refused and change nothing; rates
come from a sliding window of samples."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.internal_state import InternalState
from ingest_api import client_status
from ingest_api.client_status import ClientReports
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.overview import RateWindow, TopicTotals
from log_store import open_store
from push_client.lag_report import report_rows
from tests.conftest import REPO, GatewayProcess, kill_process_group, logbroker_cmd
from tests.gateway.conftest import meta

WAIT_S = 30.0


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the tests of reports (each uses its own client names)."""
    base: Path = tmp_path_factory.mktemp("reports")
    gateway = GatewayProcess(base / "data", [], base / "gw.log").start()
    try:
        yield gateway
    finally:
        gateway.kill()


def overview(gateway: GatewayProcess) -> dict[str, Any]:
    answer = httpx.get(gateway.url + "/v1/ui/overview", timeout=30)
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


def wait_for(what: str, check: Callable[[], Any], interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting until {what}")


def write_chunks(gateway: GatewayProcess, sources: int, chunks: int) -> None:
    """``chunks`` chunks of 1 KiB from each of ``sources`` sources (spread over partitions)."""
    sections = [
        (meta(f"src-{s}"), [(seqno, 0, b"x" * 1023 + b"\n") for seqno in range(1, chunks + 1)])
        for s in range(sources)
    ]
    answer = httpx.post(
        gateway.url + "/v1/write",
        content=encode_binary(sections),
        headers={"content-type": BINARY_MEDIA_TYPE},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text


def test_a_mirror_reports_its_lag_per_partition_to_the_destination(start_gateway: Any) -> None:
    source = start_gateway(None)
    dest = start_gateway(source.data_dir.parent / "dest", "--dc", "dc2")
    write_chunks(source, sources=4, chunks=20)
    ends = {
        (p["partition"]): p["end_offset"]
        for p in httpx.get(source.url + "/v1/topics/dc1.app", timeout=30).json()["partitions"]
    }
    with open(source.data_dir.parent / "mirror.log", "ab") as out:
        # a small fetch size: the first report, made after the first round, is behind
        mirror = subprocess.Popen(
            logbroker_cmd(
                "mirror",
                "--from",
                source.url,
                "--to",
                dest.url,
                "--prefix",
                "dc1.",
                "--max-bytes",
                "2048",
                "--idle-exit",
                "1",
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    try:
        behind = wait_for(
            "the mirror reported a lag",
            lambda: [m for m in overview(dest)["mirrors"] if m["lag"] > 0],
        )
        assert behind[0]["partitions"][0]["topic"] == "dc1.app"
        assert mirror.wait(WAIT_S) == 0
    finally:
        kill_process_group(mirror)
    # the mirror reports where it stopped: everything copied
    (report,) = overview(dest)["mirrors"]
    assert report["lag"] == 0 and not report["stale"]
    # dc1.app's partitions: the gateway's own audit topic (dc1.logbroker-audit) is copied too
    # once its first count has been published, which may come within the test or not
    app = [p for p in report["partitions"] if p["topic"] == "dc1.app"]
    assert {p["partition"]: p["position"] for p in app} == ends
    assert {p["partition"]: p["source_end_offset"] for p in app} == ends
    (topic,) = [t for t in overview(dest)["topics"] if t["name"] == "dc1.app"]
    assert topic["end_offsets"] == sum(ends.values())


@pytest.mark.parametrize(
    "body",
    [
        {"files": []},
        {"client": "", "files": []},
        {"client": "c", "files": "all"},
        {"client": "c", "files": [{"path": "/a", "log_type": "app", "size": -1}]},
        {"client": "c", "files": [{"path": "/a", "log_type": "app", "size": 1, "acked": 0}]},
        {"client": "c", "files": [{"path": "/a", "size": 1, "acked": 0, "lag_bytes": 1}]},
        {"client": "c", "files": [7]},
    ],
)
def test_a_bad_push_client_report_is_refused_and_changes_nothing(
    shared: GatewayProcess, body: dict[str, Any]
) -> None:
    answer = httpx.post(shared.url + "/v1/clients/status", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert set(answer.json()) == {"error", "reason"}
    assert [c for c in overview(shared)["push_clients"] if c["client"] in ("", "c")] == []


def test_a_push_client_report_replaces_the_clients_last_one(shared: GatewayProcess) -> None:
    def report(lag: int) -> None:
        row = {"path": "/var/log/a", "log_type": "app", "size": 10, "acked": 10 - lag}
        body = {"client": "host-a", "host": "a", "files": [{**row, "lag_bytes": lag}]}
        answer = httpx.post(shared.url + "/v1/clients/status", json=body, timeout=30)
        assert answer.status_code == 200, answer.text

    report(7)
    report(0)
    (client,) = [c for c in overview(shared)["push_clients"] if c["client"] == "host-a"]
    assert client["client"] == "host-a" and client["lag_bytes"] == 0
    assert client["files"][0]["topic"] == "dc1.app"


def test_rates_are_growth_over_the_sliding_window() -> None:
    now = [100.0]
    window = RateWindow(window_s=10.0, clock=lambda: now[0])
    first = window.add({"t": TopicTotals(0, 0, 0)})
    assert first == {"t": None}  # nothing to compare with yet
    for step in range(1, 31):
        now[0] = 100.0 + step
        rates = window.add({"t": TopicTotals(step * 5, step * 500, step * 2)})
    rate = rates["t"]
    assert rate is not None  # 30 s of 5 messages/s: the window's base is 10 s back
    assert (rate.messages, rate.bytes, rate.read_messages) == (5.0, 500.0, 2.0)
    now[0] += 1
    dropped = window.add({"t": TopicTotals(0, 0, 0)})["t"]  # the topic was created again
    assert dropped is not None and (dropped.messages, dropped.bytes) == (0.0, 0.0)


def test_a_report_keeps_only_files_of_log_types_the_token_writes(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[tokens.shipper-secret]\nname = "shipper"\nwrite = ["app"]\nread = ["dc1.other"]\n'
    )
    gateway = GatewayProcess(tmp_path / "data", ["--config", str(config)], tmp_path / "gw.log")
    auth = {"Authorization": "Bearer shipper-secret"}

    def row(path: str, log_type: str) -> dict[str, Any]:
        return {"path": path, "log_type": log_type, "size": 9, "acked": 4, "lag_bytes": 5}

    def report(*files: dict[str, Any]) -> httpx.Response:
        body = {"client": "web1", "files": list(files)}
        return httpx.post(gateway.url + "/v1/clients/status", json=body, headers=auth, timeout=30)

    try:
        gateway.start()
        mixed = report(row("/var/log/app.log", "app"), row("/var/log/db.log", "db"))
        assert mixed.status_code == 200, mixed.text
        assert mixed.json() == {"recorded": 1, "skipped": ["/var/log/db.log"]}
        only_forbidden = report(row("/var/log/db.log", "db"))
        assert only_forbidden.status_code == 403, only_forbidden.text
        seen = httpx.get(gateway.url + "/v1/ui/overview", headers=auth, timeout=30)
        assert seen.status_code == 200, seen.text
        # the token's own report, although it may not read dc1.app
        (client,) = seen.json()["push_clients"]
        assert [f["path"] for f in client["files"]] == ["/var/log/app.log"]
    finally:
        gateway.kill()


def test_another_tenant_reporting_under_a_clients_name_does_not_replace_its_report(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[tokens.a-secret]\nname = "tenant-a"\nwrite = ["app"]\nread = ["dc1.app"]\n'
        '[tokens.b-secret]\nname = "tenant-b"\nwrite = ["other"]\nread = ["dc1.other"]\n'
        '[tokens.admin-secret]\nname = "ops"\nadmin = true\n'
    )
    gateway = GatewayProcess(tmp_path / "data", ["--config", str(config)], tmp_path / "gw.log")

    def report(token: str, host: str, path: str, log_type: str) -> None:
        row = {"path": path, "log_type": log_type, "size": 90, "acked": 10, "lag_bytes": 80}
        answer = httpx.post(
            gateway.url + "/v1/clients/status",
            json={"client": "web1 push", "host": host, "files": [row]},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text

    def seen_by(token: str) -> list[tuple[str, list[str]]]:
        answer = httpx.get(
            gateway.url + "/v1/ui/overview",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        clients = answer.json()["push_clients"]
        return sorted((c["host"], [f["path"] for f in c["files"]]) for c in clients)

    try:
        gateway.start()
        report("a-secret", "web1", "/var/log/app.log", "app")
        report("b-secret", "intruder", "/tmp/x.log", "other")  # A's client name, B's token
        assert seen_by("a-secret") == [("web1", ["/var/log/app.log"])]
        assert seen_by("admin-secret") == [
            ("intruder", ["/tmp/x.log"]),
            ("web1", ["/var/log/app.log"]),
        ]
        report("a-secret", "web1", "/var/log/app2.log", "app")  # A's next report replaces A's
        assert seen_by("a-secret") == [("web1", ["/var/log/app2.log"])]
    finally:
        gateway.kill()


def test_a_forgotten_client_report_is_deleted_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_status, "MAX_CLIENTS", 3)
    now = [1_000_000.0]
    row = {"path": "/var/log/a", "log_type": "app", "size": 2, "acked": 1, "lag_bytes": 1}
    with open_store(tmp_path / "data") as store:
        state = InternalState(store)
        reports = ClientReports(state, clock=lambda: now[0])

        def stored() -> set[str]:
            names = (f"c{i}" for i in range(10))
            return {n for n in names if state.get(client_status._client_key("push", "t", n))}

        for i in range(5):  # five names, three kept: the two oldest are deleted
            reports.record("push", f"c{i}", "h", "t", [row])
            now[0] += 1
        assert {r.client for r in reports.reports("push")} == {"c2", "c3", "c4"}
        assert stored() == {"c2", "c3", "c4"}
        now[0] += client_status.FORGET_AFTER_S + 1  # silent past the limit: forgotten
        reports.record("push", "c5", "h", "t", [row])
        assert stored() == {"c5"}


def test_a_push_client_report_puts_the_files_most_behind_first() -> None:
    def status_row(path: str, size: int, acked: int, pending_since: float | None) -> dict[str, Any]:
        return {
            "path": path,
            "log_type": "app",
            "size": size,
            "acked": acked,
            "pending_since": pending_since,
            "phase": "active",
        }

    rows = report_rows(
        [status_row("/a", 100, 100, None), status_row("/b", 900, 100, 90.0)], now=100.0
    )
    assert [(r["path"], r["lag_bytes"], r["lag_s"]) for r in rows] == [
        ("/b", 800, 10.0),
        ("/a", 0, 0.0),
    ]
