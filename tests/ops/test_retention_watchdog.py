"""A running gateway applies topics' retention by itself."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from log_store import TopicConfig, open_store
from tests.conftest import REPO, free_port, logbroker_cmd


def test_serve_drops_old_segments_while_running(start_gateway: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic(
            "dc1.web", TopicConfig(partitions=1, segment_bytes=4096, retention_bytes=10_000)
        )
        for i in range(50):
            store.append("dc1.web", 0, [b"%d" % i + b"." * 1000])
    start_gateway(data_dir, "--retention-check-seconds", "0.2")
    deadline = time.monotonic() + 10
    with open_store(data_dir) as store:
        while time.monotonic() < deadline:
            info = store.describe_topic("dc1.web").partitions[0]
            if info.start_offset > 0:
                break
            time.sleep(0.1)
        assert info.start_offset > 30
        assert info.end_offset == 50
        assert store.read("dc1.web", 0, info.start_offset).records


def test_a_negative_or_endless_retention_interval_exits_2_and_creates_nothing(
    tmp_path: Path,
) -> None:
    for value in ("-5", "nan", "inf"):
        result = subprocess.run(
            logbroker_cmd(
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(free_port()),
                "--retention-check-seconds",
                value,
            ),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=20,
        )
        assert result.returncode == 2, (value, result.stderr)
        assert "--retention-check-seconds" in result.stderr
        assert not (tmp_path / "data").exists()
