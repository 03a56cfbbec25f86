"""A one-shot run stopped by a signal says whether it shipped everything, in its status."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess, free_port
from tests.push_client.conftest import LineWriter, assert_exactly_once, wait_for_lines

pytestmark = pytest.mark.slow


def test_a_one_shot_run_stopped_before_it_shipped_everything_exits_1_and_a_rerun_finishes(
    tmp_path: Path, start_push
) -> None:
    app = tmp_path / "app.log"
    writer = LineWriter("a")
    writer.append(app, 100)
    state = tmp_path / "state"
    url = f"http://127.0.0.1:{free_port()}"  # the gateway is not up yet
    run = start_push(url, state, app, extra=["--idle-exit", "30"]).wait_started(state)
    run.proc.send_signal(signal.SIGTERM)  # a CI step cancelled, a cron job's timeout
    # it exited 0, which a one-shot run means as "every file found was shipped"
    assert run.wait(30) == 1, run.log()
    owed = app.stat().st_size
    assert f"stopped before the run was done: {owed} bytes of 1 file not acknowledged" in run.log()

    gateway = GatewayProcess(tmp_path / "data", [], tmp_path / "gateway.log")
    gateway.port, gateway.url = int(url.rsplit(":", 1)[1]), url
    gateway.start()
    try:
        rerun = start_push(url, state, app, extra=["--idle-exit", "1"])
        assert rerun.wait(60) == 0, rerun.log()
        assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 100), writer)
        # stopped once everything is acknowledged: nothing owed, status 0
        writer.append(app, 10)
        last = start_push(url, state, app, extra=["--idle-exit", "30"]).wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 110)
        time.sleep(1.5)  # its status and positions are brought up to date
        last.proc.send_signal(signal.SIGTERM)
        assert last.wait(30) == 0, last.log()
        assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 110), writer)
    finally:
        gateway.kill()
