"""A legacy ``/store`` that never answered holds no token's share: a gateway killed while
writing the piece leaves a file the next start removes, and a client that went away before
the answer leaves nothing.  A piece whose store id was answered survives the restart (see
test_legacy_api.py, ``test_staged_and_requested_data_survive_a_gateway_kill``)."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from delivery.legacy_txn import CRASH_AT_ENV, LegacyStaging
from tests.conftest import GatewayProcess
from tests.delivery.conftest import wait_until
from tests.delivery.test_legacy_staging_per_token import CONFIG, SHARE, TOKEN_A, _store

PIECE = SHARE * 3 // 4
"""Two such pieces are over the token's share: one cut short must not count."""


def _gateway(tmp_path: Path, n: int) -> GatewayProcess:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    config.chmod(0o600)
    return GatewayProcess(tmp_path / "data", ["--config", str(config)], tmp_path / f"gw{n}.log")


def _staging(tmp_path: Path) -> list[str]:
    return sorted(
        p.name
        for p in (tmp_path / "data" / "legacy-staging").iterdir()
        if not p.name.startswith(".lock-")
    )


@pytest.mark.fault
def test_a_store_cut_by_a_kill_does_not_hold_the_tokens_share_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_STAGED_BYTES", str(SHARE * 4))
    monkeypatch.setenv(CRASH_AT_ENV, "before-staged-rename")
    first = _gateway(tmp_path, 1).start()
    try:
        with pytest.raises(httpx.TransportError):
            _store(first.url, TOKEN_A, "app", PIECE)
        assert first.proc is not None
        first.proc.wait(10)
        [left] = _staging(tmp_path)
        assert left.endswith(".tmp")  # written and synced, never renamed: no store id
    finally:
        first.kill()
    monkeypatch.delenv(CRASH_AT_ENV)
    second = _gateway(tmp_path, 2).start()
    try:
        wait_until(lambda: _staging(tmp_path) == [], 10, "the cut piece to be removed")
        stored = _store(second.url, TOKEN_A, "app", PIECE)
        assert stored.status_code == 200, stored.text
        assert _staging(tmp_path) == [stored.json()["store_id"]]
    finally:
        second.stop()


@pytest.mark.fault
def test_a_client_that_leaves_before_the_answer_leaves_no_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = _gateway(tmp_path, 1).start()
    try:
        for cut_at in (PIECE // 2, PIECE):  # mid-body, and after the whole body
            head = (
                f"POST /store?log_type=app HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {TOKEN_A}\r\nContent-Length: {PIECE}\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", gw.port)) as conn:
                conn.sendall(head.encode() + b"\0" * cut_at)
            time.sleep(2)  # the body read, staged and the client found gone
            assert _staging(tmp_path) == [], cut_at
        # and the token's share is whole: two pieces of three quarters would be over it
        stored = _store(gw.url, TOKEN_A, "app", PIECE)
        assert stored.status_code == 200, stored.text
    finally:
        gw.stop()


def test_a_file_being_written_is_left_and_an_abandoned_one_removed(tmp_path: Path) -> None:
    staging = LegacyStaging(tmp_path)
    live = tmp_path / "a.1.tmp"
    live.write_bytes(b"x" * 10)
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its writer holds it
    opening = tmp_path / "b.2.tmp"
    opening.write_bytes(b"")  # a writer between its open and its lock
    abandoned = tmp_path / "c.3.tmp"
    abandoned.write_bytes(b"y" * 10)
    try:
        assert staging.drop_abandoned() == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a.1.tmp", "b.2.tmp"]
        assert staging.staged_bytes() == 10
    finally:
        os.close(fd)
