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

from push_client.backoff import CLOSE_WAIT_S
from push_client.token import BearerToken
from push_client.transport import failure_text

log = logging.getLogger("logbroker.push")

REPORT_INTERVAL_S = 5.0
_TIMEOUT_S = 5.0
MAX_FILES_REPORTED = 500
"""The gateway accepts at most this many files per report; the most behind are sent."""


def report_rows(rows: Sequence[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The files of a status document (and its unreadable ones) as the gateway takes them,
    the most behind first.

    The gateway keeps only these fields, so what is wrong with a file goes into its phase:
    ``unreadable: Permission denied`` (its size, when it cannot be looked at, as its acked
    position: nothing known to be behind), ``active; cannot stat its path: ...``, and that
    error's symbolic errno into ``errno`` (``EACCES``; None when nothing is wrong, or the
    error has none): the message differs between hosts and languages, the name does not.
    """
    out = []
    for row in rows:
        acked = int(row["acked"])
        size = acked if row["size"] is None else int(row["size"])
        lag_bytes = max(0, size - acked)
        since = row.get("pending_since")
        lag_s = max(0.0, now - since) if lag_bytes and since is not None else 0.0
        phase, errno = row["phase"], row.get("errno")
        if row.get("error"):
            phase = f"{phase}: {row['error']}"
        if row.get("path_error"):
            phase = f"{phase}; cannot stat its path: {row['path_error']['error']}"
            errno = row["path_error"]["errno"]
        out.append(
            {
                "path": row["path"],
                "log_type": row["log_type"],
                "size": size,
                "acked": acked,
                "lag_bytes": lag_bytes,
                "lag_s": round(lag_s, 3),
                "phase": phase,
                "errno": errno or None,
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
        self._failing = False
        """The last report did not get through (logged once per outage)."""
        self._failed_at = ""
        """The gateway the first failed report of the outage went to."""
        self._refusals_logged: set[int] = set()
        """The statuses of lasting refusals (4xx) logged so far: each is logged once."""
        self._http = httpx.Client(
            headers={"User-Agent": "logbroker-push/1"}, timeout=httpx.Timeout(_TIMEOUT_S)
        )
        self._thread = threading.Thread(target=self._run, name="push-lag-report", daemon=True)
        self._thread.start()

    def offer(self, server: str, rows: list[dict[str, Any]]) -> None:
        """The rows the next report sends (cheap: called on every status update)."""
        with self._lock:
            self._latest = (server, rows)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop reporting, waiting at most ``wait_s`` for a report in flight.  A report still
        waiting for a gateway that hangs is left to its (daemon) thread: it is only shown,
        never retried, and a stopping client waited up to its 5 s timeout for it, beyond
        ``shutdown_timeout_s``."""
        self._stop.set()
        self._thread.join(wait_s)
        if not self._thread.is_alive():
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
            if not self._stop.is_set():
                self._failed(server, failure_text(exc, server))
            return
        if self._stop.is_set():
            return  # closed while it waited: a stopped client logs nothing more of it
        status = response.status_code
        if status == 200:
            if self._failing and server == self._failed_at:
                log.info("lag reports reach %s again", server)
            elif self._failing:
                # after a failover: "again" named a gateway that had never been reached
                log.info("lag reports reach %s (they failed at %s)", server, self._failed_at)
            self._failing = False
            return
        if status >= 500 or status in (408, 429):
            self._failed(server, f"HTTP {status}")
            return
        if status not in self._refusals_logged:
            # A lasting answer (an older gateway: 404; a token without write permission: 403)
            # that the next reports will get too: said once per status, however many come.
            self._refusals_logged.add(status)
            log.warning(
                "the gateway %s refuses the lag report (HTTP %d%s); the dashboard does not "
                "show this client's lag while it does",
                server,
                status,
                _reason(response),
            )

    def _failed(self, server: str, what: str) -> None:
        """A report that did not get through (gateway down, overloaded, restarting): the next
        one goes in ``interval_s``; said once until a report gets through again."""
        if self._failing:
            log.debug("lag report to %s failed: %s", server, what)
            return
        self._failing = True
        self._failed_at = server
        log.info(
            "lag report to %s failed (%s); reports go on every %g s", server, what, self._interval_s
        )


def _reason(response: httpx.Response) -> str:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and body.get("reason"):
        return f": {str(body['reason'])[:200]}"
    text = response.text.strip()[:200]
    return f": {text}" if text else ""
