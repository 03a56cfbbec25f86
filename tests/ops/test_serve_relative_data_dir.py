"""A relative ``--data-dir`` is shown absolute: the start line and the dashboard's disk card
name where the store is, not where it is from the gateway's working directory."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.conftest import REPO, free_port, logbroker_cmd


def test_a_relative_data_dir_is_shown_absolute(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            logbroker_cmd("serve", "--data-dir", "relstore", "--port", str(port)),
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                overview = httpx.get(f"http://127.0.0.1:{port}/v1/ui/overview", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        assert overview.json()["disk"]["path"] == str(tmp_path / "relstore")
        assert f"data dir {tmp_path / 'relstore'}," in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert (tmp_path / "relstore" / "catalog.db").is_file()
