"""Rotations while the push-client is stopped: every line that is still in a file it can read
ships once; what it cannot ship safely is named, never passed over in silence.

A copytruncate while the client was stopped left the bytes after the acknowledged offset in
the copy, and the client took its source for gone; several rename rotations left the files
rotated in between (names the usual ``*.log`` does not match) unshipped without a word; a
FIFO, a directory or a dangling symbolic link matched by a glob was skipped unseen.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.push_client.conftest import (
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow

_LOG_TYPES = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the module: each test ships its own log type (its own topic)."""
    base = tmp_path_factory.mktemp("gateway")
    started = GatewayProcess(base / "data", [], base / "gateway.log")
    try:
        yield started.start()
    finally:
        started.kill()


@pytest.fixture
def app() -> str:
    return f"stopped{next(_LOG_TYPES)}"


def _ship_then_stop(
    gateway: GatewayProcess, start_push, state: Path, glob: Path, app: str, count: int
) -> None:
    """Run a client on ``glob`` until ``count`` lines are in the log, then stop it cleanly."""
    push = start_push(gateway.url, state, glob, log_type=app).wait_started(state)
    wait_for_lines(gateway.data_dir, app, count)
    assert push.stop() == 0, push.log()


def _restart(
    gateway: GatewayProcess, start_push, state: Path, glob: Path, app: str, count: int
) -> tuple[PushProcess, str]:
    """Start the client again, wait for ``count`` lines (and a moment for more that should
    not come), stop it; return it and its log."""
    push = start_push(
        gateway.url, state, glob, log_type=app, extra=["--rotated-grace", "1"]
    ).wait_started(state)
    wait_for_lines(gateway.data_dir, app, count, timeout_s=20)
    time.sleep(1.0)
    status = _unreadable(state)
    assert push.stop() == 0, push.log()
    return push, push.log_path.read_text(errors="replace") + status


def _unreadable(state: Path) -> str:
    """What ``--status`` says of the files not shipped (``UNREADABLE path: error``), from
    the status the running client publishes every second."""
    doc = json.loads((state / "status.json").read_bytes())
    return "".join(f"UNREADABLE {r['path']}: {r['error']}\n" for r in doc["unreadable"])


@pytest.mark.parametrize("pattern", ["*.log", "app.log*"], ids=["copies-unmatched", "matched"])
def test_copytruncate_while_stopped_finishes_the_source_from_its_copy(
    tmp_path: Path, gateway, start_push, app: str, pattern: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    path, state, glob = logs / "app.log", tmp_path / "state", logs / pattern
    writer = LineWriter("ct")
    writer.append(path, 200)
    _ship_then_stop(gateway, start_push, state, glob, app, 200)
    writer.append(path, 300)  # written while the client is stopped ...
    shutil.copyfile(path, logs / "app.log.1")  # ... then copytruncate
    os.truncate(path, 0)
    writer.append(path, 100)
    _, said = _restart(gateway, start_push, state, glob, app, 600)
    assert_exactly_once(read_delivered(gateway.data_dir, app), writer)
    assert "was truncated while the client was stopped" in said
    assert "app.log.1" in said
    assert "is gone since the last run" not in said


def test_copytruncate_while_stopped_with_a_compressed_copy_names_it(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    path, state, glob = logs / "app.log", tmp_path / "state", logs / "*.log"
    shipped, lost = LineWriter("ok"), LineWriter("lost")
    shipped.append(path, 200)
    _ship_then_stop(gateway, start_push, state, glob, app, 200)
    acked = path.stat().st_size
    lost.append(path, 100)
    with open(path, "rb") as src, gzip.open(logs / "app.log.1.gz", "wb") as gz:
        shutil.copyfileobj(src, gz)
    os.truncate(path, 0)
    shipped.append(path, 100)
    _, said = _restart(gateway, start_push, state, glob, app, 300)
    assert_exactly_once(read_delivered(gateway.data_dir, app), shipped)
    assert "app.log.1.gz (gzip)" in said
    assert f"bytes {acked}" in said or f"byte {acked}" in said
    assert f"UNREADABLE {logs / 'app.log.1.gz'}: a gzip-compressed copy" in said  # --status
    assert said.count(str(logs / "app.log.1.gz")) == 2  # once in the log, once in the status


def test_copytruncate_while_stopped_with_two_candidate_copies_does_not_guess(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    path, state, glob = logs / "app.log", tmp_path / "state", logs / "*.log"
    writer = LineWriter("ok")
    writer.append(path, 100)
    _ship_then_stop(gateway, start_push, state, glob, app, 100)
    # two files that start as the source did but go on differently: which is its copy?
    shutil.copyfile(path, logs / "app.log.1")
    shutil.copyfile(path, logs / "app.log.bak")
    LineWriter("one").append(logs / "app.log.1", 10)
    LineWriter("two").append(logs / "app.log.bak", 10)
    os.truncate(path, 0)
    writer.append(path, 50)
    _, said = _restart(gateway, start_push, state, glob, app, 150)
    assert_exactly_once(read_delivered(gateway.data_dir, app), writer)
    assert "which one is its copy cannot be told" in said
    for name in ("app.log.1", "app.log.bak"):
        assert f"UNREADABLE {logs / name}: may be the copy of {path}" in said


def _rotate(logs: Path, name: str = "app.log") -> None:
    """logrotate's ``create``: shift name.N to name.N+1, rename name to name.1, new name."""
    numbered = sorted(
        (p for p in logs.iterdir() if p.name[len(name) + 1 :].isdigit()),
        key=lambda p: -int(p.name[len(name) + 1 :]),
    )
    for rotated in numbered:
        n = int(rotated.name[len(name) + 1 :])
        os.rename(rotated, logs / f"{name}.{n + 1}")
    os.rename(logs / name, logs / f"{name}.1")
    (logs / name).touch()


def test_several_rotations_while_stopped_ship_the_files_in_between_once(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    path, state, glob = logs / "app.log", tmp_path / "state", logs / "*.log"
    writer = LineWriter("rot")
    writer.append(path, 200)
    _ship_then_stop(gateway, start_push, state, glob, app, 200)
    time.sleep(1.1)  # file times after the last save, whatever the clock's granularity
    writer.append(path, 100)
    for _ in range(3):  # three rotations while the client is stopped (app.log -> .3)
        _rotate(logs)
        writer.append(path, 100)
    # What must not ship twice: a copy of a file shipped before (the source, now .3),
    # a copy of a file shipped now (.2): only one of them is shipped.
    shutil.copyfile(logs / "app.log.3", logs / "app.log.7")
    shutil.copyfile(logs / "app.log.2", logs / "app.log-20261127")
    # What cannot ship: a rotated file compressed while the client was stopped.
    with gzip.open(logs / "app.log.5.gz", "wb") as gz:
        gz.write(LineWriter("gz").lines(20))
    _, said = _restart(gateway, start_push, state, glob, app, 600)
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, writer)
    assert said.count("rotated from app.log while the client was stopped") >= 2
    assert "app.log.5.gz rotated from app.log while the client was stopped and compressed" in said
    assert f"UNREADABLE {logs / 'app.log.5.gz'}: rotated from app.log" in said


def test_a_file_rotated_and_compressed_while_stopped_names_the_bytes_not_shipped(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    """logrotate's ``compress`` without ``delaycompress``: the source is gone, its rest is in
    a compressed file.  The bytes it holds that were not shipped are named; a compressed
    file holding only shipped bytes is no error."""
    logs = tmp_path / "logs"
    logs.mkdir()
    state, glob = tmp_path / "state", logs / "*.log"
    busy, idle, lost = LineWriter("busy"), LineWriter("idle"), LineWriter("lost")
    busy.append(logs / "busy.log", 100)
    idle.append(logs / "idle.log", 100)
    _ship_then_stop(gateway, start_push, state, glob, app, 200)
    acked = (logs / "busy.log").stat().st_size
    lost.append(logs / "busy.log", 50)  # written while the client is stopped
    held = (logs / "busy.log").stat().st_size
    for name in ("busy.log", "idle.log"):  # as logrotate does it: rename, create, compress
        os.rename(logs / name, logs / f"{name}.1")
        (logs / name).touch()
        with open(logs / f"{name}.1", "rb") as src, gzip.open(logs / f"{name}.1.gz", "wb") as gz:
            shutil.copyfileobj(src, gz)
        (logs / f"{name}.1").unlink()
    busy.append(logs / "busy.log", 10)
    _, said = _restart(gateway, start_push, state, glob, app, 210)
    assert_exactly_once(read_delivered(gateway.data_dir, app), busy, idle)
    error = "busy.log.1.gz rotated from busy.log while the client was stopped and compressed"
    assert f"{error} (gzip): bytes {acked}..{held} of source" in said, said
    assert f"UNREADABLE {logs / 'busy.log.1.gz'}: rotated from busy.log" in said
    assert "idle.log.1.gz (rotated from idle.log while the client was stopped and " in said
    assert "UNREADABLE " + str(logs / "idle.log.1.gz") not in said


def test_fifo_directory_and_dangling_link_matched_by_a_glob_are_named(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    writer = LineWriter("reg")
    writer.append(logs / "a.log", 100)
    os.mkfifo(logs / "pipe.log")
    (logs / "dir.log").mkdir()
    (logs / "dangling.log").symlink_to("/nonexistent/app.log")
    state = tmp_path / "state"
    push = start_push(gateway.url, state, logs / "*.log", log_type=app).wait_started(state)
    wait_for_lines(gateway.data_dir, app, 100)
    time.sleep(1.5)  # a few rescans: each is named once
    status = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    ).stdout
    assert push.stop() == 0, push.log()
    assert "1 files" in status, status  # the regular one, shipped
    said = push.log()
    for name, why in [
        ("pipe.log", "a FIFO (named pipe), not a regular file"),
        ("dir.log", "a directory, not a regular file"),
        ("dangling.log", "a dangling symbolic link (to /nonexistent/app.log)"),
    ]:
        assert said.count(f"cannot read {logs / name}: {why}") == 1, said
        assert f"UNREADABLE {logs / name} since " in status, status
    assert_exactly_once(read_delivered(gateway.data_dir, app), writer)
