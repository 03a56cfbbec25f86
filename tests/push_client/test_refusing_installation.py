"""A data center that refuses this client (a token it does not take) holds nothing back at the
data center that takes it: not the start's census, not the way back after a failover."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess
from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once_across,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow

FAILOVER_FLAGS = ["--failover-after", "1", "--probe-interval", "0.3", "--probe-max-interval", "1"]


def test_a_data_center_that_refuses_the_client_does_not_park_what_the_other_takes(
    tmp_path: Path, start_gateway, start_push
) -> None:
    config = tmp_path / "dc2.toml"
    config.write_text('[tokens.dc2-only]\nwrite = ["app"]\n')  # this client has no token
    dc1: GatewayProcess = start_gateway(tmp_path / "data1", "--dc", "dc1")
    dc2: GatewayProcess = start_gateway(tmp_path / "data2", "--dc", "dc2", "--config", str(config))
    logs = tmp_path / "logs"
    logs.mkdir()
    writer = LineWriter("a")
    writer.append(logs / "app.log", 100)
    state = tmp_path / "state"  # a first start: every installation is asked where each file is
    push = start_push(
        f"dc1={dc1.url}",
        state,
        str(logs / "*.log"),
        extra=["--server", f"dc2={dc2.url}", "--park-retry", "600", *FAILOVER_FLAGS],
    )
    # It was parked by dc2's refusal to say how far it holds the file: nothing shipped.
    assert wait_for_lines(dc1.data_dir, "app", 100, timeout_s=20).count() == 100, push.log()
    assert "installation dc2 refuses to say how far it holds it (HTTP 401" in push.log()

    dc1.kill()
    writer.append(logs / "app.log", 100)  # to dc2 now, which refuses it: parked
    deadline = time.monotonic() + 20
    while "parked" not in push.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "parked" in push.log(), push.log()
    dc1.start()  # again, at its port and data dir
    try:
        # tried at dc1 once data goes there again, not after park_retry_s (600 s here)
        wait_for_lines(dc1.data_dir, "app", 200, timeout_s=20)
        assert_exactly_once_across(
            [read_delivered(dc1.data_dir, "app"), read_delivered(dc2.data_dir, "app", "dc2")],
            writer,
        )
        assert push.stop() == 0, push.log()
    finally:
        dc1.kill()
