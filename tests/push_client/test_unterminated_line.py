"""A last line without its newline is named in --status, not left as a lag that never moves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import LineWriter, assert_exactly_once, until, wait_for_lines

pytestmark = pytest.mark.slow


def _status(state: Path) -> str:
    return subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    ).stdout


def test_a_line_without_its_newline_is_named_in_the_status_until_it_ends(
    tmp_path: Path, gateway, start_push
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    writer = LineWriter("a")
    writer.append(logs / "app.log", 10)
    tail = b"a binary blob, or a line not ended yet: " + bytes(range(0x80, 0x100))
    with open(logs / "app.log", "ab") as f:
        f.write(tail)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, str(logs / "*.log")).wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 10)
    expected = f"NO NEWLINE YET {logs / 'app.log'}: its last {len(tail)} bytes are a line"
    # its lag used to be all --status said: bytes behind, seconds growing, no reason given
    assert until(lambda: expected in _status(state), 20.0), _status(state)
    with open(logs / "app.log", "ab") as f:
        f.write(b"\n")
    assert until(lambda: "NO NEWLINE YET" not in _status(state), 20.0), _status(state)
    delivered = wait_for_lines(gateway.data_dir, "app", 11)
    assert tail in [line for lines in delivered.lines.values() for line in lines]
    delivered.lines = {s: [x for x in lines if x != tail] for s, lines in delivered.lines.items()}
    assert_exactly_once(delivered, writer)
    assert push.stop() == 0, push.log()
