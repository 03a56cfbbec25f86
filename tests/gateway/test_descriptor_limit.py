"""The gateway under a low descriptor limit: it takes its hard limit as the soft one at start,
keeps only as many partitions open as the limit it has allows (8 descriptors each), and when
it runs out of descriptors all the same it closes idle partitions and opens again instead of
answering 503 for good."""

from __future__ import annotations

import errno
import resource
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.request_head import connection_cap
from log_store.errors import StoreUnavailable
from log_store.partition_handles import PartitionHandles, partitions_that_fit
from tests.conftest import GatewayProcess
from tests.gateway.conftest import chunk_data, end_offsets, meta


class _SoftLimitedGateway(GatewayProcess):
    """A gateway started with a low soft ``ulimit -n`` and the hard limit left as it is."""

    def _limit_open_files(self) -> None:
        assert self.max_open_files is not None
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_open_files, hard))


def _soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open files limit")


def test_the_partitions_kept_open_are_what_the_descriptor_limit_allows_at_8_each() -> None:
    assert partitions_that_fit(256, 1 << 20) == 256
    assert partitions_that_fit(256, 20000) == 256
    assert partitions_that_fit(256, 1024) == 32  # (512 - 256) / 8
    assert partitions_that_fit(256, 256) == 4  # never fewer than 4
    assert partitions_that_fit(2, 256) == 2
    # the connections and the partitions together stay within the limit
    for limit in (1024, 4096, 20000):
        assert 256 + 8 * partitions_that_fit(256, limit) + connection_cap(0, 256, limit) <= limit


class _FakeLog:
    def __init__(self, opened: list[_FakeLog]) -> None:
        self._opened = opened

    def close(self) -> None:
        self._opened.remove(self)


def test_an_open_out_of_descriptors_closes_idle_partitions_and_tries_again() -> None:
    opened: list[_FakeLog] = []

    def opener() -> Any:
        if len(opened) >= 3:  # the process has room for 3 partitions, not the bound's 100
            raise OSError(errno.EMFILE, "Too many open files")
        log = _FakeLog(opened)
        opened.append(log)
        return log

    handles = PartitionHandles(100, lambda _key, _log: None, descriptors=1 << 20)
    for partition in range(20):
        handle = handles.acquire(("t", partition), opener)
        handles.release(handle)
    assert len(opened) <= 3 and handles.closed_for_descriptors > 0


def test_an_open_that_fails_for_another_reason_is_not_said_as_out_of_descriptors() -> None:
    def opener() -> Any:
        raise sqlite3.OperationalError("unable to open database file")  # e.g. no permission

    handles = PartitionHandles(100, lambda _key, _log: None, descriptors=1 << 20)
    with pytest.raises(sqlite3.OperationalError, match="unable to open database file"):
        handles.acquire(("t", 0), opener)

    def out_of_descriptors() -> Any:
        raise OSError(errno.EMFILE, "Too many open files")

    with pytest.raises(StoreUnavailable, match="out of file descriptors"):
        handles.acquire(("t", 0), out_of_descriptors)


def test_a_gateway_started_with_a_low_soft_limit_takes_its_hard_limit(tmp_path: Path) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    gateway = _SoftLimitedGateway(
        tmp_path / "data", [], tmp_path / "gw.log", max_open_files=256
    ).start()
    try:
        assert gateway.proc is not None
        assert _soft_limit(gateway.proc.pid) == hard
    finally:
        gateway.kill()


def test_a_gateway_limited_to_128_descriptors_keeps_writing_to_48_partitions(
    tmp_path: Path,
) -> None:
    # 12 topics of 4 partitions: open at once they would need 384 descriptors; with the
    # default max_open_partitions (256) kept, writes failed with "Too many open files" after
    # ~15 partitions, for good.
    gateway = GatewayProcess(
        tmp_path / "data", ["--partitions", "4"], tmp_path / "gw.log", max_open_files=128
    ).start()
    topics = [f"fd{i}" for i in range(12)]
    sources = [f"s{i}" for i in range(8)]
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            for log_type in topics:
                body = encode_binary(
                    [(meta(s, log_type), [(1, 0, chunk_data(1))]) for s in sources]
                )
                response = http.post(
                    "/v1/write", content=body, headers={"content-type": BINARY_MEDIA_TYPE}
                )
                assert response.status_code == 200, response.text
                statuses = [a["status"] for r in response.json()["results"] for a in r["acks"]]
                assert statuses == ["written"] * len(sources), response.text
            assert http.get("/readyz").status_code == 200
    finally:
        gateway.kill()
    assert "Too many open files" not in gateway.log()
    written = end_offsets(gateway.data_dir)
    for log_type in topics:
        assert sum(n for (t, _p), n in written.items() if t == f"dc1.{log_type}") == 8
