"""A state dir removed while the client runs is made again, with its lock."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import LineWriter, assert_exactly_once, wait_for_lines

pytestmark = pytest.mark.slow


def test_a_state_dir_removed_while_the_client_runs_is_made_again_and_locked(
    tmp_path: Path, gateway, start_push
) -> None:
    app = tmp_path / "app.log"
    writer = LineWriter("a")
    writer.append(app, 100)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, app).wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 100)
    shutil.rmtree(state)  # a clean-up job, or an operator who took it for a stale one
    writer.append(app, 100)
    deadline = time.monotonic() + 10
    while not (state / "status.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    # it used to write nothing more: --status said "no status (has the client run there?)"
    status = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert status.returncode == 0, status.stderr + push.log()
    assert f"running (pid {push.proc.pid})" in status.stdout
    assert "was removed while the client ran; made it again" in push.log()
    # and a second client of the same state dir is still kept out
    second = subprocess.run(
        logbroker_cmd(
            *("push", "--server", gateway.url, "--log-type", "app"),
            *("--state-dir", str(state), str(app)),
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert second.returncode == 2, second.stderr
    assert "another logbroker push is running" in second.stderr
    assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 200), writer)
    assert push.stop() == 0, push.log()
    assert (state / "state.json").exists()
