"""Tells the gateway how far behind each file is: ``POST /v1/clients/status`` every few seconds.

Only the client knows a file's size, so only it knows its lag; the gateway keeps the last
report for its dashboard (``docs/dashboard.md``).  Reports go from their own thread with a
short timeout and are never retried: a lost report is replaced by the next one, and a gateway
that is slow or down never holds the shipping of data.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from push_client.token import BearerToken

log = logging.getLogger("logbroker.push")

REPORT_INTERVAL_S = 5.0
_TIMEOUT_S = 5.0
MAX_FILES_REPORTED = 500
"""The gateway accepts at most this many files per report; the most behind are sent."""


def report_rows(rows: Sequence[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The files of a status document as the gateway takes them, the most behind first."""
    out = []
    for row in rows:
        size, acked = int(row["size"]), int(row["acked"])
        lag_bytes = max(0, size - acked)
        since = row.get("pending_since")
        lag_s = max(0.0, now - since) if lag_bytes and since is not None else 0.0
        out.append(
            {
                "path": row["path"],
                "log_type": row["log_type"],
                "size": size,
                "acked": acked,
                "lag_bytes": lag_bytes,
                "lag_s": round(lag_s, 3),
                "phase": row["phase"],
            }
        )
    out.sort(key=lambda r: (-r["lag_bytes"], r["path"]))
    return out[:MAX_FILES_REPORTED]


class LagReporter:
    """Sends the latest offered rows to the latest offered gateway every ``interval_s``."""

    def __init__(
        self, client: str, token: BearerToken, interval_s: float = REPORT_INTERVAL_S
    ) -> None:
        self.client = client
        self.host = socket.gethostname()
        self._token = token
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._latest: tuple[str, list[dict[str, Any]]] | None = None
        self._stop = threading.Event()
        self._refused_once = False
        self._http = httpx.Client(
            headers={"User-Agent": "logbroker-push/1"}, timeout=httpx.Timeout(_TIMEOUT_S)
        )
        self._thread = threading.Thread(target=self._run, name="push-lag-report", daemon=True)
        self._thread.start()

    def offer(self, server: str, rows: list[dict[str, Any]]) -> None:
        """The rows the next report sends (cheap: called on every status update)."""
        with self._lock:
            self._latest = (server, rows)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_TIMEOUT_S + 1)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with self._lock:
                latest, self._latest = self._latest, None
            if latest is not None:
                self._send(*latest)

    def _send(self, server: str, rows: list[dict[str, Any]]) -> None:
        body = {"client": self.client, "host": self.host, "files": report_rows(rows, time.time())}
        headers = {"Content-Type": "application/json", **self._token.headers()}
        try:
            response = self._http.post(
                server + "/v1/clients/status", content=orjson.dumps(body), headers=headers
            )
        except httpx.HTTPError as exc:
            log.debug("lag report to %s failed: %s", server, exc)
            return
        if response.status_code != 200 and not self._refused_once:
            # an older gateway (404) or a token without write permission (403): say it once
            self._refused_once = True
            log.info(
                "the gateway %s refused the lag report (HTTP %d); the dashboard will not "
                "show this client's lag",
                server,
                response.status_code,
            )
