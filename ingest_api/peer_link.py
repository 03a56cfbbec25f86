"""How a gateway on Kafka calls the owner of a partition: the client of ``peer_api``.

A plain blocking HTTP client (the store calls it from its own threads), one connection pool
for every peer, the peer token as bearer.  Answers are turned back into the errors the
store acts on: ``NotOwner`` (look for the new owner), ``PeerUnreachable`` (wait for a new
owner to be announced; ``PeerRefused`` when no connection was made (refused, no route, or
no answer to the attempt: no gateway listens there, or its host is gone), and the store soon
takes the owner for dead), ``UnknownTopic``,
``StoreUnavailable``; and the owner's refusal of one transaction of a batch into the error
the owner raised (``RecordTooLarge``, ...: see ``remote_transaction.owner_error_of``), which
the client is answered with, not retried.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from log_store.errors import LogbrokerError, StoreUnavailable, UnknownTopic
from log_store.kafka.remote_transaction import (
    CommitAnswer,
    ForwardedTransaction,
    NotOwner,
    PeerRefused,
    PeerUnreachable,
    decode_outcomes,
    decode_values,
    encode_batch,
)

_log = logging.getLogger("ingest_api.peers")

BATCH_MEDIA_TYPE = "application/x-logbroker-transactions"
_REFUSED_LOG_EVERY_S = 60.0
"""A peer that refuses this gateway's peer token is logged at most this often (per peer)."""
BATCH_PATH = "/v1/internal/transactions"


_NO_ROUTE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)
_CONNECT_TIMEOUT_S = 2.0


def _refused(exc: httpx.HTTPError) -> bool:
    """Whether no connection was made, so nothing was sent: connecting was refused (or reset
    while connecting), there is no route to the host, or the host did not answer the
    connection attempt within :data:`_CONNECT_TIMEOUT_S` (a host that is down, or drops
    packets: a SYN unanswered for that long on a gateways' network is one)."""
    if isinstance(exc, httpx.ConnectTimeout):
        return True
    if not isinstance(exc, httpx.ConnectError):
        return False
    cause: BaseException | None = exc
    for _ in range(8):  # httpx's error, httpcore's, then the socket's
        if cause is None:
            return False
        if isinstance(cause, ConnectionRefusedError | ConnectionResetError):
            return True
        if isinstance(cause, OSError) and cause.errno in _NO_ROUTE:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def partition_path(topic: str, partition: int) -> str:
    return f"/v1/internal/partitions/{quote(topic, safe='')}/{partition}"


class HttpPeerLink:
    """``log_store.kafka.remote_transaction.PeerLink`` over HTTP."""

    def __init__(self, token: str | None, *, timeout_s: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s + 5.0, connect=_CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )
        self._refusals_logged: dict[str, float] = {}
        self._lock = threading.Lock()

    def _token_refused(self, url: str, status: int) -> str:
        """The reason of a peer's 401/403, logged as an error (a configuration mistake that
        does not heal by waiting), at most once a minute per peer."""
        reason = (
            f"{url} refused this gateway's peer token ({status}): every gateway of an "
            "installation needs the same peer_token"
        )
        now = time.monotonic()
        with self._lock:
            last = self._refusals_logged.get(url)
            if last is None or now - last >= _REFUSED_LOG_EVERY_S:
                self._refusals_logged[url] = now
                _log.error("%s; writes forwarded to it fail until they agree", reason)
        return reason

    def _post(self, url: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.post(url + path, **kwargs)
        except httpx.HTTPError as exc:
            unreachable = PeerRefused if _refused(exc) else PeerUnreachable
            raise unreachable(f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 200:
            return orjson.loads(response.content)
        try:
            error = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            error = {"error": "http", "reason": response.text[:200]}
        kind = error.get("error")
        reason = f"{url}: {error.get('reason', '')}"
        if kind == "not_owner":
            raise NotOwner(reason)
        if kind == "unknown_topic":
            raise UnknownTopic(reason)
        if response.status_code in (401, 403):
            raise PeerUnreachable(self._token_refused(url, response.status_code))
        if response.status_code == 503:
            raise StoreUnavailable(reason)
        raise PeerUnreachable(f"{url} answered {response.status_code}: {reason}")

    def read_state(
        self, url: str, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]:
        doc = self._post(
            url, partition_path(topic, partition) + "/state", json={"keys": list(keys)}
        )
        return decode_values(doc)

    def commit_many(
        self, url: str, items: Sequence[ForwardedTransaction]
    ) -> list[CommitAnswer | LogbrokerError]:
        doc = self._post(
            url,
            BATCH_PATH,
            content=encode_batch(items),
            headers={"Content-Type": BATCH_MEDIA_TYPE},
        )
        return decode_outcomes(doc, len(items))

    def close(self) -> None:
        self._client.close()
