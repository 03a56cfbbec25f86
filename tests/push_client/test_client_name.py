"""The name a push-client reports its files under (the dashboard's "client")."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import logbroker_cmd


def test_two_clients_with_the_same_relative_state_dir_report_as_two(
    gateway: Any, tmp_path: Path
) -> None:
    """Before: both reported as ``host:push`` (the state dir as typed), and the dashboard
    showed the files of one of them only."""
    procs = []
    for name in ("c1", "c2"):
        home = tmp_path / name
        (home / "logs").mkdir(parents=True)
        (home / "logs" / f"{name}.log").write_text(f"{name} line\n")
        procs.append(
            subprocess.Popen(
                logbroker_cmd(
                    "push",
                    "--server",
                    gateway.url,
                    "--log-type",
                    "rel",
                    "--state-dir",
                    "push",
                    "logs/*.log",
                ),
                cwd=home,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        deadline = time.monotonic() + 60
        paths: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            clients = httpx.get(gateway.url + "/v1/ui/overview", timeout=30).json()["push_clients"]
            paths = {c["client"]: [f["path"] for f in c["files"]] for c in clients}
            if len(paths) == 2:
                break
            time.sleep(0.5)
        assert sorted(paths.values()) == [
            [str(tmp_path / "c1" / "logs" / "c1.log")],
            [str(tmp_path / "c2" / "logs" / "c2.log")],
        ], paths
        names = sorted(paths)
        assert names[0].endswith(f"{tmp_path}/c1/push") and names[1].endswith(f"{tmp_path}/c2/push")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
