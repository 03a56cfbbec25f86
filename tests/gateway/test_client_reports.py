"""Clients' lag reports are bounded without one tenant pushing out another's."""

from __future__ import annotations

from pathlib import Path

import pytest

from delivery.internal_state import InternalState
from ingest_api import client_status
from ingest_api.client_status import ClientReports
from log_store import open_store
from log_store.errors import BadRequest

_ROW = {"path": "/var/log/a", "log_type": "app", "size": 2, "acked": 1, "lag_bytes": 1}


def test_a_token_flooding_client_names_pushes_out_only_its_own_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_status, "MAX_CLIENTS", 10)
    now = [1_000_000.0]
    with open_store(tmp_path / "data") as store:
        reports = ClientReports(InternalState(store), clock=lambda: now[0])

        def report(owner: str, name: str) -> None:
            reports.record("push", name, "h", owner, [_ROW])
            now[0] += 1

        for host in ("web1", "web2", "web3"):
            report("tenant-a", host)
        report("tenant-b", "db1")
        for i in range(50):  # one token, ever new names: far over the cap
            report("flooder", f"fake-{i}")
        shown = [(r.owner, r.client) for r in reports.reports("push")]
        assert len(shown) == 10
        assert {c for o, c in shown if o != "flooder"} == {"web1", "web2", "web3", "db1"}
        # what the flooder keeps is its newest names; the others' next reports still count
        assert {c for o, c in shown if o == "flooder"} == {f"fake-{i}" for i in range(44, 50)}
        report("tenant-b", "db2")
        shown = [(r.owner, r.client) for r in reports.reports("push")]
        assert ("tenant-b", "db2") in shown and ("tenant-b", "db1") in shown
        assert ("flooder", "fake-44") not in shown
        # a tenant that alone holds the most is cut back first, oldest report first
        for i in range(10):
            report("tenant-a", f"app{i}")
        owners = [o for o, _ in ((r.owner, r.client) for r in reports.reports("push"))]
        assert owners.count("tenant-b") == 2


def test_a_files_errno_is_kept_beside_its_phase_and_checked(tmp_path: Path) -> None:
    """The phase carries an unreadable file's message, which differs between hosts and
    languages; the errno beside it (``EACCES``) is what an operator can match on."""
    unreadable = {**_ROW, "phase": "unreadable: Permission denied", "errno": "EACCES"}
    rows = client_status.push_rows({"files": [unreadable, _ROW]})
    assert [r["errno"] for r in rows] == ["EACCES", None]  # none from an older client
    with open_store(tmp_path / "data") as store:
        reports = ClientReports(InternalState(store))
        reports.record("push", "web1", "web1", None, rows)
        (report,) = reports.reports("push")
        assert [r["errno"] for r in report.rows] == ["EACCES", None]
    assert client_status.push_rows({"files": [{**_ROW, "errno": ""}]})[0]["errno"] is None
    for bad in ("Permission denied", 13, "E" * 40, "eacces"):
        with pytest.raises(BadRequest, match=r"files\[0\]\.errno must be a symbolic errno"):
            client_status.push_rows({"files": [{**_ROW, "errno": bad}]})
