"""``/store`` against ``limits.max_staged_bytes``: a body over the limit by itself is refused
for good (400: a 429 would have an old client retry it for ever), a refusal states what is
really staged, and concurrent uploads cannot together pass the limit (checked on the staging
itself, with writes slowed down: through a gateway the race is too quick to reproduce)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.legacy_txn import LegacyStaging
from log_store.errors import LimitReached
from tests.conftest import GatewayProcess

LIMIT = 1000


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayProcess]:
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_STAGED_BYTES", str(LIMIT))
    gw = GatewayProcess(tmp_path / "data", [], tmp_path / "gateway.log").start()
    yield gw
    gw.stop()


def _store(url: str, size: int) -> httpx.Response:
    return httpx.post(
        f"{url}/store", params={"log_type": "app", "file": "/a"}, content=b"x" * size, timeout=30
    )


def test_a_body_over_the_limit_by_itself_is_refused_for_good_and_says_so(
    gateway: GatewayProcess,
) -> None:
    answer = _store(gateway.url, LIMIT + 1)
    assert answer.status_code == 400, answer.text
    assert "Retry-After" not in answer.headers
    assert answer.json()["reason"] == (
        f"this upload of {LIMIT + 1} bytes is over max_staged_bytes ({LIMIT}) by itself: it can "
        "never be staged; send it in smaller pieces"
    )


def test_a_refusal_states_the_bytes_really_staged(gateway: GatewayProcess) -> None:
    assert _store(gateway.url, 400).status_code == 200
    answer = _store(gateway.url, 700)
    assert answer.status_code == 429, answer.text
    doc = answer.json()
    assert (doc["error"], doc["limit"], doc["max"]) == ("limit_reached", "max_staged_bytes", LIMIT)
    staged = int(re.match(r"(\d+) bytes are staged", doc["reason"]).group(1))  # type: ignore[union-attr]
    assert 400 <= staged < 700, doc["reason"]  # the piece and its few bytes of metadata
    assert (
        "with this upload of 700 bytes they would be over max_staged_bytes (1000)"
        in (doc["reason"])
    )


class _SlowDisk(LegacyStaging):
    """Staging whose writes take a while, as an fsync on a busy disk does: the window in
    which concurrent uploads were all checked against the same count."""

    def _write(self, store_id: str, meta: dict[str, Any], data: bytes) -> None:
        time.sleep(0.2)
        super()._write(store_id, meta, data)


def test_concurrent_uploads_do_not_pass_the_limit_together(tmp_path: Path) -> None:
    staging = _SlowDisk(tmp_path / "staging", max_bytes=LIMIT)

    def upload(_: int) -> str:
        try:
            return staging.put(log_type="app", server="old1", file="/a", data=b"x" * 100)
        except LimitReached:
            return "refused"

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(upload, range(32)))
    admitted = [a for a in answers if a != "refused"]
    assert 1 <= len(admitted) <= LIMIT // 100, answers
    assert staging.staged_bytes() <= LIMIT + len(admitted) * 100  # metadata on disk too
