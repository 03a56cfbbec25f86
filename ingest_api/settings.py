"""The gateway's configuration: one typed, frozen object built once from file, env and flags.

Precedence, lowest first: built-in defaults, the TOML file (``--config`` or
``LOGBROKER_CONFIG``), environment variables ``LOGBROKER_<NAME>``, command-line flags.
The object is passed down to every part of the gateway; nothing reads the environment later.

A TOML file looks like this (every key optional)::

    data_dir = "/var/lib/logbroker"
    host = "0.0.0.0"
    port = 8080
    dc = "dc1"
    partitions = 4
    store = "sqlite"            # or "kafka" (see docs/kafka.md for the [kafka] table)
    # kafka_bootstrap = "kafka1:9092"   with store = "kafka" only
    workers = 2
    allow_public_without_tokens = false
    metrics_require_token = true    # /metrics needs a token with metrics = true (the default
                                    # with [tokens]; false makes it public)
    push_allow = ["10.1.2.0/24"]    # networks push subscriptions may POST to besides public ones
    allowed_hosts = ["gw1.example"] # without tokens: Host names answered besides addresses,
                                    # localhost, host and advertised_url's (DNS rebinding)
    graphite = "graphite1:2003"     # also send the metrics to Graphite (plaintext protocol)
    graphite_prefix = "logbroker.dc1.gw1"
    graphite_interval_s = 60.0

    [limits]
    max_body_bytes = 67108864
    max_body_bytes_in_flight = 0    # bodies one worker receives at once (0: 4 x max_body_bytes)
    max_chunk_bytes = 8388608
    max_chunks_per_request = 100000
    max_decompressed_bytes_per_request = 134217728  # a write's gzip/zstd chunks, decompressed
    source_chunks_per_second = 0    # 0: no per-source rate limit
    source_burst_chunks = 0         # 0: one second of the rate
    request_timeout_s = 30.0
    max_topics = 10000              # topics created on first use stop here (429)
    max_topics_per_token = 0        # of them, one token's (0: a quarter of max_topics)
    max_partitions_per_topic = 64
    max_sources_per_partition = 1000000
    max_subscriptions_per_token = 100
    max_groups_per_token = 1000     # consumer groups one token may create
    max_schema_versions = 1000      # schema versions one structured log type may have
    max_structured_log_types = 10000  # log types with a schema or a compatibility mode
    max_open_partitions = 256       # idle partitions one worker keeps open (embedded store)
    source_idle_expiry_s = 604800   # a source not written this long is forgotten (7 days)
    max_fetch_positions = 1000      # partitions one /v1/fetch may name
    max_waiting_positions = 100000  # positions one worker's long-polls wait on at once (429)
    max_waiting_positions_per_token = 0  # of them, one token's (0: a quarter of it)
    auth_cache_entries = 100000     # remembered (token, log type or topic) decisions
    max_staged_bytes = 1073741824   # legacy /store data not yet committed
    max_staged_bytes_per_token = 0  # of it, one token's (0: a quarter of max_staged_bytes)
    staged_max_age_s = 3600         # a staged piece never requested is dropped after this
    max_connections_per_client = 256  # open connections from one address per worker (0: any)
    max_open_connections = 0        # open connections per worker (0: what ulimit -n leaves)

    [tokens.s3cr3t-token]
    name = "tenant-a"               # who owns the groups and subscriptions it creates
    write = ["nginx-*", "app"]      # log types this token may write (globs)
    read = ["dc1.*"]                # topics this token may read (globs)
    replicate = []                  # topics a mirror with this token may append to (globs)
    metrics = false                 # may read /metrics (which needs a token with [tokens])
    admin = false                   # may do everything, with every client's objects
    # sources = ["web-17:*"]        # source ids it may write (globs); absent: every source
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import logging
import math
import os
import re
import ssl
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from log_store.errors import BadRequest
from log_store.partition_handles import DEFAULT_MAX_OPEN_PARTITIONS
from log_store.topic_quota import DEFAULT_MAX_PARTITIONS_PER_TOPIC, DEFAULT_MAX_TOPICS
from session_dedup.source_expiry import DEFAULT_IDLE_S

STORES = ("sqlite", "kafka")
OWNERSHIPS = ("group", "on_demand")
_KAFKA_KEYS: dict[str, type] = {
    "compression": str,
    "linger_ms": float,
    "replication_factor": int,
    "min_insync_replicas": int,
    "operation_timeout_s": float,
    "session_timeout_ms": int,
    "snapshot_min_entries": int,
    "transaction_timeout_ms": int,
    "properties": dict,
}
_ALLOWED_HOST = re.compile(r"\*|\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")
_DC_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
MIN_TOKEN_CHARS = 16
"""Tokens shorter than this are warned about at start (not refused: configurations and
scripts with short tokens exist); see :func:`short_token_warnings`."""
_log = logging.getLogger(__name__)


class ConfigError(BadRequest):
    """The configuration (file, env or flags) is invalid."""


@dataclass(frozen=True)
class TokenGrant:
    """What one bearer token may do: write these log types, read these topics, append mirrored
    records to these topics (globs); read ``/metrics``; everything (``admin``).

    ``owner`` names the token's holder: groups and subscriptions it creates belong to it.  It
    is the configured ``name``, or a digest of the token (never the token itself).

    ``write_sources`` (``sources`` in the configuration) narrows what it writes to the source
    ids these globs match; ``None`` (the key left out) is every source of the log types it may
    write, so tokens sharing a log type then trust each other with all of its sources.
    """

    write_log_types: tuple[str, ...] = ()
    write_sources: tuple[str, ...] | None = None
    read_topics: tuple[str, ...] = ()
    replicate_topics: tuple[str, ...] = ()
    metrics: bool = False
    admin: bool = False
    owner: str = ""
    name: str | None = None


def token_owner(token: str, name: str | None) -> str:
    """The owner id of a token: its configured name, else a digest that does not reveal it."""
    if name:
        return name
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Limits:
    """Front-door limits; a request over one of them gets 413, 429 or 408 and writes nothing."""

    max_body_bytes: int = 64 * 1024 * 1024
    max_body_bytes_in_flight: int = 0
    """Bytes of request bodies one worker holds while they arrive, all requests together (0:
    4 x ``max_body_bytes``); a body that does not fit waits a second, then gets 503 ``too_busy``;
    see :mod:`ingest_api.body`."""
    max_chunk_bytes: int = 8 * 1024 * 1024
    max_chunks_per_request: int = 100_000
    max_decompressed_bytes_per_request: int = 128 * 1024 * 1024
    """What a write's compressed (gzip, zstd) chunks may decompress to in all: each chunk may
    expand to 64 MiB (``MAX_DECOMPRESSED_BYTES``), and a few KiB of such chunks would otherwise
    cost the gateway, and every reader of what it wrote, seconds of decompression.  A push-client
    request decompresses to at most its ``request_bytes`` plus one ``chunk_bytes``."""
    max_sessions_per_request: int = 10_000
    source_chunks_per_second: float = 0.0
    source_burst_chunks: int = 0
    request_timeout_s: float = 30.0
    max_topics: int = DEFAULT_MAX_TOPICS
    max_topics_per_token: int = 0
    """How many of ``max_topics`` one token owner may create on first use (0: a quarter of
    it); see :attr:`topics_per_token`."""
    max_partitions_per_topic: int = DEFAULT_MAX_PARTITIONS_PER_TOPIC
    max_sources_per_partition: int = 1_000_000
    max_subscriptions_per_token: int = 100
    max_groups_per_token: int = 1000
    max_schema_versions: int = 1000
    """Versions one log type's schema may have: each registration is checked against every
    earlier version, and all of them are read back with the log type."""
    max_structured_log_types: int = 10_000
    """Log types the schema registry may hold (a schema registered or a compatibility mode set)."""
    max_open_partitions: int = DEFAULT_MAX_OPEN_PARTITIONS
    source_idle_expiry_s: float = DEFAULT_IDLE_S
    max_fetch_positions: int = 1000
    max_waiting_positions: int = 100_000
    """Positions (a partition of a fetch or a read) that one worker's long-polls wait on at
    once, all tokens together: a waiting position holds an append watch, a re-read on every
    wake and, for a topic not made yet, a look every half second.  One more is 429 (see
    :class:`ingest_api.waiting_reads.WaitingPositions`)."""
    max_waiting_positions_per_token: int = 0
    """Of ``max_waiting_positions``, what one token owner's long-polls may hold (0: a
    quarter of it); see :attr:`waiting_positions_per_token`."""
    auth_cache_entries: int = 100_000
    max_staged_bytes: int = 1024**3
    max_staged_bytes_per_token: int = 0
    """What one token owner's uploads may hold of ``max_staged_bytes`` (0: a quarter of it);
    see :attr:`staged_bytes_per_token`."""
    staged_max_age_s: float = 3600.0
    """How long a legacy piece waits for its ``/commit_request`` before it is dropped."""
    max_connections_per_client: int = 256
    """Open connections one peer address may hold to a worker (0: no limit; behind a balancer
    every client has the balancer's address: raise it there)."""
    max_open_connections: int = 0
    """Open client connections a worker may hold in all, never more than its descriptor limit
    leaves after a reserve for the store and its other sockets (0: that many);
    see :func:`ingest_api.request_head.connection_cap`."""

    @property
    def staged_bytes_per_token(self) -> int:
        """One token's share of the legacy staging: as configured, else a quarter of
        ``max_staged_bytes`` (one token's uploads never requested leave the others three
        quarters; filling it takes at least four tokens)."""
        return self.max_staged_bytes_per_token or max(1, self.max_staged_bytes // 4)

    @property
    def waiting_positions_per_token(self) -> int:
        """One token's share of the positions a worker's long-polls wait on: as configured,
        else a quarter of ``max_waiting_positions`` (one token's long-polls leave the others
        three quarters)."""
        return self.max_waiting_positions_per_token or max(1, self.max_waiting_positions // 4)

    @property
    def topics_per_token(self) -> int:
        """One token's share of the topics created on first use: as configured, else a quarter
        of ``max_topics`` (one token's log types leave the others three quarters; filling the
        store takes at least four tokens).  ``max_topics_per_token = max_topics`` gives every
        token the whole pool, as before there was a share."""
        return self.max_topics_per_token or max(1, self.max_topics // 4)


@dataclass(frozen=True)
class GatewaySettings:
    """Everything ``logbroker serve`` needs to know, immutable once built."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    dc: str = "dc1"
    partitions: int = 4
    store: str = "sqlite"
    kafka_bootstrap: str | None = None
    tokens: Mapping[str, TokenGrant] = field(default_factory=lambda: MappingProxyType({}))
    limits: Limits = field(default_factory=Limits)
    workers: int = 1
    allow_public_without_tokens: bool = False
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    kafka_namespace: str = ""
    kafka_ownership: str = "group"
    """``group``: gateways share partitions out in a Kafka consumer group and send each
    other the transactions of partitions they do not own; ``on_demand``: this gateway takes
    over any partition it writes (one gateway, or tests of fencing)."""
    kafka: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The ``[kafka]`` table: client settings and librdkafka properties (docs/kafka.md)."""
    advertised_url: str | None = None
    """How the other gateways reach this one (default ``http(s)://host:port``)."""
    peer_token: str | None = None
    """The bearer token gateways use with each other's internal endpoints (needed with
    ``[tokens]`` on Kafka)."""
    metrics_require_token: bool | None = None
    """``/metrics`` needs a token with ``metrics = true`` (None: with ``[tokens]`` it does;
    its labels name every tenant's topics, groups and subscriptions); see
    :attr:`metrics_need_token`."""
    push_allow: tuple[str, ...] = ()
    """Networks (CIDR or single addresses) push delivery may connect to besides public
    addresses; see :mod:`delivery.push_targets`."""
    allowed_hosts: tuple[str, ...] = ()
    """Without tokens: names (``gw1.example``, ``.example`` for every name under it, ``*``) a
    request's ``Host`` may give besides IP addresses, ``localhost``, ``host`` and the
    ``advertised_url``'s host; see :mod:`ingest_api.host_check`."""
    graphite: str | None = None
    """``HOST:PORT`` of a Graphite (carbon) plaintext listener the metrics are sent to."""
    graphite_prefix: str = "logbroker"
    graphite_interval_s: float = 60.0

    def __post_init__(self) -> None:
        _check(self.port >= 0 and self.port <= 65535, f"port {self.port} out of range")
        _check(self.partitions >= 1, "partitions must be at least 1")
        _check(self.workers >= 1, "workers must be at least 1")
        _check(self.store in STORES, f"store must be one of {', '.join(STORES)}")
        _check(
            self.store != "kafka" or bool(self.kafka_bootstrap),
            "store 'kafka' needs kafka_bootstrap (HOST:PORT)",
        )
        _check(
            self.store == "kafka" or not self.kafka_bootstrap,
            f"kafka_bootstrap is set but the store is {self.store!r}: a gateway meant for Kafka "
            'would keep its own log; set store = "kafka" (--store kafka) or leave '
            "kafka_bootstrap out",
        )
        _check(
            _DC_PATTERN.fullmatch(self.dc) is not None,
            f"dc {self.dc!r} must be 1-32 of [a-z0-9_-], starting with a letter or digit",
        )
        if self.advertised_url:
            _check_advertised_url(self.advertised_url)
        if self.store == "kafka":
            _check(
                self.kafka_ownership in OWNERSHIPS,
                f"kafka_ownership must be one of {', '.join(OWNERSHIPS)}",
            )
            _check(
                self.workers == 1,
                "store 'kafka' runs one worker per gateway: start more gateways instead",
            )
            _check(
                bool(self.advertised_url) or self.host not in ("0.0.0.0", "::", ""),
                f"store 'kafka' with host {self.host!r} needs advertised_url "
                "(--advertised-url http://THIS-HOST:PORT): the other gateways and the clients "
                "that send to owners reach this gateway there, and "
                f"http://{self.host or '0.0.0.0'}:{self.port} reaches none",
            )
            _check(
                not self.tokens or bool(self.peer_token),
                "store 'kafka' with [tokens] needs peer_token, for the gateways' internal calls",
            )
            self.kafka_settings()  # raises ConfigError on a bad [kafka] table
        elif self.kafka:
            # Unused by the embedded store, but a misspelt key or value is refused all the
            # same: it would otherwise surface only when the store is switched to Kafka.
            self._kafka_settings(bootstrap="unused:9092")
        if self.peer_token is not None and self.peer_token in self.tokens:
            # require_peer lets it through: its holder could commit prepared transactions
            # (any records, any seqno table) into any partition, past every write grant
            raise ConfigError(
                "peer_token is also a client token ([tokens], the token of "
                f"{self.tokens[self.peer_token].owner!r}): its holder could make the gateways' "
                "internal calls and write anything anywhere; give the gateways a peer_token "
                "of their own"
            )
        lim = self.limits
        _check(lim.max_body_bytes > 0, "limits.max_body_bytes must be positive")
        _check(
            lim.max_body_bytes_in_flight == 0 or lim.max_body_bytes_in_flight >= lim.max_body_bytes,
            "limits.max_body_bytes_in_flight must be 0 (4 x max_body_bytes) or at least "
            "max_body_bytes",
        )
        _check(lim.max_chunk_bytes > 0, "limits.max_chunk_bytes must be positive")
        _check(lim.max_chunks_per_request > 0, "limits.max_chunks_per_request must be positive")
        _check(
            lim.max_decompressed_bytes_per_request > 0,
            "limits.max_decompressed_bytes_per_request must be positive",
        )
        _check(lim.max_sessions_per_request > 0, "limits.max_sessions_per_request must be positive")
        _check(lim.source_chunks_per_second >= 0, "limits.source_chunks_per_second must be >= 0")
        _check(lim.request_timeout_s > 0, "limits.request_timeout_s must be positive")
        _check(lim.source_idle_expiry_s > 0, "limits.source_idle_expiry_s must be positive")
        _check(lim.staged_max_age_s > 0, "limits.staged_max_age_s must be positive")
        _check(
            lim.max_topics_per_token >= 0,
            "limits.max_topics_per_token must be >= 0 (0: a quarter of max_topics)",
        )
        _check(
            lim.max_staged_bytes_per_token >= 0,
            "limits.max_staged_bytes_per_token must be >= 0 (0: a quarter of max_staged_bytes)",
        )
        _check(
            lim.max_waiting_positions_per_token >= 0,
            "limits.max_waiting_positions_per_token must be >= 0 (0: a quarter of "
            "max_waiting_positions)",
        )
        _check(
            lim.max_connections_per_client >= 0,
            "limits.max_connections_per_client must be >= 0 (0: no limit)",
        )
        _check(
            lim.max_open_connections >= 0,
            "limits.max_open_connections must be >= 0 (0: what the file descriptor limit leaves)",
        )
        for name in (
            "max_topics",
            "max_partitions_per_topic",
            "max_sources_per_partition",
            "max_subscriptions_per_token",
            "max_groups_per_token",
            "max_schema_versions",
            "max_structured_log_types",
            "max_open_partitions",
            "max_fetch_positions",
            "max_waiting_positions",
            "auth_cache_entries",
            "max_staged_bytes",
        ):
            _check(getattr(lim, name) > 0, f"limits.{name} must be positive")
        _check(
            self.partitions <= lim.max_partitions_per_topic,
            f"partitions {self.partitions} is over limits.max_partitions_per_topic "
            f"{lim.max_partitions_per_topic}",
        )
        for network in self.push_allow:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(
                    f"push_allow: {network!r} is not an IP network (e.g. 10.1.2.0/24 or 127.0.0.1)"
                ) from None
        for name in self.allowed_hosts:
            _check(
                _ALLOWED_HOST.fullmatch(name) is not None,
                f"allowed_hosts: {name!r} is not a host name (e.g. gw1.example, .example or *)",
            )
        if self.graphite is not None:
            host, _, port = self.graphite.rpartition(":")
            _check(
                bool(host) and port.isdigit() and 0 < int(port) <= 65535,
                f"graphite {self.graphite!r} must be HOST:PORT",
            )
        _check(self.graphite_interval_s > 0, "graphite_interval_s must be positive")
        _check_tls_files(self.ssl_certfile, self.ssl_keyfile)
        if not self.tokens and not self.allow_public_without_tokens:
            _check(
                self.host in LOOPBACK_HOSTS,
                f"no tokens are configured, so the gateway listens on loopback only; "
                f"refusing host {self.host!r} (configure [tokens] or set "
                "allow_public_without_tokens)",
            )

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens)

    @property
    def metrics_need_token(self) -> bool:
        """Whether ``/metrics`` needs a token with ``metrics = true``: as configured, else
        whenever tokens are."""
        if self.metrics_require_token is None:
            return self.auth_enabled
        return self.metrics_require_token

    @property
    def url(self) -> str:
        """The URL the other gateways use to reach this one."""
        if self.advertised_url:
            return self.advertised_url.rstrip("/")
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def kafka_settings(self) -> Any:
        """The Kafka backend's settings (``log_store.kafka.KafkaSettings``)."""
        return self._kafka_settings(self.kafka_bootstrap or "")

    def _kafka_settings(self, bootstrap: str) -> Any:
        from log_store.kafka import KafkaSettings

        raw = dict(self.kafka)
        unknown = set(raw) - set(_KAFKA_KEYS)
        if unknown:
            raise ConfigError(f"unknown kafka settings: {', '.join(sorted(unknown))}")
        values = {k: _coerce(f"kafka.{k}", v, _KAFKA_KEYS[k]) for k, v in raw.items()}
        if "properties" in values:
            values["properties"] = MappingProxyType(
                {str(k): str(v) for k, v in values["properties"].items()}
            )
        try:
            return KafkaSettings(bootstrap=bootstrap, namespace=self.kafka_namespace, **values)
        except BadRequest as exc:
            raise ConfigError(str(exc)) from None

    def to_json(self) -> str:
        """A JSON form that :meth:`from_json` turns back into equal settings (for workers)."""
        raw: dict[str, Any] = {name: getattr(self, name) for name in _SCALARS}
        raw["data_dir"] = str(self.data_dir)
        raw["limits"] = dataclasses.asdict(self.limits)
        raw["kafka"] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in self.kafka.items()}
        raw["push_allow"] = list(self.push_allow)
        raw["allowed_hosts"] = list(self.allowed_hosts)
        raw["tokens"] = {token: _grant_json(g) for token, g in self.tokens.items()}
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> GatewaySettings:
        raw = json.loads(text)
        return _from_mapping(raw)


def _check_advertised_url(url: str) -> None:
    """An advertised URL is ``http(s)://HOST[:PORT]``: the other gateways and the clients
    sending to owners put ``/v1/...`` after it.  Anything else was found out only by the
    start's reach check, after its 10 s, as an HTTP client's complaint."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(
            f"advertised_url {url!r} is not a URL ({exc}): give http://THIS-HOST:PORT"
        ) from None
    _check(
        parts.scheme in ("http", "https") and bool(parts.hostname),
        f"advertised_url {url!r} must be an http:// or https:// URL naming this gateway's "
        f"host, e.g. http://THIS-HOST:PORT",
    )
    _check(
        not parts.query and not parts.fragment and (port is None or port > 0),
        f"advertised_url {url!r} must be http(s)://HOST[:PORT], without a query, fragment "
        "or port 0",
    )


def _check(ok: bool, reason: str) -> None:
    if not ok:
        raise ConfigError(reason)


def _pem_text(setting: str, path: str) -> str:
    try:
        with open(path, "rb") as file:
            return file.read().decode("ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(f"{setting} {path}: cannot read it: {exc.strerror or exc}") from None


def _check_tls_files(certfile: str | None, keyfile: str | None) -> None:
    """Refuse a certificate and key uvicorn could not load, naming the file and what is wrong.

    uvicorn loads them only once the gateway starts, and its failure is a traceback naming
    neither file ("PEM lib").  The chain is loaded here once, as uvicorn will load it."""
    if certfile is None:
        _check(keyfile is None, "ssl_keyfile is set without ssl_certfile (--ssl-certfile)")
        return
    cert_text = _pem_text("ssl_certfile", certfile)
    key_text = cert_text if keyfile is None else _pem_text("ssl_keyfile", keyfile)
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        swapped = " (it holds a private key: are the certificate and key swapped?)"
        raise ConfigError(
            f"ssl_certfile {certfile}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            + (swapped if "PRIVATE KEY-----" in cert_text else "")
        )
    if "PRIVATE KEY-----" not in key_text:
        if keyfile is None:
            raise ConfigError(
                f"ssl_certfile {certfile}: holds no private key; give the certificate's key "
                "with ssl_keyfile (--ssl-keyfile)"
            )
        swapped = " (it holds a certificate: are the certificate and key swapped?)"
        raise ConfigError(
            f"ssl_keyfile {keyfile}: holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
            + (swapped if "-----BEGIN CERTIFICATE-----" in key_text else "")
        )
    key_path = keyfile or certfile
    if "ENCRYPTED" in key_text:
        raise ConfigError(
            f"{'ssl_keyfile' if keyfile else 'ssl_certfile'} {key_path}: the private key is "
            "encrypted; the gateway takes an unencrypted key (readable by its user only)"
        )

    def no_password() -> bytes:
        return b""  # never OpenSSL's prompt on the terminal

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=certfile)
    except (ssl.SSLError, OSError):
        raise ConfigError(
            f"ssl_certfile {certfile}: its certificate is damaged (not valid PEM/X.509)"
        ) from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile, no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"ssl_keyfile {key_path}: the private key does not belong to the certificate "
                f"in {certfile}"
            ) from None
        raise ConfigError(
            f"ssl_keyfile {key_path}: cannot load the private key for the certificate in "
            f"{certfile}: {exc}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"ssl_certfile {certfile}: cannot load it: {exc}") from None


_SCALARS: dict[str, type] = {
    "data_dir": str,
    "host": str,
    "port": int,
    "dc": str,
    "partitions": int,
    "store": str,
    "kafka_bootstrap": str,
    "workers": int,
    "allow_public_without_tokens": bool,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "kafka_namespace": str,
    "kafka_ownership": str,
    "advertised_url": str,
    "peer_token": str,
    "metrics_require_token": bool,
    "graphite": str,
    "graphite_prefix": str,
    "graphite_interval_s": float,
}
_LIMIT_TYPES: dict[str, type] = {
    "max_body_bytes": int,
    "max_body_bytes_in_flight": int,
    "max_chunk_bytes": int,
    "max_chunks_per_request": int,
    "max_decompressed_bytes_per_request": int,
    "max_sessions_per_request": int,
    "source_chunks_per_second": float,
    "source_burst_chunks": int,
    "request_timeout_s": float,
    "max_topics": int,
    "max_topics_per_token": int,
    "max_partitions_per_topic": int,
    "max_sources_per_partition": int,
    "max_subscriptions_per_token": int,
    "max_groups_per_token": int,
    "max_schema_versions": int,
    "max_structured_log_types": int,
    "max_open_partitions": int,
    "source_idle_expiry_s": float,
    "max_fetch_positions": int,
    "max_waiting_positions": int,
    "max_waiting_positions_per_token": int,
    "auth_cache_entries": int,
    "max_staged_bytes": int,
    "max_staged_bytes_per_token": int,
    "staged_max_age_s": float,
    "max_connections_per_client": int,
    "max_open_connections": int,
}
_GRANT_GLOBS = {"write": "write_log_types", "read": "read_topics", "replicate": "replicate_topics"}
_GRANT_FLAGS = ("metrics", "admin")
_GRANT_SOURCES = "sources"
"""Optional, unlike the globs above: left out, a token writes every source of its log types."""


def _coerce(name: str, value: Any, kind: type) -> Any:
    """Values from TOML keep their type; values from env arrive as text.  A float is finite:
    ``inf`` and ``nan`` are refused (an endless timeout or expiry is a typo, not a setting)."""
    found = _coerced(name, value, kind)
    if kind is float and not math.isfinite(found):
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    return found


def _coerced(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, str) and kind is not str:
        try:
            if kind is bool:
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off", ""):
                    return False
                raise ValueError(value)
            return kind(value)
        except ValueError:
            raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")
    return value


def _grant_json(grant: TokenGrant) -> dict[str, Any]:
    doc: dict[str, Any] = {key: list(getattr(grant, attr)) for key, attr in _GRANT_GLOBS.items()}
    doc.update({flag: getattr(grant, flag) for flag in _GRANT_FLAGS})
    if grant.write_sources is not None:
        doc[_GRANT_SOURCES] = list(grant.write_sources)
    if grant.name is not None:
        doc["name"] = grant.name
    return doc


def _tokens(raw: Any) -> Mapping[str, TokenGrant]:
    if not isinstance(raw, dict):
        raise ConfigError("tokens must be a table of token -> {write = [...], read = [...]}")
    grants: dict[str, TokenGrant] = {}
    owners: dict[str, str] = {}
    known = {*_GRANT_GLOBS, *_GRANT_FLAGS, _GRANT_SOURCES, "name"}
    for token, spec in raw.items():
        if not isinstance(token, str) or not token or any(c.isspace() for c in token):
            raise ConfigError("a token must be a non-empty string without whitespace")
        if not isinstance(spec, dict) or set(spec) - known:
            raise ConfigError(
                f"a token entry has only {', '.join(sorted(known))}; got {sorted(spec)!r}"
                if isinstance(spec, dict)
                else "a token entry must be a table"
            )
        globs: dict[str, Any] = {}
        for key, attr in _GRANT_GLOBS.items():
            value = spec.get(key, [])
            if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
                raise ConfigError(f"token {key} must be a list of glob strings")
            globs[attr] = tuple(value)
        sources = spec.get(_GRANT_SOURCES)
        if sources is not None:
            if not isinstance(sources, list) or not all(isinstance(g, str) for g in sources):
                raise ConfigError(f"token {_GRANT_SOURCES} must be a list of glob strings")
            globs["write_sources"] = tuple(sources)
        flags: dict[str, Any] = {}
        for flag in _GRANT_FLAGS:
            value = spec.get(flag, False)
            if not isinstance(value, bool):
                raise ConfigError(f"token {flag} must be true or false")
            flags[flag] = value
        name = spec.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigError("token name must be a non-empty string")
        owner = token_owner(token, name)
        grant = TokenGrant(**globs, **flags, owner=owner, name=name)
        # Two tokens of one name are one client's old and new token while it is rotated
        # (docs/operations.md): they must grant the same, or the name would be shared by two
        # clients with different rights over the same groups and subscriptions.
        twin = owners.get(owner)
        if twin is not None and grants[twin] != grant:
            raise ConfigError(
                f"two tokens have the name {owner!r} but grant different things; give each "
                "client its own name (two tokens may share a name, while one is rotated, only "
                "with the same write, sources, read, replicate, metrics and admin)"
            )
        owners[owner] = token
        grants[token] = grant
    return MappingProxyType(grants)


def _from_mapping(raw: Mapping[str, Any]) -> GatewaySettings:
    unknown = (
        set(raw) - set(_SCALARS) - {"limits", "tokens", "push_allow", "allowed_hosts", "kafka"}
    )
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {}
    for name, kind in _SCALARS.items():
        if raw.get(name) is not None:
            kwargs[name] = _coerce(name, raw[name], kind)
    if "data_dir" not in kwargs:
        raise ConfigError("data_dir is required (--data-dir, LOGBROKER_DATA_DIR or the config)")
    kwargs["data_dir"] = Path(kwargs["data_dir"])
    limits_raw = raw.get("limits") or {}
    if not isinstance(limits_raw, dict):
        raise ConfigError("limits must be a table")
    unknown = set(limits_raw) - set(_LIMIT_TYPES)
    if unknown:
        raise ConfigError(f"unknown limits: {', '.join(sorted(unknown))}")
    kwargs["limits"] = Limits(
        **{k: _coerce(f"limits.{k}", v, _LIMIT_TYPES[k]) for k, v in limits_raw.items()}
    )
    kwargs["tokens"] = _tokens(raw.get("tokens") or {})
    kafka_raw = raw.get("kafka") or {}
    if not isinstance(kafka_raw, dict):
        raise ConfigError("kafka must be a table")
    kwargs["kafka"] = MappingProxyType(dict(kafka_raw))
    kwargs["push_allow"] = _name_list("push_allow", raw.get("push_allow"), "['10.1.2.0/24']")
    kwargs["allowed_hosts"] = _name_list(
        "allowed_hosts", raw.get("allowed_hosts"), "['gw1.example']"
    )
    return GatewaySettings(**kwargs)


def _name_list(key: str, raw: Any, example: str) -> tuple[str, ...]:
    """A list from TOML or JSON, a comma-separated string from the environment or a flag."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ConfigError(f"{key} must be a list of strings, e.g. {example}")
    return tuple(raw)


def load_settings(
    *,
    config_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> GatewaySettings:
    """Build the settings: defaults, then the TOML file, then ``LOGBROKER_*`` env, then flags.

    ``flags`` holds only the options given on the command line (``None`` means not given).
    Raises :class:`ConfigError` with a reason on anything invalid.
    """
    environ = os.environ if env is None else env
    _refuse_unknown_env(environ)
    merged = _config_file(config_file, environ)
    limits = _env_limits(merged, environ)
    for name in ("push_allow", "allowed_hosts"):
        if environ.get(f"LOGBROKER_{name.upper()}") is not None:
            merged[name] = environ[f"LOGBROKER_{name.upper()}"]
    for name in _SCALARS:
        value = environ.get(f"LOGBROKER_{name.upper()}")
        if value is not None:
            merged[name] = value
    for name, value in (flags or {}).items():
        if value is None:
            continue
        if name in _LIMIT_TYPES:
            limits[name] = value
        else:
            merged[name] = value
    merged["limits"] = limits
    settings = _from_mapping(merged)
    for warning in short_token_warnings(settings):
        _log.warning("%s", warning)
    return settings


def short_token_warnings(settings: GatewaySettings) -> list[str]:
    """A warning for each configured token (and the ``peer_token``) shorter than
    :data:`MIN_TOKEN_CHARS`, naming its owner, never the token."""
    warnings = [
        f"the token of {grant.owner!r} is {len(token)} characters long: a token shorter "
        f"than {MIN_TOKEN_CHARS} characters can be guessed; give it at least "
        f"{MIN_TOKEN_CHARS} random ones (e.g. openssl rand -hex 16)"
        for token, grant in settings.tokens.items()
        if len(token) < MIN_TOKEN_CHARS
    ]
    if settings.peer_token is not None and len(settings.peer_token) < MIN_TOKEN_CHARS:
        warnings.append(
            f"peer_token is {len(settings.peer_token)} characters long: a token shorter than "
            f"{MIN_TOKEN_CHARS} characters can be guessed; give it at least {MIN_TOKEN_CHARS} "
            "random ones (e.g. openssl rand -hex 16)"
        )
    return warnings


def load_limits(*, config_file: Path | None = None, env: Mapping[str, str] | None = None) -> Limits:
    """The gateway's ``[limits]`` (the TOML file, then ``LOGBROKER_LIMITS_*``), for the tools
    that change a store the gateway serves (``logbroker topics``) within the same limits."""
    environ = os.environ if env is None else env
    _refuse_unknown_env(environ)
    raw = _env_limits(_config_file(config_file, environ), environ)
    unknown = set(raw) - set(_LIMIT_TYPES)
    if unknown:
        raise ConfigError(f"unknown limits: {', '.join(sorted(unknown))}")
    return Limits(**{k: _coerce(f"limits.{k}", v, _LIMIT_TYPES[k]) for k, v in raw.items()})


def _config_file(config_file: Path | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """The TOML file ``config_file`` or ``$LOGBROKER_CONFIG`` ({} without either)."""
    path = config_file or (
        Path(environ["LOGBROKER_CONFIG"]) if "LOGBROKER_CONFIG" in environ else None
    )
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _env_limits(merged: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The file's ``[limits]`` with ``LOGBROKER_LIMITS_<NAME>`` over them."""
    limits = merged.get("limits") or {}
    if not isinstance(limits, dict):
        raise ConfigError("limits must be a table")
    limits = dict(limits)
    for name in _LIMIT_TYPES:
        value = environ.get(f"LOGBROKER_LIMITS_{name.upper()}")
        if value is not None:
            limits[name] = value
    return limits


def _env_namespaces() -> dict[str, tuple[tuple[str, ...], str]]:
    """The ``LOGBROKER_<PREFIX>_*`` families that belong wholly to these settings: their
    known variables, and what else to say of the family."""
    scalars = [name.upper() for name in _SCALARS]

    def family(prefix: str) -> tuple[str, ...]:
        return tuple(f"LOGBROKER_{name}" for name in scalars if name.startswith(prefix))

    return {
        "LIMITS_": (tuple(f"LOGBROKER_LIMITS_{name.upper()}" for name in _LIMIT_TYPES), ""),
        "KAFKA_": (family("KAFKA_"), "; the [kafka] table is set in the config file only"),
        "SSL_": (family("SSL_"), ""),
        "GRAPHITE_": (family("GRAPHITE_"), ""),
        "TOKENS_": ((), "; tokens are set in the config file's [tokens] table only"),
    }


def _refuse_unknown_env(environ: Mapping[str, str]) -> None:
    """Refuse a misspelt setting: a ``LOGBROKER_LIMITS_*`` (``KAFKA_``, ``SSL_``,
    ``GRAPHITE_``, ``TOKENS_``) variable that names no setting.  The rest of the ``LOGBROKER_``
    namespace is shared with the other commands and the tests, so it is not checked."""
    for prefix, (known, note) in _env_namespaces().items():
        unknown = sorted(
            name for name in environ if name.startswith(f"LOGBROKER_{prefix}") and name not in known
        )
        if unknown:
            listed = ", ".join(known) if known else "none"
            raise ConfigError(
                f"unknown environment variable{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(unknown)}: the LOGBROKER_{prefix}* variables are {listed}{note}"
            )
