"""A file deleted while the gateway is down: said as deleted, and its lines still ship once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    ship_then_kill_gateway,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


def test_a_file_deleted_while_the_gateway_is_down_is_said_deleted_and_ships_once(
    tmp_path: Path, start_gateway, start_push
) -> None:
    shipped = ship_then_kill_gateway(tmp_path, start_gateway, start_push, LineWriter("a"))
    gateway, app = shipped.gateway, shipped.app
    writer, push = shipped.writer, shipped.push
    writer.append(app, 100)
    app.unlink()  # a clean-up of old logs, or a logger that removes its file
    deadline = time.monotonic() + 10
    while "was deleted" not in push.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    # it was said "rotated away; reading it as long as it grows": an operator then looks
    # for a rotated file that is not there
    assert f"{app} was deleted; reading it to its end" in push.log(), push.log()
    assert "rotated away" not in push.log()
    gateway.start()  # again, at its port and data dir
    try:
        assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 200), writer)
        assert push.stop() == 0, push.log()
    finally:
        gateway.kill()
