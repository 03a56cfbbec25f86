"""Legacy pieces staged on another gateway: ``/commit_request`` behind any load balancer.

``/store`` stages its data on the disk of the gateway that received it (see
:class:`delivery.legacy_txn.LegacyStaging`).  With several gateways on Kafka, an old client's
``/commit_request`` may reach another one; that gateway asks its peers for the piece
(``GET /v1/internal/legacy-staging/{store_id}``, the ``peer_token`` as bearer), has the holder
bind it to the request's transaction id (``POST .../{store_id}/claim?txn_id=X``, answered with
the id it is bound to, under the holder's lock: the one place that decides, whichever gateways
the requests reach), writes it to the log itself, and has the holder keep it as written
(``POST .../{store_id}/written``), so a repeated request, wherever it lands, is answered the
same and the data is never written under a second transaction id.

The peers are the gateways the owners' map names (``__logbroker-owners``): every gateway of
the group that owns a partition, and every one it named within the staging's maximum age (a
gateway that died is dropped from the map when its partitions move, but what it staged is
still on its disk).  When a peer cannot be reached and no other has the piece, the answer is
503 (the holder may be restarting; the client retries), not 404.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import quote

import httpx

from delivery.legacy_txn import StagedData, UnknownStagedData, decode_staged
from log_store.errors import StoreUnavailable

STAGING_PATH = "/v1/internal/legacy-staging"
_log = logging.getLogger(__name__)


class StagingPeers:
    """Finds a staged piece on the other gateways and marks it written there."""

    def __init__(
        self,
        peer_urls: Callable[[], set[str]],
        token: str | None,
        *,
        remember_s: float,
        timeout_s: float = 10.0,
    ) -> None:
        self._peer_urls = peer_urls
        self._remember_s = remember_s
        self._seen: dict[str, float] = {}
        """Peer URL -> when the owners' map last named it (monotonic)."""
        self._lock = threading.Lock()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=2.0))

    def close(self) -> None:
        self._client.close()

    def find(self, store_id: str) -> tuple[StagedData, str]:
        """The piece and the URL of the gateway that holds it.

        Raises :class:`UnknownStagedData` when every peer answered that it has none, and
        ``StoreUnavailable`` when one could not be asked (it may hold the piece)."""
        unreachable = []
        for url in self.note_peers():
            try:
                response = self._client.get(url + _path(store_id))
            except httpx.HTTPError as exc:
                unreachable.append(f"{url}: {type(exc).__name__}")
                continue
            if response.status_code == 200:
                return decode_staged(store_id, response.content), url
            if response.status_code != 404:
                unreachable.append(f"{url}: HTTP {response.status_code}")
        if unreachable:
            raise StoreUnavailable(
                f"store_id {store_id} is not staged here, and gateways that may hold it did "
                f"not answer ({'; '.join(unreachable)}); retry later"
            )
        raise UnknownStagedData(
            f"nothing is staged under store_id {store_id} on any gateway (never stored, or expired)"
        )

    def note_peers(self) -> list[str]:
        """Look at the owners' map (the gateway does every few seconds, so that a peer that
        dies is remembered): the peers named now, and those named within ``remember_s``."""
        now = time.monotonic()
        named = self._peer_urls()
        with self._lock:
            for url in named:
                self._seen[url] = now
            for url, seen in list(self._seen.items()):
                if now - seen > self._remember_s:
                    del self._seen[url]
            return sorted(self._seen)

    def claim(self, url: str, store_id: str, txn_id: str) -> tuple[str | None, bool]:
        """Bind the piece held at ``url`` to ``txn_id`` there (see ``LegacyStaging.claim``):
        the transaction id it is bound to, and whether it is written.

        Raises :class:`UnknownStagedData` if the holder no longer has it, ``StoreUnavailable``
        if the holder cannot answer: writing without the binding could write it twice."""
        try:
            response = self._client.post(
                url + _path(store_id) + "/claim", params={"txn_id": txn_id}
            )
        except httpx.HTTPError as exc:
            raise StoreUnavailable(
                f"store_id {store_id} is staged at {url}, which did not answer "
                f"({type(exc).__name__}); retry later"
            ) from None
        if response.status_code == 404 and _error(response) == "unknown_store_id":
            raise UnknownStagedData(
                f"nothing is staged under store_id {store_id} any more (expired)"
            )
        if response.status_code != 200:
            raise StoreUnavailable(
                f"store_id {store_id} is staged at {url}, which answered HTTP "
                f"{response.status_code} to binding it to a transaction; retry later"
            )
        body = response.json()
        bound = body.get("txn_id")
        return (None if bound is None else str(bound)), bool(body.get("written"))

    def release(self, url: str, store_id: str, txn_id: str) -> None:
        """Best effort: a binding left behind is found dead and dropped by the next request
        under another id (the transaction it names holds other data)."""
        try:
            response = self._client.post(
                url + _path(store_id) + "/release", params={"txn_id": txn_id}
            )
        except httpx.HTTPError as exc:
            _log.warning("cannot release %s at %s: %s", store_id, url, exc)
            return
        if response.status_code != 200:
            _log.warning("cannot release %s at %s: HTTP %d", store_id, url, response.status_code)

    def mark_written(self, url: str, store_id: str) -> None:
        """Best effort: if the holder cannot be told, the transaction's own record still makes
        a repeat with the same ``txn_id`` an answer, and the binding refuses any other id."""
        try:
            response = self._client.post(url + _path(store_id) + "/written")
        except httpx.HTTPError as exc:
            _log.warning("cannot mark %s written at %s: %s", store_id, url, exc)
            return
        if response.status_code != 200:
            _log.warning(
                "cannot mark %s written at %s: HTTP %d", store_id, url, response.status_code
            )


def _error(response: httpx.Response) -> str | None:
    """The error code of an answer of ours; None for any other (a gateway from before a
    route existed answers 404 with another code)."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, str) else None


def _path(store_id: str) -> str:
    return f"{STAGING_PATH}/{quote(store_id, safe='')}"
