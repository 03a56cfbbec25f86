"""A gateway's last Graphite send at a clean stop happens before its store closes: it carries
the gauges read from the store, and the stop logs no traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.delivery.conftest import Writer
from tests.ops.test_graphite import CarbonListener


def test_the_last_graphite_send_of_a_stopping_gateway_reads_the_open_store(
    start_gateway: Any, tmp_path: Path
) -> None:
    carbon = CarbonListener()
    # an interval no test waits for: the only send is the stop's last one
    graphite = ["--graphite", f"127.0.0.1:{carbon.port}", "--graphite-interval", "3600"]
    gateway = start_gateway(tmp_path / "data", *graphite, "--graphite-prefix", "lb")
    try:
        writer = Writer(gateway.url)
        writer.write("s1", [1, 2, 3])
        writer.close()
        assert gateway.stop() == 0
    finally:
        gateway.kill()
        carbon.close()
    log = gateway.log()
    assert "Traceback" not in log and "closed database" not in log, log
    end = [line for line in carbon.lines if line.startswith("lb.logbroker_partition_end_offset.")]
    assert any(line.split()[1] == "3.0" for line in end), carbon.lines[:40]
