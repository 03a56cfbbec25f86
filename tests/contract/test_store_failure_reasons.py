"""What a refusal of the embedded store says about a sick disk: in the operator's words, and
never a file-size limit (EFBIG) as a full disk."""

from __future__ import annotations

import errno
import os
import sqlite3

from log_store.failures import as_store_unavailable


def test_sqlite_out_of_space_is_said_as_no_space_left() -> None:
    refused = as_store_unavailable(sqlite3.OperationalError("database or disk is full"))
    assert refused is not None
    assert "no space left on the data directory's file system" in str(refused)


def test_a_file_size_limit_is_named_as_such_not_as_a_full_disk() -> None:
    refused = as_store_unavailable(OSError(errno.EFBIG, os.strerror(errno.EFBIG)))
    assert refused is not None
    assert "file-size limit" in str(refused) and "ulimit -f" in str(refused)
    assert "no space" not in str(refused)
