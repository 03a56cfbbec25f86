"""A gateway that takes smaller chunks than the client cuts: the client cuts smaller."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import FAST_FLAGS, LineWriter, assert_exactly_once, read_delivered

pytestmark = pytest.mark.slow


def test_chunks_of_short_lines_over_the_gateways_limit_are_cut_smaller_and_ship_once(
    tmp_path: Path, start_gateway
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text("[limits]\nmax_chunk_bytes = 65536\n")
    gateway = start_gateway(tmp_path / "data", "--config", str(config))
    logs = tmp_path / "logs"
    logs.mkdir()
    busy = LineWriter("busy")
    busy.append(logs / "busy.log", 4000)  # 300 KB at once: cut into 1 MiB chunks (chunk_bytes)
    (logs / "huge.log").write_bytes(b"h" * 100_000 + b"\n")  # one line over the limit
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(tmp_path / "st")]
    done = subprocess.run(
        logbroker_cmd("push", *args, *FAST_FLAGS, "--idle-exit", "2", str(logs / "*.log")),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    # busy.log was parked for good as well (every retry cut the same 300 KB chunk), though
    # none of its lines is near the limit
    assert "busy.log was not shipped" not in done.stderr, done.stderr
    assert "its chunks are cut at 65536 bytes from now on" in done.stderr
    delivered = read_delivered(gateway.data_dir, "app")
    assert_exactly_once(delivered, busy)
    # a line over the limit is still the operator's call: parked, and the run says so
    assert done.returncode == 1, done.stderr
    assert f"{logs / 'huge.log'} was not shipped: parked" in done.stderr
    assert "huge.log: one line of it is longer than the gateway takes" in done.stderr
