"""A state directory that fills up under a running client, or cannot be used at all."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from push_client.state_file import decode_state
from tests.metrics_text import sample
from tests.push_client.conftest import LineWriter, assert_exactly_once, wait_for_lines

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def _fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its file system has no byte left."""
    filler = directory / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
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
