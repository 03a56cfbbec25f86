"""Push delivery's audit counts (tier ``push:<subscription>``) survive a SIGKILL of the gateway
between two publications: they are journaled beside the gateway's own (audit.journal), and the
next gateway started on the data dir publishes them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.delivery.conftest import PUSH_TO_LOOPBACK, wait_until
from tests.delivery.test_push_delivery import _subscribe


def _tier_lines(url: str, tier: str) -> int:
    doc = httpx.get(url + "/v1/audit/windows", params={"topic": "dc1.app"}, timeout=30).json()
    return sum(w["tiers"].get(tier, {}).get("lines", 0) for w in doc["windows"])


def _delivered(url: str) -> int:
    """Messages the subscription committed as delivered (the count follows each commit)."""
    doc = httpx.get(url + "/v1/subscriptions/audited", timeout=30).json()
    return int(doc["delivered_messages"])


@pytest.mark.fault
def test_push_counts_of_a_gateway_killed_between_publications_are_published_by_the_next(
    start_gateway: Any,
    writer_for: Any,
    push_endpoint: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "3600")
    endpoint = push_endpoint(lambda n: ("ok", 200))
    data = tmp_path / "data"
    gw = start_gateway(data, *PUSH_TO_LOOPBACK)
    writer_for(gw.url).write("src0", list(range(1, 41)))
    _subscribe(gw.url, "audited", endpoint.url, batch_size=10)
    wait_until(lambda: _delivered(gw.url) == 40, 15, "the 40 messages delivered")
    time.sleep(1)  # counted as soon as each commit returns; a second is ample
    gw.kill()
    gw.proc.wait(10)
    after = start_gateway(data, *PUSH_TO_LOOPBACK)
    wait_until(
        lambda: (
            (_tier_lines(after.url, "gateway"), _tier_lines(after.url, "push:audited")) == (40, 40)
        ),
        60,
        "the gateway and push tiers to count the 40 lines the killed gateway handled",
    )
