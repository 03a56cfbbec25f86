"""The gateway keeps what it stores to its own user: with the usual umask 022 the data directory,
segments, databases, lock files and staged legacy uploads were readable by every local user,
who could read every tenant's data and hold a partition's ``write.lock`` (its writes waited)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import httpx


def _write_and_stage(url: str) -> None:
    line = b'{"log_type":"app","source_id":"host-a:app.log","seqno":1,"data":"one\\n"}\n'
    answer = httpx.post(
        url + "/v1/write",
        content=line,
        headers={"Content-Type": "application/x-ndjson"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    staged = httpx.post(url + "/store?log_type=app", content=b"legacy line\n", timeout=30)
    assert staged.status_code == 200, staged.text


def test_everything_the_gateway_creates_is_for_its_own_user_only(
    start_gateway: Any, tmp_path: Path
) -> None:
    old = os.umask(0o022)  # what most systems have, and what the gateway inherits here
    try:
        gateway = start_gateway(tmp_path / "data")
    finally:
        os.umask(old)
    _write_and_stage(gateway.url)
    made = [gateway.data_dir, *gateway.data_dir.rglob("*")]
    assert len(made) > 10  # topics, partitions, segments, databases, staging
    open_to_others = [
        f"{path} {stat.S_IMODE(path.lstat().st_mode):o}"
        for path in made
        if stat.S_IMODE(path.lstat().st_mode) & 0o077
    ]
    assert not open_to_others
    assert "may be entered by other users" not in gateway.log()


def test_a_data_dir_others_may_enter_is_named_at_start_and_left_as_it_is(
    start_gateway: Any, tmp_path: Path
) -> None:
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o755)
    gateway = start_gateway(data)
    assert f"data_dir {data} may be entered by other users (mode 755)" in gateway.log()
    assert f"chmod 700 {data}" in gateway.log()
    assert stat.S_IMODE(data.stat().st_mode) == 0o755  # the operator's choice, not changed
    _write_and_stage(gateway.url)
    segments = list(data.rglob("*.log"))
    assert segments
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in segments)
