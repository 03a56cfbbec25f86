"""Late lines in a rotated file: a writer that keeps its descriptor after a rename is followed
for the rotated grace, and what it writes after the client let go is counted, never silent."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


def test_lines_appended_to_a_renamed_file_ten_seconds_later_arrive(
    tmp_path: Path, gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    old = LineWriter("old")
    new = LineWriter("new")
    handle = open(path, "ab")  # noqa: SIM115 - the application's descriptor
    try:
        handle.write(old.lines(200))
        handle.flush()
        state = tmp_path / "state"
        # the default grace (5 minutes); the 2 s a rotated file used to get would lose them
        push = start_push(gateway.url, state, path).wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 200)
        os.rename(path, tmp_path / "app.log.1")
        new.append(path, 100)  # the application's successor log, or another process
        wait_for_lines(gateway.data_dir, "app", 300)
        time.sleep(10)  # the writer reopens its log only minutes later
        handle.write(old.lines(150))
        handle.flush()
    finally:
        handle.close()
    delivered = wait_for_lines(gateway.data_dir, "app", 450)
    assert push.stop() == 0
    assert_exactly_once(delivered, old, new)


def test_bytes_written_after_the_grace_are_counted_and_logged_as_not_shipped(
    tmp_path: Path, gateway, start_push
) -> None:
    path = tmp_path / "app.log"
    writer = LineWriter("late")
    handle = open(path, "ab")  # noqa: SIM115 - the application's descriptor
    try:
        handle.write(writer.lines(100))
        handle.flush()
        state = tmp_path / "state"
        push = start_push(gateway.url, state, path, extra=["--rotated-grace", "1"]).wait_started(
            state
        )
        wait_for_lines(gateway.data_dir, "app", 100)
        os.rename(path, tmp_path / "app.log.1")
        deadline = time.monotonic() + 30
        while "letting go of" not in push.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "(rotated)" in push.log()
        late = writer.lines(10)
        handle.write(late)
        handle.flush()
    finally:
        handle.close()
    counted = f"logbroker_push_abandoned_bytes_total {len(late)}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = (state / "metrics.prom").read_text()
        if counted in metrics and "after it was let go" in push.log():
            break
        time.sleep(0.2)
    assert counted in metrics
    assert f"{len(late)} bytes were written to {tmp_path}/app.log.1 after it was let go" in (
        push.log()
    )
    assert push.stop() == 0
    assert read_delivered(gateway.data_dir, "app").count() == 100
