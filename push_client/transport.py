"""Talking to the gateways: retries with exponential backoff and jitter, failover across URLs.

A request is retried until it gets a 200 or the client stops: a transport error, a timeout, a
5xx or a 503 means nothing is known to be acknowledged, and resending is safe because the
gateway answers chunks it already holds with ``duplicate``.  A 4xx means the gateway refused the
request as a whole (nothing written); it is retried too, slowly, because dropping the data would
be silent loss and the cause (a token, a limit) is usually fixed by an operator.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from log_store.errors import LogbrokerError
from push_client.wire import CONTENT_TYPE

log = logging.getLogger("logbroker.push")

_REJECTED_BACKOFF_S = 10.0


class Stopped(LogbrokerError):
    """The client is stopping; the request was abandoned without an answer."""


@dataclass
class TransportStats:
    """Counters the metrics endpoint exports; updated from sender threads."""

    requests: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    failovers: int = 0
    last_error: str = ""
    last_error_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, outcome: str) -> None:
        with self.lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def error(self, text: str) -> None:
        with self.lock:
            self.retries += 1
            self.last_error = text
            self.last_error_at = time.time()


class Backoff:
    """Exponential backoff with full jitter: ``uniform(0, min(cap, base * 2**attempt))``."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next_delay(self, at_least_s: float = 0.0) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.attempt))
        self.attempt += 1
        return max(at_least_s, random.uniform(ceiling / 2, ceiling))


class GatewayClient:
    """POSTs to the first healthy gateway of a list; thread-safe."""

    def __init__(
        self,
        servers: tuple[str, ...],
        *,
        token: str | None,
        stop: threading.Event,
        max_backoff_s: float = 5.0,
        pool_size: int = 8,
    ) -> None:
        self.servers = servers
        self._preferred = 0
        self._lock = threading.Lock()
        self._stop = stop
        self.stop_deadline = 0.0
        self.max_backoff_s = max_backoff_s
        self.stats = TransportStats()
        headers = {"User-Agent": "logbroker-push/1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(60.0, connect=2.0),
            limits=httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size),
        )

    def close(self) -> None:
        self._http.close()

    def _server(self, attempt_offset: int) -> tuple[int, str]:
        with self._lock:
            index = (self._preferred + attempt_offset) % len(self.servers)
        return index, self.servers[index]

    def _prefer(self, index: int) -> None:
        with self._lock:
            if self._preferred != index:
                self.stats.failovers += 1
                log.info("now sending to %s", self.servers[index])
            self._preferred = index

    def post(
        self, path: str, body: bytes, content_type: str, *, flush: bool = False
    ) -> dict[str, Any]:
        """POST until a 200 answers; return its JSON.  Raises :class:`Stopped` when stopping.

        With ``flush``, a request is still retried after stopping began, until
        ``stop_deadline`` (monotonic): a stopping client tries to get its in-flight chunks
        acknowledged.  Other requests stop at once.
        """
        backoff = Backoff(cap_s=self.max_backoff_s)
        offset = 0
        while True:
            if self._stop.is_set() and (not flush or time.monotonic() >= self.stop_deadline):
                raise Stopped("stopping before the gateway answered")
            index, server = self._server(offset)
            wait_at_least = 0.0
            try:
                response = self._http.post(
                    server + path, content=body, headers={"Content-Type": content_type}
                )
            except httpx.HTTPError as exc:
                outcome = f"{server}: {type(exc).__name__}: {exc}"
                self.stats.count("transport_error")
            else:
                if response.status_code == 200:
                    self.stats.count("ok")
                    self._prefer(index)
                    parsed: dict[str, Any] = orjson.loads(response.content)
                    return parsed
                outcome = f"{server}: HTTP {response.status_code}: {response.text[:300]}"
                if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                    self.stats.count("rejected")
                    wait_at_least = _REJECTED_BACKOFF_S
                else:
                    self.stats.count(f"http_{response.status_code}")
                    retry_after = response.headers.get("Retry-After", "")
                    if retry_after.replace(".", "", 1).isdigit():
                        wait_at_least = min(float(retry_after), 30.0)
            self.stats.error(outcome)
            if wait_at_least == _REJECTED_BACKOFF_S:
                log.error("gateway refused the request (retrying in 10 s): %s", outcome)
            else:
                log.warning("request failed, retrying: %s", outcome)
            # Move on to the next gateway at once; back off once every gateway was tried.
            offset += 1
            if offset % len(self.servers) == 0 or wait_at_least:
                self._sleep(backoff.next_delay(wait_at_least), flush)

    def _sleep(self, delay_s: float, flush: bool) -> None:
        if not self._stop.is_set():
            self._stop.wait(delay_s)
            return
        remaining = self.stop_deadline - time.monotonic() if flush else 0.0
        if remaining <= 0:
            raise Stopped("stopping before the gateway answered")
        time.sleep(min(delay_s, remaining))

    def write(self, body: bytes) -> dict[str, Any]:
        return self.post("/v1/write", body, CONTENT_TYPE, flush=True)

    def open_sessions(self, sessions: list[dict[str, str]]) -> list[dict[str, Any]]:
        """The batch form of ``POST /v1/sessions``, fencing: answers in the request's order.

        Each session starts a new epoch for its source, so that writes of an earlier
        incarnation of this client (killed with a request in flight) are refused from now on.
        """
        fenced = [{**session, "fence": True} for session in sessions]
        answer = self.post("/v1/sessions", orjson.dumps({"sessions": fenced}), "application/json")
        results = answer.get("sessions")
        if not isinstance(results, list) or len(results) != len(sessions):
            raise LogbrokerError(f"gateway answered sessions with a bad body: {answer!r:.300}")
        return results
