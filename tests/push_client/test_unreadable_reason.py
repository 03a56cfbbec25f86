"""Why a file cannot be read or looked at is in status.json, --status and the metrics as its
message and its symbolic errno (the message alone differs between hosts and languages, and
an alert rule needs a value it can match)."""

from __future__ import annotations

import concurrent.futures
import errno
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from push_client.config import build_config
from push_client.discovery import ChangeWatcher
from push_client.files import Counters, FileSet
from push_client.installations import InstallationSet
from push_client.lag_report import report_rows
from push_client.metrics import PushMetrics
from push_client.state_file import PushState
from push_client.status import FileRows, print_status, unreadable_row
from push_client.transport import TransportStats
from tests.metrics_text import sample

_LOOP_ERROR = os.strerror(errno.ELOOP)  # "Too many levels of symbolic links"


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    directory = tmp_path / "logs"
    directory.mkdir()
    return directory


@pytest.fixture
def files(tmp_path: Path, logs: Path) -> Iterator[FileSet]:
    config = build_config(
        servers=["http://gw:1"],
        state_dir=str(tmp_path / "state"),
        log_type="app",
        paths=[str(logs / "*.log")],
    )
    watcher = ChangeWatcher(False)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fileset = FileSet(config, PushState(), Counters(), watcher, pool, on_retired=lambda: None)
        yield fileset
        fileset.close()
        watcher.close()


def _metrics(files: FileSet) -> str:
    installations = InstallationSet(
        build_config(
            servers=["http://gw:1"], state_dir="/s", log_type="a", paths=["/x"]
        ).installations,
        probe_interval_s=60.0,
        wake=lambda: None,
    )
    try:
        return PushMetrics().render(
            counters=files.counters,
            stats=TransportStats(),
            files=list(files.files.values()),
            buffered=0,
            in_flight=0,
            installations=installations,
            parked_total=0,
            abandoned_bytes=0,
            unreadable=list(files.unreadable.values()),
        )
    finally:
        installations.close()


def _status_text(files: FileSet) -> str:
    now = time.time()
    rows = FileRows().rows(list(files.files.values()))
    for row in rows:
        row["lag_bytes"], row["lag_s"] = 0, 0.0
    doc = {
        "pid": os.getpid(),
        "running": True,
        "checked_at": now,
        "changed_at": now,
        "servers": ["http://gw:1"],
        "installations": [],
        "files": rows,
        "unreadable": [unreadable_row(m) for m in files.unreadable.values()],
    }
    out = io.StringIO()
    print_status(doc, out)
    return out.getvalue()


def test_a_file_that_cannot_be_read_shows_its_errno_beside_the_message(
    files: FileSet, logs: Path
) -> None:
    (logs / "loop.log").symlink_to(logs / "loop.log")  # matched, cannot be opened (as root too)
    files.discover()
    (miss,) = files.unreadable.values()
    assert (miss.error, miss.errno) == (_LOOP_ERROR, "ELOOP"), miss
    row = unreadable_row(miss)
    assert (row["error"], row["errno"]) == (_LOOP_ERROR, "ELOOP"), row
    (reported,) = report_rows([row], time.time())  # what the gateway's dashboard shows
    assert (reported["phase"], reported["errno"]) == (f"unreadable: {_LOOP_ERROR}", "ELOOP")
    assert f"UNREADABLE {logs / 'loop.log'} since " in _status_text(files)
    assert f": {_LOOP_ERROR} [ELOOP] (not shipped; size unknown)" in _status_text(files)
    labels = {"file": str(logs / "loop.log"), "source": "", "what": "unreadable"}
    metrics = _metrics(files)
    assert sample(
        metrics, "logbroker_push_file_unreadable", **labels, error=_LOOP_ERROR, errno="ELOOP"
    ), metrics


def test_a_tailed_file_whose_path_cannot_be_looked_at_shows_its_errno(
    files: FileSet, logs: Path
) -> None:
    path = logs / "app.log"
    path.write_bytes(b"a line\n")
    (tailed,) = files.discover()
    # its path becomes a symbolic link to itself: stat fails, the descriptor still reads
    os.rename(path, logs / "app.old")
    path.symlink_to(path)
    files.refresh_all(time.monotonic())
    assert tailed.path_error is not None
    assert (tailed.path_error.error, tailed.path_error.errno) == (_LOOP_ERROR, "ELOOP")
    (row,) = FileRows().rows([tailed])
    assert row["path_error"]["errno"] == "ELOOP" and row["path_error"]["error"] == _LOOP_ERROR
    (reported,) = report_rows([row], time.time())
    assert reported["phase"] == f"{row['phase']}; cannot stat its path: {_LOOP_ERROR}"
    assert reported["errno"] == "ELOOP"
    assert f"CANNOT STAT {path} since " in _status_text(files)
    assert f": {_LOOP_ERROR} [ELOOP] (read on through" in _status_text(files)
    labels = {"file": str(path), "source": tailed.source_id, "what": "stat"}
    metrics = _metrics(files)
    assert sample(
        metrics, "logbroker_push_file_unreadable", **labels, error=_LOOP_ERROR, errno="ELOOP"
    ), metrics

    path.unlink()
    os.rename(logs / "app.old", path)  # back: nothing is wrong, nothing to name
    files.refresh_all(time.monotonic())
    assert tailed.path_error is None
    assert report_rows(FileRows().rows([tailed]), time.time())[0]["errno"] is None
