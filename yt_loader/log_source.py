"""Where the loader reads the log from: the embedded store on disk, or a gateway over HTTP.

Both give the same thing: topics, each partition's offset bounds, and decoded messages read
forward from an offset.  A :class:`SourceSpec` is the small picklable description that Spark
ships to executors; each task opens its own :class:`LogSource` from it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

import httpx

from delivery.framing import decode_binary, not_envelopes_of
from delivery.gateway_retry import GatewayRetry, StillUnavailable, gateway_urls
from delivery.internal_state import is_internal
from delivery.legacy_txn import CommitResolver
from delivery.partition_reader import MAX_MAX_BYTES, PartitionReader
from log_store import open_store
from log_store.errors import BadRequest, OffsetOutOfRange, TopicDeleted, UnknownTopic
from log_store.interface import LogStore
from session_dedup.envelope import Envelope, decode
from yt_loader.errors import BadSourceOptions, SourceUnavailable
from yt_loader.offset_ranges import matching_topics

if TYPE_CHECKING:
    from log_store.kafka import KafkaSettings

log = logging.getLogger("logbroker.load")

DEFAULT_READ_BYTES = 4 * 1024 * 1024
DEFAULT_GATEWAY_RETRY_S = 120.0
"""How long a request through gateways is tried again while every one is unreachable or
answers a passing failure: long enough for a gateway's restart or a Kafka takeover."""
RETRIED_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that say "not now": a gateway starting, stopping or without its store, a load
balancer without a gateway behind it, a limit.  Any other answer is the request's own."""
KAFKA_OPTION_PREFIX = "kafka."
STORE_CATALOG = "catalog.db"


@dataclass(frozen=True, slots=True)
class LogMessage:
    """One message of a partition: its offset and its decoded envelope."""

    offset: int
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class ForeignRecord:
    """A record of a partition that is not an envelope at all (e.g. written to a Kafka topic
    by another producer): the reader decides whether it stops the read or is left out."""

    offset: int
    reason: str


@dataclass(frozen=True)
class PartitionBounds:
    partition: int
    start_offset: int
    end_offset: int
    size_bytes: int

    @property
    def bytes_per_offset(self) -> float:
        count = self.end_offset - self.start_offset
        return self.size_bytes / count if count > 0 else 0.0


@dataclass(frozen=True)
class TopicBounds:
    """A topic's identity and the offsets each partition holds right now."""

    name: str
    topic_id: str
    partitions: list[PartitionBounds] = field(default_factory=list)


@dataclass(frozen=True)
class MessageBatch:
    """Messages from one read, the partition's bounds then, and where the next read starts.

    ``next_offset`` moves past records that give no message (a legacy transaction's data,
    or its marker when the transaction did not commit in time), so it can advance while
    ``messages`` is empty.
    """

    messages: list[LogMessage | ForeignRecord]
    start_offset: int
    end_offset: int
    next_offset: int


class LogSource(Protocol):
    def topic_names(self) -> list[str]: ...

    def topic_bounds(self, topic: str) -> TopicBounds: ...

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> MessageBatch:
        """Deliverable messages from ``offset`` on, with legacy transactions resolved.

        Raises ``OffsetOutOfRange`` below the log start.
        """
        ...

    def close(self) -> None: ...


def _foreign(why: str) -> str:
    return f"not a logbroker envelope ({why})"


def _decode(offset: int, value: bytes) -> LogMessage | ForeignRecord:
    try:
        return LogMessage(offset, decode(value))
    except Exception as exc:  # fastavro fails on foreign bytes with EOFError, ValueError, ...
        return ForeignRecord(offset, _foreign(f"{type(exc).__name__}: {exc}"))


class StoreLogSource:
    """Reads an embedded store directly (same machine or a shared filesystem).

    Reads go through delivery's partition reader, raw (every record as stored), and resolve
    legacy transactions as a pull consumer's read does: a released transaction appears at its
    commit marker's offset, its data record and handovers give no message.  Raw, so that a
    record that is not an envelope comes back as a :class:`ForeignRecord` with the reason
    fastavro gives (a pull read names it only in its batch's ``not_envelopes``).
    """

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._reader = PartitionReader(store)

    def topic_names(self) -> list[str]:
        return sorted(t.name for t in self._store.list_topics() if not is_internal(t.name))

    def topic_bounds(self, topic: str) -> TopicBounds:
        info = self._store.describe_topic(topic)
        return TopicBounds(
            name=info.name,
            topic_id=info.topic_id,
            partitions=[
                PartitionBounds(p.partition, p.start_offset, p.end_offset, p.size_bytes or 0)
                for p in info.partitions
            ],
        )

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> MessageBatch:
        batch = self._reader.read(topic, partition, offset, max_bytes, raw=True)
        # The raw read holds every record of [offset, next_offset): the markers' data records
        # there need no read of their own, and the others are read together.
        resolver = CommitResolver(self._store, topic, partition, self._reader.txn_window_ms, offset)
        for m in batch.messages:
            if m.view is not None:
                resolver.saw(m.offset, m.view)
        resolver.scanned_to(batch.next_offset)
        markers = [m.view for m in batch.messages if m.view and m.view.kind == "legacy_commit"]
        released = iter(resolver.resolve(markers))
        messages: list[LogMessage | ForeignRecord] = []
        for m in batch.messages:
            if m.view is None:
                messages.append(_decode(m.offset, m.value))  # names why it is no envelope
            elif m.view.kind == "legacy_commit":
                data = next(released)
                if data is not None:
                    messages.append(_decode(m.offset, data.value))
            elif m.view.kind not in ("legacy_data", "handover"):
                messages.append(_decode(m.offset, m.value))
        return MessageBatch(messages, batch.start_offset, batch.end_offset, batch.next_offset)

    def close(self) -> None:
        self._store.close()


class HttpLogSource:
    """Reads through the pull API of an installation's gateways (``docs/protocol.md``, "Read
    (pull)").

    Asks for the binary framing, which carries each stored envelope as is.  A record the
    gateway left out because it is not an envelope, named in the answer's ``not_envelopes``,
    comes back as a :class:`ForeignRecord`, as from a store read; a gateway that does not name
    them is refused, since a load through it could not tell.

    ``servers``: gateways of one installation (one log), tried in turn by the loop the
    gateway commands use (:class:`delivery.gateway_retry.GatewayRetry`).  A request that finds
    a gateway unreachable, or answered one of :data:`RETRIED_STATUSES`, goes to the next at
    once; once every one failed it is asked again after a pause (growing from 0.5 s to 5 s, or
    what ``Retry-After`` says), for ``retry_s`` in all, then :class:`SourceUnavailable`.  With
    several, a gateway that names another installation than the others on ``/healthz`` (or
    than ``installation``, the (URL, installation id) the driver learnt) is refused
    (:class:`~delivery.installations.MixedInstallations`, a ``BadRequest``) before anything
    is read from it.  Every request is a read (GET), so asking again never changes
    anything; the loader's commit goes to its table, never through a gateway.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        token: str | None = None,
        timeout_s: float = 60.0,
        retry_s: float = DEFAULT_GATEWAY_RETRY_S,
        installation: tuple[str, str] | None = None,
    ) -> None:
        urls = gateway_urls(servers) if isinstance(servers, str) else tuple(servers)
        if not urls:
            raise BadSourceOptions("no gateway URL given")
        self._retry_s = retry_s
        self._gateways = GatewayRetry(
            urls,
            token=token,
            timeout_s=timeout_s,
            retry_s=retry_s,
            retried_statuses=RETRIED_STATUSES,
            describe_answer=lambda path, response: (
                f"{response.status_code} to {path}: {_reason(response)}"
            ),
            # said once per request, at its first failure; the tasks' requests say it in the
            # executors' logs
            on_waiting=lambda failure: log.warning(
                "gateway %s; trying again for up to %g s", failure, retry_s
            ),
            installation_why="offsets in one log are not offsets in another: a load would "
            "read another log's records at them",
            installation=installation,
        )

    @property
    def installation(self) -> tuple[str, str] | None:
        """(URL, installation id) of the first gateway that named the installation, if any."""
        return self._gateways.installation

    def ask_every_gateway(self) -> None:
        """Ask every gateway its installation now, at once (see
        :meth:`delivery.gateway_retry.GatewayRetry.ask_every_gateway`)."""
        self._gateways.ask_every_gateway()

    @property
    def _server(self) -> str:
        return self._gateways.current

    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> httpx.Response:
        """The first answer to ``GET path`` that is not a passing failure (see the class)."""
        try:
            answer = self._gateways.request("GET", path, params=dict(params or {}) or None)
        except StillUnavailable as exc:
            raise SourceUnavailable(
                f"gateway {'; gateway '.join(exc.failures)} "
                f"(still, after {self._retry_s:g} s of trying again)"
            ) from None
        except httpx.HTTPError as exc:  # no transport failure (or a URL without http://)
            raise SourceUnavailable(f"gateway {self._server}: {exc}") from exc
        return answer.response

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code == 404:
            raise UnknownTopic(_reason(response))
        if response.status_code in (401, 403):
            # a token the gateway refuses is the command line's mistake (exit 2), as for
            # every command that takes a token; retrying will not help
            raise BadRequest(_reason(response))
        if response.status_code != 200:
            raise SourceUnavailable(
                f"gateway {self._server} answered {response.status_code} to "
                f"{response.request.url.path}: {_reason(response)}"
            )
        return response

    def topic_names(self) -> list[str]:
        body = self._check(self._get("/v1/topics")).json()
        return sorted(str(t["name"]) for t in body["topics"])

    def topic_bounds(self, topic: str) -> TopicBounds:
        body = self._check(self._get(f"/v1/topics/{quote(topic, safe='')}")).json()
        return TopicBounds(
            name=str(body["name"]),
            topic_id=str(body["topic_id"]),
            partitions=[
                PartitionBounds(
                    int(p["partition"]),
                    int(p["start_offset"]),
                    int(p["end_offset"]),
                    int(p.get("size_bytes") or 0),  # null where the store does not know (Kafka)
                )
                for p in body["partitions"]
            ],
        )

    def topic_schemas(self, topic: str) -> Any | None:
        """``GET /v1/topics/{topic}/schemas``'s document, or None if the gateway has none."""
        try:
            return self._check(self._get(f"/v1/topics/{quote(topic, safe='')}/schemas")).json()
        except UnknownTopic:
            return None

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> MessageBatch:
        response = self._get(
            f"/v1/topics/{quote(topic, safe='')}/partitions/{partition}/messages",
            params={
                "offset": offset,
                "max_bytes": min(max_bytes, MAX_MAX_BYTES),
                "wait_ms": 0,
                "format": "binary",
            },
        )
        if response.status_code == 416:
            body = response.json()
            raise OffsetOutOfRange(
                f"{topic}/{partition}: offset {offset} is outside the log: {_reason(response)}",
                int(body["start_offset"]),
                int(body["end_offset"]),
            )
        sections = decode_binary(self._check(response).content)
        if len(sections) != 1:
            raise SourceUnavailable(f"gateway sent {len(sections)} sections for one partition")
        meta = sections[0].meta
        left_out = not_envelopes_of(meta)
        if left_out is None:
            raise SourceUnavailable(
                f"gateway {self._server} does not name the records its reads leave out because "
                "they are not envelopes (a version from before it did): a load through it could "
                "lose such a record without a report; upgrade it, or load from the store "
                "(--data-dir, --kafka-bootstrap)"
            )
        messages = [_decode(o, v) for o, v in sections[0].records]
        # named by the gateway; any value it sent that does not decode names itself above
        messages += [ForeignRecord(n.offset, _foreign(n.reason)) for n in left_out]
        messages.sort(key=lambda m: m.offset)
        return MessageBatch(
            messages,
            int(meta["start_offset"]),
            int(meta["end_offset"]),
            int(meta["next_offset"]),
        )

    def close(self) -> None:
        self._gateways.close()


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and "reason" in body:
        return str(body["reason"])
    return response.text[:200]


@dataclass(frozen=True)
class SourceSpec:
    """Which log to read: exactly one of ``data_dir`` (embedded store), ``server`` (a gateway's
    URL) or ``kafka_bootstrap`` (the Kafka cluster of a Kafka-backed log, read directly)."""

    data_dir: str | None = None
    server: str | None = None
    """``URL[,URL...]``: gateways of one installation (see :class:`HttpLogSource`)."""
    token: str | None = None
    gateway_retry_s: float = DEFAULT_GATEWAY_RETRY_S
    """How long a read through ``server`` is tried again while no gateway can answer it."""
    kafka_bootstrap: str | None = None
    kafka_namespace: str = ""
    """The gateways' ``kafka_namespace``."""
    kafka_properties: tuple[tuple[str, str], ...] = ()
    """librdkafka properties (TLS, SASL) for the Kafka clients of every task."""
    installation: tuple[str, str] | None = None
    """(URL, installation id): the installation ``server``'s gateways were found to belong to
    (:meth:`pinned`), which every task's gateway is checked against before it is read from."""

    def __post_init__(self) -> None:
        given = [x for x in (self.data_dir, self.server, self.kafka_bootstrap) if x is not None]
        if len(given) != 1:
            raise BadSourceOptions(
                "give exactly one of data_dir (a store directory), server (a gateway URL) "
                "or kafka_bootstrap (the Kafka servers of a Kafka-backed log)"
            )
        if self.data_dir is not None:
            # Executors open it from their own working directory (on a cluster, the worker's
            # work directory): a relative path must mean what it means where it was given.
            object.__setattr__(self, "data_dir", str(Path(self.data_dir).absolute()))
        if self.server is not None:
            urls = gateway_urls(self.server)
            if not urls:
                raise BadSourceOptions("server must name a gateway: URL[,URL...]")
            for url in urls:
                if not url.startswith(("http://", "https://")):
                    raise BadSourceOptions(f"server must be an http:// or https:// URL: {url!r}")
        if not (math.isfinite(self.gateway_retry_s) and self.gateway_retry_s >= 0):
            raise BadSourceOptions(
                f"gateway_retry_s must be a finite number of seconds, 0 or more, not "
                f"{self.gateway_retry_s}"
            )
        if self.kafka_bootstrap is None and (self.kafka_namespace or self.kafka_properties):
            raise BadSourceOptions("kafka_namespace and kafka properties need kafka_bootstrap")
        if self.kafka_bootstrap is not None:
            self.kafka_settings()  # a bad namespace or a reserved property fails here

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceSpec:
        """From data source options; ``kafka.<property>`` options are librdkafka properties."""
        properties = tuple(
            sorted(
                (key[len(KAFKA_OPTION_PREFIX) :], str(value))
                for key, value in options.items()
                if key.startswith(KAFKA_OPTION_PREFIX)
            )
        )
        retry = options.get("gateway_retry_s")
        try:
            retry_s = DEFAULT_GATEWAY_RETRY_S if retry is None else float(retry)
        except ValueError:
            raise BadSourceOptions(f"gateway_retry_s must be seconds, got {retry!r}") from None
        return cls(
            data_dir=options.get("data_dir") or None,
            server=options.get("server") or None,
            token=options.get("token") or None,
            gateway_retry_s=retry_s,
            kafka_bootstrap=options.get("kafka_bootstrap") or None,
            kafka_namespace=options.get("kafka_namespace") or "",
            kafka_properties=properties,
        )

    def kafka_settings(self) -> KafkaSettings:
        """The Kafka backend's settings of a ``kafka_bootstrap`` source."""
        from log_store.kafka import KafkaSettings

        assert self.kafka_bootstrap is not None
        try:
            return KafkaSettings(
                self.kafka_bootstrap,
                namespace=self.kafka_namespace,
                properties=MappingProxyType(dict(self.kafka_properties)),
            )
        except BadRequest as exc:
            raise BadSourceOptions(str(exc)) from exc

    def open(self) -> LogSource:
        if self.kafka_bootstrap is not None:
            from log_store.kafka import open_kafka_store

            # Only reads: read_committed consumers and changelog replays, never a
            # transactional producer, so no gateway's writer is ever fenced by a load.
            return StoreLogSource(open_kafka_store(self.kafka_settings()))
        if self.data_dir is not None:
            # Opening a store creates it; a mistyped path must not read as an empty log.
            if not (Path(self.data_dir) / STORE_CATALOG).is_file():
                raise BadSourceOptions(f"{self.data_dir} is not a logbroker data directory")
            # Read-only: executors and the driver never create, change or touch anything of
            # the live store (schema, directories, notify files are its gateway's).
            return StoreLogSource(open_store(self.data_dir, read_only=True))
        return self.gateways()

    def gateways(self) -> HttpLogSource:
        """The ``server`` source, with its own type (it answers more than a log source)."""
        assert self.server is not None
        return HttpLogSource(
            self.server, self.token, retry_s=self.gateway_retry_s, installation=self.installation
        )

    def pinned(self, learnt_by: LogSource | None = None) -> SourceSpec:
        """This spec with :attr:`installation` set: what ``learnt_by`` (a source opened from
        it that reached its gateways) learnt, or else, with several gateways, what they
        answer now, asked at once (:meth:`HttpLogSource.ask_every_gateway`; raises
        :class:`~delivery.installations.MixedInstallations` if two name different ones).
        Itself if it has one, reads no gateways, or no gateway named its installation."""
        if self.installation is not None or self.server is None:
            return self
        if isinstance(learnt_by, HttpLogSource):
            learnt = learnt_by.installation
        elif len(gateway_urls(self.server)) < 2:
            return self  # one URL has no other to be checked against
        else:
            source = self.gateways()
            try:
                source.ask_every_gateway()
                learnt = source.installation
            finally:
                source.close()
        return self if learnt is None else dataclasses.replace(self, installation=learnt)

    def describe(self) -> str:
        if self.kafka_bootstrap is not None:
            namespace = f" namespace {self.kafka_namespace!r}" if self.kafka_namespace else ""
            return f"Kafka {self.kafka_bootstrap}{namespace}"
        if self.data_dir is not None:
            return f"store {self.data_dir}"
        urls = gateway_urls(self.server or "")
        return f"gateway{'s' if len(urls) > 1 else ''} {', '.join(urls)}"


def check_same_topic(source: LogSource, topic: str, topic_id: str) -> None:
    """Raise :class:`TopicDeleted` unless ``topic`` is still the topic ``topic_id``.

    Asked after a range was read: reads go by name, so a topic deleted and created again
    meanwhile could have given the new topic's records at the offsets planned in the old one.
    If the old topic is still there now, everything read before was its own.
    """
    try:
        now: str | None = source.topic_bounds(topic).topic_id
    except UnknownTopic:
        now = None
    if now != topic_id:
        again = "" if now is None else " and created again"
        raise TopicDeleted(f"topic {topic!r} was deleted{again} while this load read it")


def current_bounds(source: LogSource, topics: str) -> list[TopicBounds]:
    """Bounds of every topic matching ``topics`` now; a topic deleted meanwhile is left out."""
    found = []
    for name in matching_topics(source.topic_names(), topics):
        try:
            found.append(source.topic_bounds(name))
        except UnknownTopic:
            continue
    return found
