"""What the gateway's audit counts hold when clients choose create times: a bounded number of
windows, and windows older than the bound forgotten once published."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from audit.publisher import AuditPublisher
from audit.windows import MAX_AHEAD_S, WINDOW_S, WindowCounts, window_start
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from tests.delivery.conftest import wait_until
from tests.gateway.conftest import meta

NOW_S = 1_800_000_000.0
DAY_S = 24 * 3600


class _Sink:
    """Keeps what a publisher wrote (the store's sink, without a store)."""

    def __init__(self) -> None:
        self.records = 0

    def write(self, source_id: str, seqno: int, data: bytes) -> tuple[bool, int]:
        self.records += data.count(b"\n")
        return True, seqno


def test_a_create_time_beyond_the_bounds_is_counted_at_the_bound() -> None:
    counts = WindowCounts(max_age_s=7 * DAY_S, clock=lambda: NOW_S)
    for i in range(1000):  # a thousand windows of the distant past, one far in the future
        counts.add("dc1.app", i * WINDOW_S * 1000, 1, 2)
    counts.add("dc1.app", int((NOW_S + 30 * DAY_S) * 1000), 1, 2)
    counts.add("dc1.app", int(NOW_S * 1000), 1, 2)
    oldest = window_start(int((NOW_S - 7 * DAY_S) * 1000))
    newest = window_start(int((NOW_S + MAX_AHEAD_S) * 1000))
    assert counts.snapshot() == {
        ("dc1.app", oldest): (1000, 2000),
        ("dc1.app", newest): (1, 2),
        ("dc1.app", window_start(int(NOW_S * 1000))): (1, 2),
    }
    unbounded = WindowCounts()  # other tiers count the create times in the log as they are
    unbounded.add("dc1.app", 0, 1, 1)
    assert unbounded.snapshot() == {("dc1.app", 0): (1, 1)}


def test_windows_older_than_the_bound_are_forgotten_once_published() -> None:
    counts = WindowCounts()
    now_ms = int(time.time() * 1000)
    counts.add("dc1.app", now_ms - 30 * DAY_S * 1000, 5, 10)
    counts.add("dc1.app", now_ms, 1, 1)
    sink = _Sink()
    publisher = AuditPublisher("gateway", "gw-1", counts, sink, forget_after_s=8 * DAY_S)
    assert publisher.publish() == 2 and sink.records == 2  # both published first
    assert list(counts.snapshot()) == [("dc1.app", window_start(now_ms))]
    assert publisher.publish() == 0  # nothing changed: nothing written again


def test_a_client_naming_a_window_per_chunk_adds_one_window_to_the_audit(
    start_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "0.5")
    gw = start_gateway()
    chunks = [(i + 1, i * WINDOW_S * 1000, b"x\n") for i in range(3000)]  # 3000 old windows
    answer = httpx.post(
        gw.url + "/v1/write",
        content=encode_binary([(meta("s"), chunks)]),
        headers={"Content-Type": BINARY_MEDIA_TYPE},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text

    def gateway_windows() -> list[Any]:
        doc = httpx.get(gw.url + "/v1/audit/windows", params={"topic": "dc1.app"}, timeout=30)
        return [w for w in doc.json()["windows"] if "gateway" in w["tiers"]]

    def counted() -> bool:
        return sum(w["tiers"]["gateway"]["lines"] for w in gateway_windows()) == 3000

    wait_until(counted, 30, "the gateway's counts of the 3000 lines")
    assert len(gateway_windows()) == 1
