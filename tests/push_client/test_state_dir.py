"""A state directory that fills up under a running client, or cannot be used at all."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

import pytest

from push_client.state_file import decode_state
from tests.conftest import REPO, logbroker_cmd
from tests.metrics_text import sample
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its file system has no byte left."""
    filler = directory / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):  # ENOSPC ends it
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return filler


def test_a_full_state_dir_costs_positions_not_shipping(
    tmp_path: Path, gateway, start_push, small_filesystem: Path
) -> None:
    """The client once died at the first save of its positions on a full state file system
    (and, under systemd, again after every restart).  Positions are a shortcut, the gateway's
    last seqnos are the truth: it must go on shipping, say so once, and save again later."""
    log = tmp_path / "app.log"
    state = small_filesystem / "state"
    writer = LineWriter("sd")
    writer.append(log, 1_000)
    push = start_push(gateway.url, state, log).wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    filler = _fill(small_filesystem)
    for _ in range(10):
        writer.append(log, 200)
        time.sleep(0.2)
    delivered = wait_for_lines(gateway.data_dir, "app", 3_000)
    assert push.proc is not None and push.proc.poll() is None, push.log()
    assert_exactly_once(delivered, writer)
    assert push.log().count("cannot save positions") == 1, push.log()
    assert push.log().count("cannot write status") <= 1, push.log()

    filler.unlink()
    writer.append(log, 500)
    delivered = wait_for_lines(gateway.data_dir, "app", 3_500)
    deadline = time.monotonic() + 10
    recovered = ("positions saved again", "status written again")
    while not all(m in push.log() for m in recovered) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(m in push.log() for m in recovered), push.log()
    metrics_text = (state / "metrics.prom").read_text()
    assert (sample(metrics_text, "logbroker_push_state_save_failures_total") or 0) >= 1
    assert push.stop() == 0, push.log()
    saved = decode_state((state / "state.json").read_bytes())
    assert [s.acked for s in saved.sources.values()] == [log.stat().st_size]
    assert_exactly_once(delivered, writer)


def _push_once(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "app.log"
    LineWriter("once").append(log, 10)
    return subprocess.run(
        logbroker_cmd(
            "push",
            "--server",
            "http://127.0.0.1:9",
            "--log-type",
            "app",
            *args,
            "--idle-exit",
            "1",
            str(log),
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_a_state_dir_that_is_a_file_exits_2_naming_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    out = _push_once(tmp_path, "--state-dir", str(state))
    assert out.returncode == 2, out.stderr
    assert f"cannot use state dir {state}" in out.stderr and "Traceback" not in out.stderr
    assert state.read_text() == "not a directory\n"


def test_a_state_file_that_cannot_be_read_exits_2_naming_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "state.json").mkdir(parents=True)
    out = _push_once(tmp_path, "--state-dir", str(state))
    assert out.returncode == 2, out.stderr
    assert "cannot use state dir" in out.stderr and "state.json" in out.stderr
    assert "Traceback" not in out.stderr
    assert sorted(p.name for p in state.iterdir()) == ["lock", "state.json"]


def test_a_metrics_port_in_use_exits_2_before_anything_is_shipped(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = tmp_path / "state"
        out = _push_once(tmp_path, "--state-dir", str(state), "--metrics-port", str(port))
    assert out.returncode == 2, out.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (state / "state.json").exists() and not (state / "status.json").exists()


def test_a_client_started_on_a_full_state_dir_ships(
    tmp_path: Path, gateway, small_filesystem: Path
) -> None:
    """A restart on a full state file system must ship as a running client does (the lock
    file's pid could not be written and the client refused to start: under systemd, a
    restart loop that shipped nothing)."""
    log = tmp_path / "app.log"
    state = small_filesystem / "state"
    writer = LineWriter("fullstart")
    writer.append(log, 200)
    assert _push_once_to(gateway.url, log, state).returncode == 0
    filler = _fill(small_filesystem)
    writer.append(log, 200)
    out = _push_once_to(gateway.url, log, state)
    assert out.returncode == 0, out.stderr
    assert "cannot save positions" in out.stderr
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
    filler.unlink()


def _push_once_to(server: str, log: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd(
            "push",
            "--server",
            server,
            "--log-type",
            "app",
            "--state-dir",
            str(state),
            *FAST_FLAGS,
            "--idle-exit",
            "1",
            str(log),
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
