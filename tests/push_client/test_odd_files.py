"""Files a real host has beside its logs: names that are not UTF-8, and the like."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import LineWriter, assert_exactly_once, wait_for_lines

pytestmark = pytest.mark.slow


def test_a_file_whose_name_is_not_utf8_ships_once_beside_the_others(
    tmp_path: Path, gateway, start_push
) -> None:
    """A Latin-1 file name in the glob's directory must not stop the client: it once died
    writing its status (JSON holds no undecodable bytes), and nothing at all was shipped."""
    logs = tmp_path / "logs"
    logs.mkdir()
    plain, odd = LineWriter("plain"), LineWriter("odd")
    plain.append(logs / "plain.log", 500)
    odd_path = Path(os.fsdecode(bytes(logs) + b"/caf\xe9.log"))
    odd.append(odd_path, 500)
    state = tmp_path / "state"
    first = start_push(gateway.url, state, logs / "*.log").wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    status = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        cwd=REPO,
        timeout=30,
    )
    assert status.returncode == 0, status.stderr
    assert b"caf\\xe9.log" in status.stdout
    assert b"caf\\\\xe9.log" in (state / "metrics.prom").read_bytes()
    assert first.stop() == 0, first.log()
    plain.append(logs / "plain.log", 300)
    odd.append(odd_path, 300)
    # The positions of the odd file survive the restart: nothing is asked of the gateway
    # twice, and the state file is not taken for corrupt.
    second = start_push(gateway.url, state, logs / "*.log")
    delivered = wait_for_lines(gateway.data_dir, "app", 1_600)
    assert second.stop() == 0, second.log()
    assert_exactly_once(delivered, plain, odd)
    assert "corrupt" not in second.log()
    assert not list(state.glob("state.json.corrupt-*"))
