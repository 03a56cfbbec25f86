"""A Kafka gateway still waiting for its cluster stops at once on SIGTERM: it used to finish
its current 5 s look for a broker first (``systemctl stop`` during a Kafka outage).  While it
waits, its own line says why, and librdkafka's lines do not bury it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import REPO, free_port, logbroker_cmd


def test_a_gateway_waiting_for_kafka_stops_at_once(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    kafka = ["--store", "kafka", "--kafka-bootstrap", nowhere]
    scratch = ["--data-dir", str(tmp_path / "scratch"), "--port", str(free_port())]
    proc = subprocess.Popen(
        logbroker_cmd("serve", *kafka, *scratch),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        while f"waiting for Kafka at {nowhere}" not in "".join(seen[-1:]):
            line = proc.stderr.readline()  # said after its first 5 s of waiting
            assert line, "".join(seen)
            seen.append(line)
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # librdkafka's clients printed each failed connection here, 4-8 lines a second
        assert len(seen) == 1, "".join(seen)
        assert seen[0].rstrip().endswith(f"Connect to ipv4#{nowhere} failed: Connection refused")
        assert proc.wait(30) == 0
        # The line comes right after a look failed, so the signal meets a look that has just
        # begun: the old code finished it first (5 s), the gateway now stops within a short
        # ask (0.5 s) and its exit (the rest: slow on a loaded machine).
        assert time.monotonic() - asked < 4.0
    finally:
        proc.kill()
        proc.wait(10)
