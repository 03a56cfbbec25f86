"""Legacy staging is held per token owner: one token's uploads never committed fill its own
share (``max_staged_bytes_per_token``, a quarter of ``max_staged_bytes`` by default) and
refuse only its own ``/store``s, saying so; ``max_staged_bytes`` stays a backstop for all;
``logbroker_legacy_staged_bytes{owner}`` shows who holds what; and a piece never requested is
dropped after ``staged_max_age_s`` (an hour by default, not a day)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.legacy_txn import LegacyStaging, OverStagingLimit, decode_staged
from ingest_api.settings import Limits
from log_store.errors import LimitReached
from tests.conftest import GatewayProcess

LIMIT = 1_000_000
SHARE = LIMIT // 4
TOKEN_A = "tenant-a-token-0123456789"
TOKEN_B = "tenant-b-token-0123456789"
TOKEN_OPS = "metrics-token-0123456789"
CONFIG = f"""
[tokens.{TOKEN_A}]
name = "tenant-a"
write = ["app"]

[tokens.{TOKEN_B}]
name = "tenant-b"
write = ["other"]

[tokens.{TOKEN_OPS}]
name = "ops"
metrics = true
"""


def _gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **limits: str
) -> Iterator[GatewayProcess]:
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_STAGED_BYTES", str(LIMIT))
    for name, value in limits.items():
        monkeypatch.setenv(f"LOGBROKER_LIMITS_{name.upper()}", value)
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    gw = GatewayProcess(tmp_path / "data", ["--config", str(config)], tmp_path / "gw.log").start()
    yield gw
    gw.stop()


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GatewayProcess]:
    yield from _gateway(tmp_path, monkeypatch)


def _store(url: str, token: str, log_type: str, size: int) -> httpx.Response:
    return httpx.post(
        f"{url}/store",
        params={"log_type": log_type},
        content=b"\0" * size,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_one_tokens_uncommitted_uploads_refuse_only_its_own_store(
    gateway: GatewayProcess,
) -> None:
    """Before: tenant B's four pieces of 250,000 bytes filled max_staged_bytes and tenant A's
    4-byte /store was 429 "1000000 bytes are staged ..." for as long as they were kept."""
    held = [_store(gateway.url, TOKEN_B, "other", 100_000) for _ in range(2)]
    assert [r.status_code for r in held] == [200, 200], [r.text for r in held]
    refused = _store(gateway.url, TOKEN_B, "other", 100_000)
    assert refused.status_code == 429, refused.text
    doc = refused.json()
    assert (doc["error"], doc["limit"], doc["max"]) == (
        "limit_reached",
        "max_staged_bytes_per_token",
        SHARE,
    )
    held_bytes = re.match(
        r"this token's uploads staged for /commit_request hold (\d+) bytes", doc["reason"]
    )
    assert held_bytes is not None, doc["reason"]
    mine = int(held_bytes.group(1))
    assert 200_000 <= mine < 201_000, doc["reason"]  # the pieces and their metadata
    assert doc["reason"].endswith(
        "with this upload of 100000 bytes they would be over max_staged_bytes_per_token "
        f"({SHARE}); commit them, or let them expire (1 h after they were stored)"
    )
    # the other tenant is not held up by them
    assert _store(gateway.url, TOKEN_A, "app", 4).status_code == 200
    assert _store(gateway.url, TOKEN_A, "app", 200_000).status_code == 200
    # a piece over the share by itself can never be staged: 400, not a 429 to retry
    over = _store(gateway.url, TOKEN_A, "app", SHARE + 1)
    assert over.status_code == 400, over.text
    assert "over max_staged_bytes_per_token (250000) by itself" in over.json()["reason"]
    # an operator sees whose pieces hold the staging
    scrape = httpx.get(
        f"{gateway.url}/metrics", headers={"Authorization": f"Bearer {TOKEN_OPS}"}, timeout=10
    )
    staged = {
        owner: float(value)
        for owner, value in re.findall(
            r'^logbroker_legacy_staged_bytes\{owner="([^"]*)"\} (\S+)$', scrape.text, re.M
        )
    }
    assert set(staged) == {"tenant-a", "tenant-b"}, scrape.text
    assert 200_000 <= staged["tenant-b"] < 201_000
    assert 200_004 <= staged["tenant-a"] < 201_000


def test_a_piece_never_requested_is_dropped_after_staged_max_age_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for gw in _gateway(tmp_path, monkeypatch, staged_max_age_s="1"):
        stored = _store(gw.url, TOKEN_A, "app", 10)
        store_id = stored.json()["store_id"]
        deadline = time.monotonic() + 10
        while (tmp_path / "data" / "legacy-staging" / store_id).exists():
            assert time.monotonic() < deadline, "the piece was never dropped"
            time.sleep(0.2)
        answer = httpx.post(
            f"{gw.url}/commit_request",
            params={"store_id": store_id},
            headers={"Authorization": f"Bearer {TOKEN_A}"},
            timeout=10,
        )
        assert (answer.status_code, answer.json()["error"]) == (404, "unknown_store_id")


def test_staging_is_kept_an_hour_by_default_and_a_token_gets_a_quarter() -> None:
    limits = Limits()
    assert limits.staged_max_age_s == 3600.0  # it was 24 h
    assert limits.staged_bytes_per_token == limits.max_staged_bytes // 4
    assert Limits(max_staged_bytes_per_token=5).staged_bytes_per_token == 5


def test_the_global_limit_is_a_backstop_and_says_how_much_is_this_tokens(tmp_path: Path) -> None:
    staging = LegacyStaging(tmp_path / "staging", max_bytes=1000, max_bytes_per_owner=600)
    staging.put(log_type="app", server="h", file="f", data=b"x" * 500, owner="tenant-b")
    staging.put(log_type="app", server="h", file="f", data=b"x" * 300, owner="tenant-a")
    with pytest.raises(LimitReached) as refused:
        staging.put(log_type="app", server="h", file="f", data=b"x" * 250, owner="tenant-a")
    assert refused.value.limit == "max_staged_bytes"
    reason = str(refused.value)
    staged = r"\d+ bytes are staged for /commit_request already \(3\d\d of them this token's\)"
    assert re.match(staged, reason), reason
    with pytest.raises(OverStagingLimit, match="over max_staged_bytes_per_token"):
        staging.put(log_type="app", server="h", file="f", data=b"x" * 601, owner="tenant-a")
    # without tokens (owner None) only the global limit holds, as it always did
    staging.put(log_type="app", server="h", file="f", data=b"x" * 150, owner=None)


def test_owners_are_counted_from_the_directory_across_processes_and_kept_when_bound(
    tmp_path: Path,
) -> None:
    """Each worker (and each gateway's peer endpoints) sees the owners of pieces it did not
    stage, and binding or fetching a piece keeps its owner: the share holds on Kafka too."""
    first = LegacyStaging(tmp_path / "staging", max_bytes=10_000, max_bytes_per_owner=1000)
    store_id = first.put(log_type="app", server="h", file="f", data=b"x" * 900, owner="tenant-b")
    other = LegacyStaging(tmp_path / "staging", max_bytes=10_000, max_bytes_per_owner=1000)
    with pytest.raises(LimitReached, match="max_staged_bytes_per_token"):
        other.put(log_type="app", server="h", file="f", data=b"x" * 200, owner="tenant-b")
    other.claim(store_id, "T1")  # as a peer's /commit_request has the holder do
    assert decode_staged(store_id, other.raw(store_id)).owner == "tenant-b"
    time.sleep(1.1)  # the next recount
    assert set(other.staged_by_owner()) == {"tenant-b"}
    with pytest.raises(LimitReached, match="max_staged_bytes_per_token"):
        other.put(log_type="app", server="h", file="f", data=b"x" * 200, owner="tenant-b")
    other.mark_written(store_id)  # its data is in the log: the share is free again
    time.sleep(1.1)
    other.put(log_type="app", server="h", file="f", data=b"x" * 800, owner="tenant-b")


class _SlowDisk(LegacyStaging):
    """Staging whose writes take a while, as an fsync on a busy disk does."""

    def _write(self, store_id: str, meta: dict[str, Any], data: bytes) -> None:
        time.sleep(0.2)
        super()._write(store_id, meta, data)


def test_one_tokens_concurrent_uploads_do_not_pass_its_share_together(tmp_path: Path) -> None:
    staging = _SlowDisk(tmp_path / "staging", max_bytes=100_000, max_bytes_per_owner=500)

    def upload(_: int) -> str:
        try:
            return staging.put(log_type="app", server="h", file="/a", data=b"x" * 100, owner="t")
        except LimitReached:
            return "refused"

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(upload, range(16)))
    admitted = [a for a in answers if a != "refused"]
    assert 1 <= len(admitted) <= 5, answers


def test_the_gauge_reads_the_last_count_without_waiting_for_a_count_in_progress(
    tmp_path: Path,
) -> None:
    staging = LegacyStaging(tmp_path / "staging", max_bytes=10_000, max_bytes_per_owner=1000)
    staging.put(log_type="app", server="h", file="f", data=b"x" * 100, owner="tenant-a")
    with staging._lock:  # as a count stuck on a hung disk holds it
        started = time.monotonic()
        by_owner = staging.staged_by_owner(recount=False)
    assert time.monotonic() - started < 0.5
    assert set(by_owner) == {"tenant-a"} and by_owner["tenant-a"] >= 100
