"""An idle client (nothing new to send) learns no installation's health from requests: it
probes the idle ones, so a dead one is shown (and left) without waiting for data, and a live
idle one is never shown down."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from push_client.status import print_status, read_status
from tests.push_client.conftest import LineWriter, assert_exactly_once_across, read_delivered

pytestmark = [pytest.mark.slow, pytest.mark.fault]

# idle after 2 s without an answer, probes 0.3 s apart, left after 3 s of failed probes
FLAGS = ["--failover-after", "3", "--probe-interval", "0.3", "--probe-max-interval", "2"]


def _installations(state: Path) -> dict[str, dict[str, Any]]:
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads((state / "status.json").read_bytes())
        return {inst["name"]: inst for inst in doc.get("installations", [])}
    return {}


def _wait(predicate, what: str, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_an_idle_client_shows_a_dead_installation_down_and_leaves_it_at_once(
    tmp_path: Path, start_gateway, start_push
) -> None:
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    writer = LineWriter("i")
    writer.append(path, 50)
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", *FLAGS]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: read_delivered(dc1.data_dir, "app", "dc1").count() == 50, "dc1", 20)
    # idle with both alive for two rounds of idle probes: never shown down nor unanswered
    until = time.monotonic() + 4.5
    while time.monotonic() < until:
        insts = _installations(state)
        for name in ("dc1", "dc2"):
            assert insts[name]["up"], insts
            assert insts[name].get("unanswered_since") is None, insts
        time.sleep(0.2)
    assert insts["dc1"]["current"], insts
    dc1.kill()
    killed = time.monotonic()
    _wait(
        lambda: (
            _installations(state)["dc1"].get("unanswered_since") is not None
            or not _installations(state)["dc1"]["up"]
        ),
        "dc1 shown not answering",
        5,
    )
    out = io.StringIO()
    print_status(read_status(state), out)
    assert "installation dc1: up, NOT ANSWERING since" in out.getvalue() or (
        "installation dc1: DOWN" in out.getvalue()
    ), out.getvalue()
    _wait(lambda: not _installations(state)["dc1"]["up"], "dc1 marked down", 9)
    assert time.monotonic() - killed < 9
    assert _installations(state)["dc2"]["current"]
    # new lines go to dc2 at once, not after failover_after_s (3 s) of failing requests
    writer.append(path, 30)
    wrote = time.monotonic()
    _wait(lambda: read_delivered(dc2.data_dir, "app", "dc2").count() == 30, "dc2", 10)
    assert time.monotonic() - wrote < 2.5, push.log()
    assert push.stop() == 0, push.log()
    assert_exactly_once_across(
        [read_delivered(dc1.data_dir, "app", "dc1"), read_delivered(dc2.data_dir, "app", "dc2")],
        writer,
    )
