"""A Kafka gateway still waiting for its cluster stops at once on SIGTERM: it used to finish
its current 5 s look for a broker first (``systemctl stop`` during a Kafka outage)."""

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
        seen = []  # librdkafka's own lines too
        while f"waiting for Kafka at {nowhere}" not in "".join(seen[-1:]):
            line = proc.stderr.readline()  # said after its first 5 s of waiting
            assert line, "".join(seen)
            seen.append(line)
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert time.monotonic() - asked < 2.0
    finally:
        proc.kill()
        proc.wait(10)
