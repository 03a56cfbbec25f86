"""A legacy piece is written once, under one txn_id, however its ``/commit_request``s race or
crash: the first binds it, every other txn_id is refused and writes nothing."""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.legacy_txn import LegacyStaging
from log_store import open_store
from tests.conftest import GatewayProcess
from tests.delivery.test_legacy_api import Archive


def _raw_records(url: str) -> list[dict[str, Any]]:
    """Every record of dc1.app as stored: data records and markers alike."""
    records = []
    for p in range(4):
        response = httpx.get(
            f"{url}/v1/topics/dc1.app/partitions/{p}/messages", params={"offset": 0, "raw": 1}
        )
        if response.status_code == 404:
            continue
        assert response.status_code == 200, response.text
        records.extend(response.json()["messages"])
    return records


def _data_records(url: str) -> collections.Counter[str]:
    return collections.Counter(m["data"] for m in _raw_records(url) if m["kind"] == "legacy_data")


def _concurrently(url: str, params: list[dict[str, str]]) -> list[httpx.Response]:
    with (
        httpx.Client(base_url=url, timeout=60) as http,
        ThreadPoolExecutor(len(params)) as pool,
    ):
        return list(pool.map(lambda p: http.post("/commit_request", params=p), params))


def test_concurrent_requests_of_one_piece_write_it_once_whatever_their_txn_ids(
    start_gateway: Any,
) -> None:
    """20 requests of one piece under 20 txn_ids at once, over two worker processes: one
    txn_id wins, the others are 409 ``store_id_written``, none is a 500, and the log holds
    the piece once.  10 at once under one txn_id are answered alike and write it once too."""
    gw = start_gateway(None, "--workers", "2")
    archive = Archive(gw.url)
    store_id = archive.store(b"raced\n")
    answers = _concurrently(gw.url, [{"store_id": store_id, "txn_id": f"r{i}"} for i in range(20)])
    codes = collections.Counter(a.status_code for a in answers)
    winners = [a.json()["txn_id"] for a in answers if a.status_code == 200]
    assert codes[200] >= 1 and codes[200] + codes[409] == 20, codes
    assert len(set(winners)) == 1, winners
    refused = [a.json() for a in answers if a.status_code == 409]
    assert {r["error"] for r in refused} <= {"store_id_written"}
    # the refusal names the id the piece is bound to: a lost answer can be repeated under it
    assert all(repr(winners[0]) in r["reason"] for r in refused)
    # every /commit, as the old client sends them, releases the piece once at most
    for i in range(20):
        archive.http.post("/commit", params={"txn_id": f"r{i}", "log_type": "app"})
    # the same txn_id from many clients at once (a retry storm): one record
    again = archive.store(b"retried\n")
    answers = _concurrently(gw.url, [{"store_id": again, "txn_id": "same"}] * 10)
    assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
    assert len({a.text for a in answers}) == 1
    archive.commit("same")
    assert _data_records(gw.url) == {"raced\n": 1, "retried\n": 1}
    assert "Traceback" not in gw.log()


@pytest.mark.fault
@pytest.mark.parametrize(
    ("variable", "point"),
    [
        ("LOGBROKER_LEGACY_CRASH_AT", "after-claim"),
        ("LOGBROKER_STORE_CRASH_AT", "after-segment-write"),
        ("LOGBROKER_LEGACY_CRASH_AT", "after-data-write"),
    ],
)
def test_a_request_killed_at_any_step_is_completed_only_under_its_own_txn_id(
    variable: str, point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of the gateway once the piece is bound to txn A, while its data is going to
    the log, and once the data is durable but the piece not marked written: after the
    restart a request under txn B is refused and writes nothing, the repeat under A is
    answered and the piece is in the log once."""
    data_dir = tmp_path / "data"
    open_store(data_dir).close()  # the store is there first, as under a gateway
    # staged as /store does (the gateway's staging directory), so that the armed gateway's
    # first append is the piece's data record
    store_id = LegacyStaging(data_dir / "legacy-staging").put(
        log_type="app", server="old1", file="/a", data=b"piece\n"
    )
    monkeypatch.setenv(variable, point)
    armed = GatewayProcess(data_dir, [], tmp_path / "armed.log").start()
    monkeypatch.delenv(variable)
    try:
        with pytest.raises(httpx.TransportError):
            httpx.post(
                f"{armed.url}/commit_request",
                params={"store_id": store_id, "txn_id": "A"},
                timeout=60,
            )
        assert armed.proc is not None and armed.proc.wait(60) == -9
    finally:
        armed.kill()
    second = GatewayProcess(data_dir, [], tmp_path / "second.log").start()
    try:
        archive = Archive(second.url)
        for _ in range(2):
            other = archive.http.post(
                "/commit_request", params={"store_id": store_id, "txn_id": "B"}
            )
            assert other.status_code == 409, other.text
            assert other.json()["error"] == "store_id_written"
            assert "'A'" in other.json()["reason"]
        own = archive.http.post("/commit_request", params={"store_id": store_id, "txn_id": "A"})
        assert own.status_code == 200, own.text
        again = archive.http.post("/commit_request", params={"store_id": store_id, "txn_id": "A"})
        assert again.json() == own.json()
        archive.commit("A")
        refused = archive.http.post("/commit", params={"txn_id": "B", "log_type": "app"})
        assert refused.status_code == 404, refused.text
        assert _data_records(second.url)["piece\n"] == 1
        markers = [m for m in _raw_records(second.url) if m["kind"] == "legacy_commit"]
        assert len(markers) == 1
    finally:
        second.kill()


def test_a_piece_bound_to_a_txn_id_holding_other_data_can_go_under_another(
    gateway: Any,
) -> None:
    """A request under a txn_id that holds another piece binds this one first and unbinds it
    on the refusal; a gateway killed in between leaves the binding, which the next request
    under another id finds dead (that txn_id can never write this piece) and drops."""
    archive = Archive(gateway.url)
    first, second = archive.store(b"first\n"), archive.store(b"second\n")
    taken = archive.http.post("/commit_request", params={"store_id": first, "txn_id": "T1"})
    assert taken.status_code == 200, taken.text
    taken = archive.http.post("/commit_request", params={"store_id": second, "txn_id": "T1"})
    assert taken.status_code == 409 and taken.json()["error"] == "txn_id_taken", taken.text
    # as if killed between the binding and its release
    LegacyStaging(gateway.data_dir / "legacy-staging").claim(second, "T1")
    moved = archive.http.post("/commit_request", params={"store_id": second, "txn_id": "T2"})
    assert moved.status_code == 200, moved.text
    archive.commit("T1")
    archive.commit("T2")
    assert _data_records(gateway.url) == {"first\n": 1, "second\n": 1}
