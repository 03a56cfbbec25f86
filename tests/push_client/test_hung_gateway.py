"""A gateway that takes requests and never answers (frozen with SIGSTOP, or waiting for its
Kafka) is left after ``stall_after_s``, not after ``request_timeout_s`` (60 s): its requests
go to the next gateway of the installation, or, when every gateway of it hangs for
``failover_after_s``, to the next installation; each line still lands once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.push_client.conftest import (
    BackgroundWriter,
    LineWriter,
    assert_exactly_once,
    assert_exactly_once_across,
    read_delivered,
    wait_for_lines,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]

STALL_S = 2.0
HUNG_FLAGS = [
    "--stall-after",
    f"{STALL_S:g}",
    "--probe-interval",
    "0.3",
    "--probe-max-interval",
    "1",
]


def _freeze(gateway) -> None:  # type: ignore[no-untyped-def]
    os.killpg(gateway.proc.pid, signal.SIGSTOP)


def _thaw(gateway) -> None:  # type: ignore[no-untyped-def]
    os.killpg(gateway.proc.pid, signal.SIGCONT)


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Seconds until ``predicate`` held; fails after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_a_frozen_gateway_is_left_for_the_other_gateway_after_stall_after_s(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """F6: the gateway in use frozen, a second one of the installation healthy: lines went on
    only after ``request_timeout_s`` (60 s).  Now the hung request is sent to the other
    gateway after ``stall_after_s``; the frozen one's copy, thawed, writes nothing twice."""
    data = tmp_path / "data"
    first = start_gateway(data)
    second = start_gateway(data)
    path = tmp_path / "app.log"
    writer = LineWriter("h")
    writer.append(path, 300)
    state = tmp_path / "state"
    push = start_push(f"{first.url},{second.url}", state, path, extra=HUNG_FLAGS)
    push.wait_started(state)
    wait_for_lines(data, "app", 300)
    time.sleep(0.5)  # idle: the frozen gateway holds no lock of the shared store
    _freeze(first)
    try:
        writer.append(path, 300)
        took = _wait(lambda: read_delivered(data, "app").count() >= 600, "the other gateway", 30)
        assert took < STALL_S + 5, f"lines went on {took:.1f} s after the freeze\n{push.log()}"
        assert "Stalled: no answer for" in push.log()
        assert f"now sending to {second.url}" in push.log()
    finally:
        _thaw(first)
    time.sleep(1.0)  # the thawed gateway handles the request it held (a duplicate)
    writer.append(path, 300)
    wait_for_lines(data, "app", 900)
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(data, "app"), writer)


def test_a_frozen_installation_is_left_after_stall_after_s_plus_failover_after_s(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """F5: with dc1's gateway hanging (frozen here; waiting for its Kafka there) dc2 got the
    lines only after the requests failed (a minute).  Now dc1 is left ``stall_after_s +
    failover_after_s`` after its first request hung; what it held is in doubt there and
    settled once it answers again: every line in exactly one installation."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("i")
    writer.append(path, 300)
    state = tmp_path / "state"
    failover_s = 1.0
    extra = [*HUNG_FLAGS, "--server", f"dc2={dc2.url}", "--failover-after", f"{failover_s:g}"]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra)
    push.wait_started(state)
    _wait(lambda: read_delivered(dc1.data_dir, "app", "dc1").count() == 300, "dc1", 30)

    def in_dc2() -> int:
        return read_delivered(dc2.data_dir, "app", "dc2").count()

    try:
        with BackgroundWriter(path, writer, lines_per_tick=5):
            time.sleep(0.5)
            _freeze(dc1)
            took = _wait(lambda: in_dc2() > 0, "lines in dc2", 40)
            assert took < STALL_S + failover_s + 5, f"dc2 wrote {took:.1f} s after the freeze"
            time.sleep(1.0)
        assert "installation dc1 is down" in push.log()
    finally:
        _thaw(dc1)

    def every_line() -> bool:
        delivered = read_delivered(dc1.data_dir, "app", "dc1").count() + in_dc2()
        return delivered >= len(writer.ids)

    _wait(every_line, "every line (dc1's doubt settled)", 40)
    assert push.stop() == 0, push.log()
    assert_exactly_once_across(
        [read_delivered(dc1.data_dir, "app", "dc1"), read_delivered(dc2.data_dir, "app", "dc2")],
        writer,
    )
