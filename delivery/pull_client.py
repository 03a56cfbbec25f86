"""A client of the gateway's read API: fetch, consumer groups, commits (httpx, synchronous).

Used by ``logbroker read``, the mirror and the tests; reads use the binary framing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from delivery.consumer_group import validate_group
from delivery.envelope_view import EnvelopeView, NotAnEnvelope, view
from delivery.filters import MessageFilter
from delivery.framing import (
    BINARY_MEDIA_TYPE,
    BinarySection,
    decode_binary_stream,
    not_envelopes_of,
)
from delivery.gateway_retry import gateway_urls, retry_after_given
from delivery.installations import HEALTH_PATH, OneInstallation, ask_every_gateway
from delivery.partition_reader import NotEnvelope
from log_store.errors import BadRequest, CorruptData, LogbrokerError
from session_dedup.chunk_codecs import CorruptChunk, decompress


def _part(value: str) -> str:
    """``value`` as one path segment: a ``?`` or ``#`` in it cannot end the path."""
    return quote(value, safe="")


def _group(name: str) -> str:
    """A group name as a path segment; refused here (BadRequest) if the gateway would refuse
    it, since a gateway decodes ``%2F`` back into ``/`` before it routes."""
    return _part(validate_group(name))


_log = logging.getLogger("delivery")

GONE_ERRORS = ("unknown_topic", "unknown_partition")
"""The errors that mean a topic (or a partition) is not there: deleted, maybe made again."""

WAITING_LIMITS = ("max_waiting_positions", "max_waiting_positions_per_token")
"""The limits of a gateway worker's long-polls (429 ``limit_reached``): a fetch refused for
one of them is asked again without waiting (see :meth:`PullClient.fetch_sections`)."""
_WAITING_RETRY_S = 1.0
"""How long a fetch refused for its wait waits before it asks again without waiting, if the
gateway does not say (``Retry-After``)."""


class RequestRefused(BadRequest):
    """The gateway answered 4xx: the request is wrong and retrying it will not help."""

    def __init__(
        self,
        status: int,
        error: str,
        reason: str,
        body: dict[str, Any],
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{reason} ({status} {error})")
        self.status = status
        self.error = error
        self.reason = reason
        self.body = body
        self.retry_after_s = retry_after_s
        """The answer's ``Retry-After`` in seconds, if it had one."""


class GatewayUnavailable(LogbrokerError):
    """The gateway could not be reached or answered 5xx: try again later."""


@dataclass(frozen=True, slots=True)
class ReadMessage:
    topic: str
    partition: int
    offset: int
    envelope: EnvelopeView

    def text_data(self) -> bytes:
        """The data with its codec undone (gzip/zstd), as the source wrote it.

        Raises :class:`CorruptChunk` naming the message (topic, partition, offset) if the data
        does not decompress: a chunk written before gateways checked codecs, or mirrored.
        """
        try:
            return decompress(self.envelope.codec, self.envelope.data)
        except CorruptChunk as exc:
            raise type(exc)(f"{self.topic}/{self.partition} offset {self.offset}: {exc}") from exc

    def text_view(self) -> bytes | memoryview:
        """``text_data`` without copying raw data out of the stored value: a view of it."""
        env = self.envelope
        if env.codec == "raw":
            return memoryview(env.value)[env.data_start :]
        return self.text_data()


@dataclass(frozen=True)
class FetchedPartition:
    """One partition of a fetch.  ``not_envelopes``: the records up to ``next_offset`` that
    are not envelopes, left out of ``messages`` (the gateway's report, and any value it sent
    that does not decode), in offset order; a reader that moves on moves past them."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    next_offset: int
    messages: list[ReadMessage]
    not_envelopes: list[NotEnvelope] = field(default_factory=list)
    corrupt: CorruptData | None = None
    """Set when the partition cannot be read past ``next_offset``: the batch there fails its
    checksum on the gateway (no messages then; the other partitions are answered)."""
    gone: str | None = None
    """The gateway's reason, set when the partition is not there: its topic was deleted, or
    made again with fewer partitions (no messages then; the other partitions are answered).
    A gateway from before it answered partitions alone refuses the whole fetch instead."""
    topic_id: str | None = None
    """The identity of the topic the answer is of (None: a gateway from before answers named
    it, or the partition is not there)."""
    recreated: str | None = None
    """The gateway's reason, set when the fetch named the partition's offset with a
    ``topic_id`` the topic no longer has: it was deleted and made again (no messages then;
    ``topic_id`` is the new topic's and ``next_offset`` where it starts)."""


def corrupt_of(meta: dict[str, Any]) -> CorruptData | None:
    """The damage a fetch answer's section reports, if any (see delivery/framing.py)."""
    error = meta.get("error")
    if not isinstance(error, dict) or error.get("error") != "corrupt_data":
        return None
    return CorruptData(
        str(error.get("reason", "corrupt data")),
        int(error.get("offset", meta["next_offset"])),
        int(meta["start_offset"]),
        int(meta["end_offset"]),
        str(meta["topic"]),
        int(meta["partition"]),
    )


def gone_of(meta: dict[str, Any]) -> str | None:
    """Why a fetch answer's section has no partition behind it (its topic deleted, or made
    again with fewer partitions), if that is what it reports."""
    error = meta.get("error")
    if not isinstance(error, dict) or error.get("error") not in GONE_ERRORS:
        return None
    return str(error.get("reason", error["error"]))


def recreated_of(meta: dict[str, Any]) -> str | None:
    """Why a fetch answer's section is of a topic made again (the fetch named the old topic's
    id), if that is what it reports."""
    error = meta.get("error")
    if not isinstance(error, dict) or error.get("error") != "topic_recreated":
        return None
    return str(error.get("reason", error["error"]))


def _refused_topic_ids(exc: RequestRefused) -> bool:
    """Whether a fetch was refused for naming ``topic_id`` in its positions, a field gateways
    from before reads named topic identities do not know."""
    return (
        exc.status == 400
        and exc.error == "bad_request"
        and exc.reason.startswith("unknown fields of a partition: topic_id")
    )


def _retry_after(response: httpx.Response) -> float | None:
    """A ``Retry-After`` given in seconds (0-60), if the response has one.

    Not :func:`delivery.gateway_retry.retry_after_s`: that one caps at 30 s and says 0 for
    none, while :attr:`RequestRefused.retry_after_s` tells none (None) from 0, keeps 30-60 s
    as given (a long-poll's 429 waits that long, up to its ``wait_ms``) and ignores more than
    60 s (the 429 wait is then the usual second, not 30 s)."""
    seconds = retry_after_given(response)
    return seconds if seconds is not None and seconds <= 60 else None


def _positions(
    positions: Iterable[tuple[str, int, int]], topic_ids: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    """(topic, partition, offset) as the API's position objects, each naming its topic's id
    where ``topic_ids`` (topic -> id) has one."""
    ids = topic_ids or {}
    named = []
    for topic, partition, offset in positions:
        position: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
        if topic in ids:
            position["topic_id"] = ids[topic]
        named.append(position)
    return named


class PullClient:
    """The read API of one installation's gateways: ``base_url`` is ``URL[,URL...]``.

    Requests go to one gateway; a gateway that cannot be reached or answers 5xx raises
    :class:`GatewayUnavailable` and the next request goes to the next one.  On Kafka every
    gateway serves every group member, so a member whose gateway died heartbeats and commits
    through another before its session ends, instead of being dropped and its uncommitted
    messages read again by another member.

    Each gateway is asked which installation it belongs to (``/healthz``) before its first
    request and again after it failed (a URL may reach another gateway then, of another
    installation if a load balancer or a name moved); one that names another installation
    than the gateways asked before, or than the same URL named before, raises
    :class:`MixedInstallations` and is sent nothing else.  :meth:`ask_every_gateway` asks
    them all at once, for a command to refuse a wrong URL at its start."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._clients = [
            httpx.Client(
                base_url=url,
                headers=headers,
                timeout=httpx.Timeout(timeout_s),
                # plain HTTP needs no CA certificates: loading them is a tenth of a reader's start
                verify=not url.startswith("http://"),
            )
            for url in gateway_urls(base_url) or (base_url,)
        ]
        self._current = 0
        self._timeout_s = timeout_s
        self._installation = OneInstallation(
            "positions in one log are not positions in another: a reader going on there "
            "would skip or repeat data"
        )
        self._asked = [False] * len(self._clients)
        """Whether each URL was asked which installation it belongs to since it last failed."""
        self._without_ids = [False] * len(self._clients)
        """Whether each URL refused a position's ``topic_id`` (a gateway from before reads
        named topic identities) since it last failed: its fetches name none."""
        self._said_waiting_limit = False

    @property
    def _http(self) -> httpx.Client:
        return self._clients[self._current]

    @property
    def url(self) -> str:
        """The gateway the next request goes to."""
        return str(self._http.base_url).rstrip("/")

    def close(self) -> None:
        for client in self._clients:
            client.close()

    def ask_every_gateway(self) -> None:
        """With several gateways, ask each its installation now, at once (see
        :func:`delivery.installations.ask_every_gateway`): raises :class:`MixedInstallations`
        if two name different ones."""
        if len(self._clients) < 2:
            return
        gateways = [(str(c.base_url).rstrip("/"), c) for c in self._clients]
        checked = ask_every_gateway(self._installation, gateways)
        self._asked = [asked or now for asked, now in zip(self._asked, checked, strict=True)]

    def _unavailable(self, message: str) -> GatewayUnavailable:
        """``message`` as the failure of the gateway asked; the next request asks the next."""
        self._asked[self._current] = False  # asked again when it is used again
        self._without_ids[self._current] = False  # maybe another gateway, maybe upgraded
        if len(self._clients) > 1:
            message = f"{self.url}: {message}"
            self._current = (self._current + 1) % len(self._clients)
        return GatewayUnavailable(message)

    def _check_installation(self) -> None:
        """Before the first request to a gateway, and the first after it failed:
        :class:`MixedInstallations` if it belongs to another installation than the gateways
        asked before (see :class:`~delivery.installations.OneInstallation`)."""
        if self._asked[self._current]:
            return
        try:
            response = self._http.get(HEALTH_PATH)
        except httpx.HTTPError as exc:
            raise self._unavailable(f"GET /healthz: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise self._unavailable(f"GET /healthz: gateway answered {response.status_code}")
        failure = self._installation.check(self.url, response, several=len(self._clients) > 1)
        if failure is not None:
            raise self._unavailable(failure)
        self._asked[self._current] = True

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        self._check_installation()
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        return self._checked(method, path, response)

    def _checked(self, method: str, path: str, response: httpx.Response) -> httpx.Response:
        """``response`` if it is a success; raises what its 4xx or 5xx means otherwise."""
        if response.status_code == 500 and response.headers.get("content-type", "").startswith(
            "application/json"
        ):
            body = response.json()
            if isinstance(body, dict) and body.get("error") == "corrupt_data":
                # not an outage: damaged data on the gateway, the same answer on every retry
                raise CorruptData(
                    str(body.get("reason")),
                    int(body.get("offset", -1)),
                    -1,
                    -1,
                    str(body.get("topic", "")),
                    int(body.get("partition", -1)),
                )
        if response.status_code >= 500:
            raise self._unavailable(
                f"{method} {path}: gateway answered {response.status_code}: {response.text[:200]}"
            )
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {}
            raise RequestRefused(
                response.status_code,
                str(body.get("error", "http_error")),
                str(body.get("reason", response.text[:200])),
                body,
                _retry_after(response),
            )
        return response

    def _json(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        if body is not None:
            kwargs["content"] = orjson.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json"}
        return self._request(method, path, **kwargs).json()

    # -- topics ---------------------------------------------------------------------------------
    def list_topics(self, prefix: str = "", *, include_audit: bool = False) -> list[str]:
        params = {"prefix": prefix} if prefix else {}
        if include_audit:
            params["include_audit"] = "true"
        body = self._json("GET", "/v1/topics", params=params or None)
        return [t["name"] for t in body["topics"]]

    def describe(self, topic: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/v1/topics/{_part(topic)}")
        return result

    # -- reads ----------------------------------------------------------------------------------
    def fetch_sections(
        self,
        positions: Sequence[tuple[str, int, int]],
        *,
        max_bytes: int = 4 * 1024 * 1024,
        wait_ms: int = 0,
        message_filter: MessageFilter | None = None,
        raw: bool = False,
        topic_ids: Mapping[str, str] | None = None,
    ) -> list[BinarySection]:
        """The binary answer of ``/v1/fetch`` as sections of (offset, stored value).

        ``topic_ids`` (topic -> the id an earlier answer or ``describe`` named) makes each
        position of those topics name the identity its offset belongs to: a topic deleted and
        made again since is answered as such (``topic_recreated``), not read from an offset
        of the old topic.

        A gateway whose long-polls are at their bound (429 for ``max_waiting_positions`` or
        its per-token share) has read nothing for this fetch: it is asked again without
        waiting after ``Retry-After`` (at most ``wait_ms``), so the reader polls about once a
        second meanwhile instead of failing (or asking again at once, for ever)."""
        if topic_ids and self._without_ids[self._current]:
            topic_ids = None
        try:
            try:
                return self._fetch_sections(
                    positions, max_bytes, wait_ms, message_filter, raw, topic_ids
                )
            except RequestRefused as exc:
                if not topic_ids or not _refused_topic_ids(exc):
                    raise
                # A gateway from before reads named topic identities: read as before (its
                # answers name none, and a reader learns of a topic made again from its look
                # at the topics).
                _log.warning(
                    "%s takes no topic identity in reads (an older gateway): a topic deleted "
                    "and made again is noticed only by the next look at the topics",
                    self.url,
                )
                self._without_ids[self._current] = True
                topic_ids = None
                return self._fetch_sections(
                    positions, max_bytes, wait_ms, message_filter, raw, None
                )
        except RequestRefused as exc:
            if exc.status != 429 or exc.body.get("limit") not in WAITING_LIMITS or not wait_ms:
                raise
            if not self._said_waiting_limit:
                self._said_waiting_limit = True
                _log.warning("%s; reading without waiting meanwhile", exc.reason)
            time.sleep(min(wait_ms / 1000, exc.retry_after_s or _WAITING_RETRY_S))
            return self._fetch_sections(positions, max_bytes, 0, message_filter, raw, topic_ids)

    def _fetch_sections(
        self,
        positions: Sequence[tuple[str, int, int]],
        max_bytes: int,
        wait_ms: int,
        message_filter: MessageFilter | None,
        raw: bool,
        topic_ids: Mapping[str, str] | None = None,
    ) -> list[BinarySection]:
        self._check_installation()
        named = _positions(positions, topic_ids)
        body: dict[str, Any] = {
            "partitions": named,
            "max_bytes": max_bytes,
            "wait_ms": wait_ms,
            "format": "binary",
            "raw": raw,
        }
        if message_filter is not None and not message_filter.matches_all:
            body["filter"] = message_filter.to_params()
        request = self._http.build_request(
            "POST",
            "/v1/fetch",
            content=orjson.dumps(body),
            headers={"Content-Type": "application/json", "Accept": BINARY_MEDIA_TYPE},
            timeout=self._timeout_s + wait_ms / 1000,
        )
        try:
            response = self._http.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    response.read()
                    self._checked("POST", "/v1/fetch", response)
                # Decoded as it arrives: each value is copied once out of the received
                # chunks, with no whole-answer join (16 MiB of fresh memory per fetch) first.
                return decode_binary_stream(response.iter_bytes())
            finally:
                response.close()
        except httpx.HTTPError as exc:
            raise self._unavailable(f"POST /v1/fetch: {type(exc).__name__}: {exc}") from None

    def fetch(
        self,
        positions: Sequence[tuple[str, int, int]],
        *,
        max_bytes: int = 4 * 1024 * 1024,
        wait_ms: int = 0,
        message_filter: MessageFilter | None = None,
        raw: bool = False,
        topic_ids: Mapping[str, str] | None = None,
    ) -> list[FetchedPartition]:
        """Messages of several partitions, each from its offset; waits up to ``wait_ms``.

        With ``topic_ids`` (see :meth:`fetch_sections`), a partition of a topic made again
        comes back with ``recreated`` set and the new ``topic_id``: start it from its
        ``next_offset`` (the new topic's start), never from the old offset."""
        sections = self.fetch_sections(
            positions,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            message_filter=message_filter,
            raw=raw,
            topic_ids=topic_ids,
        )
        out: list[FetchedPartition] = []
        for section in sections:
            meta = section.meta
            messages = []
            skipped = not_envelopes_of(meta) or []
            for offset, value in section.records:
                try:
                    env = view(value)
                except NotAnEnvelope as exc:
                    skipped.append(NotEnvelope(offset, str(exc)))
                    continue
                messages.append(ReadMessage(meta["topic"], meta["partition"], offset, env))
            out.append(
                FetchedPartition(
                    meta["topic"],
                    meta["partition"],
                    meta["start_offset"],
                    meta["end_offset"],
                    meta["next_offset"],
                    messages,
                    sorted(skipped, key=lambda n: n.offset),
                    corrupt_of(meta),
                    gone_of(meta),
                    meta.get("topic_id"),
                    recreated_of(meta),
                )
            )
        return out

    # -- consumer groups ------------------------------------------------------------------------
    def join(
        self,
        group: str,
        *,
        topics: Sequence[str] = (),
        prefix: str | None = None,
        reset: str = "latest",
        session_timeout_ms: int = 10_000,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "topics": list(topics),
            "reset": reset,
            "session_timeout_ms": session_timeout_ms,
        }
        if prefix is not None:
            body["prefix"] = prefix
        result: dict[str, Any] = self._json("POST", f"/v1/groups/{_group(group)}/members", body)
        return result

    def heartbeat(
        self, group: str, member_id: str, release: Sequence[tuple[str, int]] = ()
    ) -> dict[str, Any]:
        body = {"release": [{"topic": t, "partition": p} for t, p in release]}
        result: dict[str, Any] = self._json(
            "POST", f"/v1/groups/{_group(group)}/members/{_part(member_id)}/heartbeat", body
        )
        return result

    def commit(
        self,
        group: str,
        member_id: str | None,
        offsets: Sequence[tuple[str, int, int]],
        topic_ids: Mapping[str, str] | None = None,
    ) -> None:
        """``topic_ids`` (topic -> id, as assignments name it) lets the gateway refuse offsets
        of an older topic of the same name."""
        body = {"member_id": member_id, "offsets": _positions(offsets, topic_ids)}
        self._json("POST", f"/v1/groups/{_group(group)}/offsets", body)

    def leave(self, group: str, member_id: str) -> None:
        self._json("DELETE", f"/v1/groups/{_group(group)}/members/{_part(member_id)}")

    def describe_group(self, group: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/v1/groups/{_group(group)}")
        return result
