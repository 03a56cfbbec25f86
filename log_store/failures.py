"""Turning what the OS and SQLite say about a sick disk into ``StoreUnavailable``."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator

from log_store.errors import StoreUnavailable

_UNAVAILABLE_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EROFS,
    errno.EIO,
    errno.EACCES,
    errno.EPERM,
    errno.EMFILE,
    errno.ENFILE,
}

_UNAVAILABLE_SQLITE = (
    "database or disk is full",
    "readonly database",
    "disk i/o error",
    "unable to open database file",
    "database is locked",
    "attempt to write",
)


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from, each once.

    ``raise as_store_unavailable(exc) or exc from exc`` of a StoreUnavailable makes it its
    own cause: the chain is walked once."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the file system is full."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(cause, sqlite3.OperationalError) and "disk is full" in str(cause).lower():
            return True
    return False


_NO_SPACE = "no space left on the data directory's file system"
_FILE_SIZE_LIMIT = (
    "a file of the store reached the largest size this process may write (the file-size "
    "limit, ulimit -f / RLIMIT_FSIZE / LimitFSIZE, or the file system's largest file); free "
    "space does not mend it: raise the limit"
)


def as_store_unavailable(exc: BaseException) -> StoreUnavailable | None:
    """The ``StoreUnavailable`` that ``exc`` means, or None if it means something else.

    The reason says what happened in the operator's words where the OS or SQLite are terse:
    a full disk as no space (SQLite says "database or disk is full"), ``EFBIG`` as the
    file-size limit it is, not as a full disk."""
    if isinstance(exc, StoreUnavailable):
        return exc
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return StoreUnavailable(f"log store unavailable: {_FILE_SIZE_LIMIT} ({exc.strerror})")
    if isinstance(exc, OSError) and exc.errno in _UNAVAILABLE_ERRNOS:
        return StoreUnavailable(f"log store unavailable: {exc.strerror or exc}")
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        if "disk is full" in text:
            return StoreUnavailable(f"log store unavailable: {_NO_SPACE} ({exc})")
        if any(marker in text for marker in _UNAVAILABLE_SQLITE):
            return StoreUnavailable(f"log store unavailable: {exc}")
    return None
