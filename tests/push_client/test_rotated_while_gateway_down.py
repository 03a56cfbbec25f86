"""Files rotated while the gateway is down, then a restart of the client: every line once."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    ship_then_kill_gateway,
    until,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


def test_a_file_first_seen_while_the_gateway_is_down_is_found_again_after_a_restart(
    tmp_path: Path, start_gateway, start_push
) -> None:
    shipped = ship_then_kill_gateway(tmp_path, start_gateway, start_push, LineWriter("a"))
    gateway, logs, app = shipped.gateway, shipped.logs, shipped.app
    writer, state, push = shipped.writer, shipped.state, shipped.push
    writer.append(app, 100)
    time.sleep(2)  # its sends fail and settle: nothing left that would save the state soon
    os.rename(app, logs / "app.log.1")  # rotation: the glob matches no rotated name
    writer.append(app, 100)  # a new file, first seen while nothing can be acknowledged

    def sources_tailed() -> list[str]:
        return re.findall(r"tailing \S+/app\.log as source (\S+)", push.log())

    assert until(lambda: len(sources_tailed()) == 2, 10.0), push.log()
    new_source = sources_tailed()[1]
    # saved once found; it used to wait for something else to save the state (an ack that
    # could not come, or a failure that happened to), and the restart never saw it again
    until(lambda: new_source in (state / "state.json").read_text(), 3)
    os.rename(logs / "app.log.1", logs / "app.log.2")  # the next rotation
    os.rename(app, logs / "app.log.1")
    writer.append(app, 100)
    push.kill()  # a crash, or a host reboot, before the gateway is back
    again = start_push(gateway.url, state, str(logs / "*.log"))
    gateway.start()  # again, at its port and data dir
    try:
        assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 400, timeout_s=30), writer)
        assert again.stop() == 0, again.log()
    finally:
        gateway.kill()
