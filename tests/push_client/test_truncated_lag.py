"""What a file truncated by copytruncate still owes shows as lag until it is acknowledged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from push_client.status import read_status
from tests.metrics_text import samples
from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    ship_then_kill_gateway,
    until,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


def _metric(state: Path, name: str) -> float:
    """The sum of a metric's samples in the client's metrics.prom."""
    text = (state / "metrics.prom").read_text()
    return sum(v for (n, _), v in samples(text).items() if n == name)


def test_a_copytruncated_file_read_while_the_gateway_is_down_shows_what_it_still_owes(
    tmp_path: Path, start_gateway, start_push
) -> None:
    shipped = ship_then_kill_gateway(tmp_path, start_gateway, start_push, LineWriter("a", pad=30))
    gateway, logs, app = shipped.gateway, shipped.logs, shipped.app
    writer, state, push = shipped.writer, shipped.state, shipped.push
    writer.append(app, 100)  # read by the client, not acknowledged
    owed = app.stat().st_size // 2
    assert until(lambda: _metric(state, "logbroker_push_buffered_bytes") == owed, 30.0)
    shutil.copy(app, logs / "app.log.1")  # logrotate's copytruncate; the glob skips the copy
    with open(app, "r+b") as f:
        f.truncate(0)
    writer.append(app, 10)
    new_size = app.stat().st_size

    def two_sources() -> bool:
        return len(read_status(state)["files"]) == 2

    assert until(two_sources, 30.0), push.log()
    rows = {row["phase"]: row for row in read_status(state)["files"]}
    assert rows["closing"]["lag_bytes"] == owed, rows
    assert sum(r["lag_bytes"] for r in rows.values()) == owed + new_size, rows
    # the metric counted it as no lag either
    assert until(lambda: _metric(state, "logbroker_push_lag_bytes") == owed + new_size, 30.0), (
        state / "metrics.prom"
    ).read_text()

    gateway.start()  # again, at its port and data dir
    try:
        delivered = wait_for_lines(gateway.data_dir, "app", len(writer.ids))
        assert_exactly_once(delivered, writer)
        assert until(lambda: all(r["lag_bytes"] == 0 for r in read_status(state)["files"]), 30.0)
        assert push.stop() == 0, push.log()
    finally:
        gateway.kill()
