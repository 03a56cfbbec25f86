"""What a refusal of the embedded store says about a sick disk: in the operator's words, and
never a file-size limit (EFBIG) as a full disk."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from log_store.failures import as_store_unavailable
from tests.conftest import REPO


def test_sqlite_out_of_space_is_said_as_no_space_left() -> None:
    refused = as_store_unavailable(sqlite3.OperationalError("database or disk is full"))
    assert refused is not None
    assert "no space left on the data directory's file system" in str(refused)


def test_a_file_size_limit_is_named_as_such_not_as_a_full_disk() -> None:
    refused = as_store_unavailable(OSError(errno.EFBIG, os.strerror(errno.EFBIG)))
    assert refused is not None
    assert "file-size limit" in str(refused) and "ulimit -f" in str(refused)
    assert "no space" not in str(refused)


_UNDER_A_FILE_SIZE_LIMIT = """
import resource, sys
from log_store import StoreUnavailable, TopicConfig, open_store

store = open_store(sys.argv[1])
store.create_topic("dc1.t", TopicConfig(partitions=1))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
value = b"x" * 60_000
for n in range(40):  # 2.4 MB: each segment stops at the 1 MiB limit and the next begins
    store.append("dc1.t", 0, [value])
try:
    store.append("dc1.t", 0, [b"y" * (2 << 20)])
except StoreUnavailable as exc:
    print("refused:", exc)
store.append("dc1.t", 0, [b"after"])
offset, read = 0, []
while True:
    got = store.read("dc1.t", 0, offset)
    if not got.records:
        break
    read += [r.value for r in got.records]
    offset = got.records[-1].offset + 1
print("records:", len(read), read == [value] * 40 + [b"after"])
"""


def test_a_segment_at_the_file_size_limit_rolls_over_and_writes_go_on(tmp_path: Path) -> None:
    """Before: the short write at the limit was taken for a full disk (``no space left ...
    74 GB free``), for good: the segment never rolled, and nothing was written again."""
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_FILE_SIZE_LIMIT, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "records: 41 True" in done.stdout, done.stdout + done.stderr
    refused = next(line for line in done.stdout.splitlines() if line.startswith("refused:"))
    assert "file-size limit" in refused and "no space" not in refused
    segments = list((tmp_path / "store").glob("topics/dc1.t/*/0/*.log"))
    assert len(segments) >= 3, segments
