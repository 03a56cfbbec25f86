"""The bearer token the client sends: given in the config, or read from a file it watches.

A token file lets an operator (or a secret agent) replace the token without restarting the
client: :meth:`BearerToken.refresh` re-reads the file when its size, mtime or mode changed,
and the daemon then retries the files the gateway refused for want of a right token.

A file that cannot be used when it is re-read (``read`` refuses it: the command's check
refuses one other users may read) is not taken: requests go on with the token read last, and
the problem is logged and shown in the status (:attr:`BearerToken.problem`) until the file
is fixed.  Nothing is lost meanwhile: a file the gateway refuses for an old token is parked
and tried again when the token file changes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from log_store.errors import LogbrokerError

log = logging.getLogger("logbroker.push")


def read_plain(path: Path) -> str:
    """The token in ``path``, stripped ("" for an empty file); no check of its mode."""
    return path.read_text(encoding="utf-8").strip()


class BearerToken:
    """The current token; ``value`` is read by sender threads (one reference read).

    ``read`` reads the token file, raising (a :class:`LogbrokerError`, an ``OSError``) for a
    file that must not be used; the command passes its own check (``ops.token_options``).
    """

    def __init__(
        self,
        token: str | None,
        token_file: Path | None,
        read: Callable[[Path], str] = read_plain,
    ) -> None:
        self.value = token
        self.file = token_file
        self._read = read
        self._seen: tuple[int, int, int, int] | None = None
        self._missing_said = False
        self.problem: dict[str, Any] | None = None
        """Why the token file is not used now: ``file``, ``error``, ``since`` (wall clock);
        None when it is (or there is none)."""
        if token_file is not None:
            self.refresh()

    def replace(self, token: str | None, token_file: Path | None) -> bool:
        """Take a reloaded configuration's token; True if the token changed."""
        before = self.value
        self.file = token_file
        self._seen = None
        self._missing_said = False
        self.problem = None
        self.value = token
        if token_file is not None:
            self.refresh()
        return self.value != before

    def refresh(self) -> bool:
        """Re-read the token file if it changed; True if the token is now different."""
        if self.file is None:
            return False
        try:
            st = os.stat(self.file)
        except OSError as exc:
            # Said once, also when it is missing from the start (a mistyped path would
            # otherwise show only as files parked for a 401), and again after it came back.
            if self._seen is not None or not self._missing_said:
                log.error(
                    "cannot read the token file %s: %s; requests go %s until it can be read",
                    self.file,
                    exc.strerror,
                    self._going(),
                )
                self._seen = None
                self._missing_said = True
                self._set_problem(f"cannot read token file {self.file}: {exc.strerror}")
            return False
        self._missing_said = False
        # The mode too: a chmod that makes the file readable by others (or fixes that)
        # changes neither its size nor its mtime.
        seen = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            token = self._read(self.file) or None
        except (LogbrokerError, OSError, UnicodeDecodeError) as exc:
            error = str(exc)
            if self.problem is None or self.problem["error"] != error:
                log.error(
                    "%s; the token in it is not used: requests go %s until it is fixed",
                    error,
                    self._going(),
                )
            self._set_problem(error)
            return False
        if self.problem is not None:
            log.info("the token file %s can be used again", self.file)
            self.problem = None
        if token == self.value:
            return False
        self.value = token
        log.info("bearer token read from %s", self.file)
        return True

    def _going(self) -> str:
        return "with the token read last" if self.value else "without a token"

    def _set_problem(self, error: str) -> None:
        if self.problem is None or self.problem["error"] != error:
            self.problem = {
                "file": str(self.file),
                "error": error,
                "since": time.time(),
                "requests_go": self._going(),
            }

    def headers(self) -> dict[str, str]:
        token = self.value
        return {"Authorization": f"Bearer {token}"} if token else {}
