"""The loader's tier of the end-to-end audit: counted from the table it filled, so a line
deleted from the table by hand is reported lost (a real gateway, the shared Spark session)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq
import pytest

from ops.audit_loader import publish_table_counts
from tests.conftest import logbroker_cmd
from tests.yt_loader.conftest import REPO
from yt_loader.load_job import LoadConfig, run_load
from yt_loader.log_source import SourceSpec
from yt_loader.table_counts import delta_table_counts, parquet_table_counts
from yt_loader.warehouse import Warehouse

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def write_lines(url: str, chunks: int, lines_per_chunk: int) -> None:
    now_ms = int(time.time() * 1000)
    body = b"".join(
        orjson.dumps(
            {
                "log_type": "app",
                "source_id": "audited",
                "seqno": n + 1,
                "create_time": now_ms,
                "data": "".join(f"chunk {n} line {i}\n" for i in range(lines_per_chunk)),
            }
        )
        + b"\n"
        for n in range(chunks)
    )
    answer = httpx.post(
        url + "/v1/write", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert answer.status_code == 200, answer.text


def tiers(url: str) -> dict[str, Any]:
    """Lines and lost lines per tier, over the windows of dc1.app the gateway reconciles."""
    windows = httpx.get(url + "/v1/audit/windows", params={"topic": "dc1.app"}).json()["windows"]
    out: dict[str, Any] = {}
    for w in windows:
        for name, tier in w["tiers"].items():
            lines, lost = out.get(name, (0, 0))
            out[name] = (lines + tier["lines"], lost + tier["lost_lines"])
    out["complete"] = all(w["complete"] for w in windows) if windows else None
    return out


def wait_for(url: str, want: dict[str, Any], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tiers(url) == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"the audit shows {tiers(url)}, not {want}")


def test_the_loader_counts_its_table_and_a_line_deleted_from_it_is_lost(
    spark: Any, start_gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGBROKER_AUDIT_INTERVAL_S", "1")
    gateway = start_gateway(tmp_path / "data", "--dc", "dc1")
    write_lines(gateway.url, chunks=12, lines_per_chunk=25)
    wait_for(gateway.url, {"gateway": (300, 0), "complete": True})

    warehouse = tmp_path / "wh"
    spec = SourceSpec(server=gateway.url)
    config = LoadConfig(spec, warehouse, topics="dc1.app", table_format="parquet")
    run_load(spark, config, lambda _line: None)
    counts = parquet_table_counts(warehouse)
    assert sum(m for m, _ in counts.values()) == 12
    publish_table_counts(counts, warehouse, server=gateway.url, token=None)
    wait_for(gateway.url, {"gateway": (300, 0), "loader": (300, 0), "complete": True})

    # an operator deletes a line from the table: the next recount (no Spark) reports it
    path = Warehouse(warehouse).committed_files()[0]
    pq.write_table(pq.read_table(path).slice(1), path)
    recount = subprocess.run(
        logbroker_cmd(
            "load",
            "--server",
            gateway.url,
            "--warehouse",
            str(warehouse),
            "--table-format",
            "parquet",
            "--audit-only",
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert recount.returncode == 0, recount.stderr
    wait_for(gateway.url, {"gateway": (300, 0), "loader": (299, 1), "complete": False})

    # a Delta table is counted the same way, with Spark
    delta = tmp_path / "delta"
    run_load(spark, LoadConfig(spec, delta, topics="dc1.app"), lambda _line: None)
    delta_counts = delta_table_counts(spark, delta)
    assert set(delta_counts) == set(counts)
    assert sum(m for m, _ in delta_counts.values()) == 12
    assert sum(n for _, n in delta_counts.values()) == 300
