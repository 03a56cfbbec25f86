"""Where a publisher writes: a gateway over HTTP, or a log store in the same process."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import httpx
import orjson

from audit.publisher import AuditPublisher, interval_from_env
from audit.records import AUDIT_LOG_TYPE
from audit.windows import WindowCounts
from log_store.errors import LogbrokerError
from session_dedup.exactly_once import WRITTEN, ChunkBatch, ExactlyOnceWriter
from session_dedup.source import source_meta

NDJSON_MEDIA_TYPE = "application/x-ndjson"


class AuditWriteFailed(LogbrokerError):
    """A gateway refused or did not answer an audit write."""


class AuditForbidden(AuditWriteFailed, PermissionError):
    """The token may not write the audit log type: publishing stops (logged once)."""


class HttpAuditSink:
    """Writes audit chunks with ``POST /v1/write`` (NDJSON) to a gateway."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        auth_headers: Callable[[], dict[str, str]] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._auth_headers = auth_headers
        self._client = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout_s)
        )
        self._server = socket.gethostname()

    def write(self, source_id: str, seqno: int, data: bytes) -> tuple[bool, int]:
        line = {
            "log_type": AUDIT_LOG_TYPE,
            "source_id": source_id,
            "server": self._server,
            "file": "audit",
            "codec": "raw",
            "seqno": seqno,
            "create_time": int(time.time() * 1000),
            "data": data.decode("utf-8"),
        }
        try:
            response = self._client.post(
                "/v1/write",
                content=orjson.dumps(line) + b"\n",
                headers={
                    "Content-Type": NDJSON_MEDIA_TYPE,
                    **(self._auth_headers() if self._auth_headers else {}),
                },
            )
        except httpx.HTTPError as exc:
            raise AuditWriteFailed(f"audit write: {type(exc).__name__}: {exc}") from None
        if response.status_code in (401, 403):
            raise AuditForbidden(f"audit write answered {response.status_code}: {response.text}")
        if response.status_code != 200:
            raise AuditWriteFailed(f"audit write answered {response.status_code}: {response.text}")
        result = response.json()["results"][0]
        if result.get("error") == "forbidden":
            raise AuditForbidden(f"audit write refused: {result.get('reason', result)}")
        if "error" in result:
            raise AuditWriteFailed(f"audit write refused: {result.get('reason', result)}")
        acks = result.get("acks", [])
        written = any(a.get("status") == "written" for a in acks)
        return written, int(result.get("last_seqno", 0))

    def close(self) -> None:
        self._client.close()


class StoreAuditSink:
    """Writes audit chunks through an :class:`ExactlyOnceWriter` (gateway, local loader)."""

    def __init__(self, writer: ExactlyOnceWriter) -> None:
        self._writer = writer
        self._server = socket.gethostname()

    def write(self, source_id: str, seqno: int, data: bytes) -> tuple[bool, int]:
        meta = source_meta(
            log_type=AUDIT_LOG_TYPE,
            source_id=source_id,
            server=self._server,
            file="audit",
            codec="raw",
        )
        outcome = self._writer.write(meta, ChunkBatch([seqno], [int(time.time() * 1000)], [data]))
        if outcome.refused is not None:
            raise outcome.refused
        return outcome.written[0] == WRITTEN, outcome.last_seqno


def incarnation_id() -> str:
    """This process's instance name: counts that start at zero with the process are its own
    key, so a restarted tier adds to its predecessor's totals instead of replacing them."""
    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"


def start_http_publisher(
    tier: str,
    counts: WindowCounts,
    url: str,
    *,
    token: str | None = None,
    auth_headers: Callable[[], dict[str, str]] | None = None,
    instance: str | None = None,
    before_publish: Callable[[], None] | None = None,
) -> AuditPublisher:
    """A started publisher of ``counts`` writing to the gateway at ``url``."""
    sink = HttpAuditSink(url, token=token, auth_headers=auth_headers)
    return AuditPublisher(
        tier,
        instance or incarnation_id(),
        counts,
        sink,
        interval_s=interval_from_env(),
        before_publish=before_publish,
    ).start()
