"""What one writer token's lag reports can make the gateway keep, and every dashboard refresh
answer, is bounded: a report's kept rows, an owner's reports in all, and the overview."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from delivery.internal_state import InternalState
from ingest_api import client_status
from ingest_api.client_status import ClientReports
from ingest_api.overview import MAX_ROWS_SHOWN, MAX_ROWS_SHOWN_PER_CLIENT
from log_store import open_store
from tests.conftest import GatewayProcess


def _huge_files(tag: str) -> list[dict[str, Any]]:
    """A report as large as a report may be: 500 files with 1,024-character paths."""
    return [
        {
            "path": f"/{tag}/{i:04d}/".ljust(1024, "p"),
            "log_type": "app",
            "size": 1000 + i,
            "acked": 0,
            "lag_bytes": 1000 + i,
            "lag_s": 1.0,
            "phase": "x" * 1024,
            "errno": None,
        }
        for i in range(client_status.MAX_ROWS)
    ]


def _stored_bytes(state: InternalState, owner: str, names: list[str]) -> int:
    total = 0
    for name in names:
        doc = state.get(client_status._client_key("push", owner, name))
        if doc is not None:
            total += len(orjson.dumps(doc))
    return total


def test_a_huge_report_is_cut_and_counted_and_its_phases_shortened(tmp_path: Path) -> None:
    rows = client_status.push_rows({"files": _huge_files("a")})
    assert {len(r["phase"]) for r in rows} == {client_status.MAX_PHASE}
    with open_store(tmp_path / "data") as store:
        state = InternalState(store)
        ClientReports(state).record("push", "web1", "web1", "t", rows)
        (report,) = ClientReports(state).reports("push")
        assert len(report.rows) > 0 and report.left_out == len(rows) - len(report.rows)
        assert [r["path"] for r in report.rows] == [r["path"] for r in rows[: len(report.rows)]]
        stored = _stored_bytes(state, "t", ["web1"])
        assert stored <= client_status.MAX_REPORT_BYTES + 4096, stored


def test_one_owner_keeps_at_most_its_byte_budget_and_others_keep_theirs(tmp_path: Path) -> None:
    now = [1_000_000.0]
    rows = client_status.push_rows({"files": _huge_files("b")})
    small = client_status.push_rows({"files": _huge_files("s")[:1]})
    with open_store(tmp_path / "data") as store:
        state = InternalState(store)
        reports = ClientReports(state, clock=lambda: now[0])
        reports.record("push", "db1", "db1", "other", small)
        names = [f"fake-{i}" for i in range(300)]
        for name in names:  # 300 reports of 32 KiB each: 9.6 MB, over the owner's budget
            reports.record("push", name, "h", "flooder", rows)
            now[0] += 1
        kept = _stored_bytes(state, "flooder", names)
        assert kept <= client_status.MAX_OWNER_BYTES + client_status.MAX_REPORT_BYTES, kept
        shown = {(r.owner, r.client) for r in reports.reports("push")}
        assert ("other", "db1") in shown
        assert ("flooder", names[-1]) in shown and ("flooder", names[0]) not in shown


def test_the_overview_stays_small_however_large_the_reports(shared_gateway: Any) -> None:
    gateway: GatewayProcess = shared_gateway
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        for i in range(60):
            body = {"client": f"bounds-{i}", "host": f"h{i}", "files": _huge_files(f"c{i}")}
            answer = http.post("/v1/clients/status", json=body)
            assert answer.status_code == 200, answer.text
        overview = http.get("/v1/ui/overview")
    assert overview.status_code == 200
    # 60 reports of 500 files of ~2 KiB each were posted (60 MB); the answer shows a few
    assert len(overview.content) < 2 * 1024 * 1024, len(overview.content)
    clients = [c for c in overview.json()["push_clients"] if c["client"].startswith("bounds-")]
    assert len(clients) == 60
    assert sum(len(c["files"]) for c in clients) <= MAX_ROWS_SHOWN
    for client in clients:
        assert len(client["files"]) <= MAX_ROWS_SHOWN_PER_CLIENT
        assert len(client["files"]) + client["files_left_out"] == client_status.MAX_ROWS
        lags = [f["lag_bytes"] for f in client["files"]]
        assert lags == sorted(lags, reverse=True)  # the most behind are the ones shown
