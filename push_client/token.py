"""The bearer token the client sends: given in the config, or read from a file it watches.

A token file lets an operator (or a secret agent) replace the token without restarting the
client: :meth:`BearerToken.refresh` re-reads the file when its size or mtime changed, and the
daemon then retries the files the gateway refused for want of a right token.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("logbroker.push")


class BearerToken:
    """The current token; ``value`` is read by sender threads (one reference read)."""

    def __init__(self, token: str | None, token_file: Path | None) -> None:
        self.value = token
        self.file = token_file
        self._seen: tuple[int, int, int] | None = None
        self._missing_said = False
        if token_file is not None:
            self.refresh()

    def replace(self, token: str | None, token_file: Path | None) -> bool:
        """Take a reloaded configuration's token; True if the token changed."""
        before = self.value
        self.file = token_file
        self._seen = None
        self._missing_said = False
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
                    "with the token read last" if self.value else "without a token",
                )
                self._seen = None
                self._missing_said = True
            return False
        self._missing_said = False
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            token = self.file.read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            log.error("cannot read the token file %s: %s", self.file, exc)
            return False
        if token == self.value:
            return False
        self.value = token
        log.info("bearer token read from %s", self.file)
        return True

    def headers(self) -> dict[str, str]:
        token = self.value
        return {"Authorization": f"Bearer {token}"} if token else {}
