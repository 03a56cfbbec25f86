"""The schema registry: versions of each structured log type's schema, kept in the log store.

Everything lives in the state area of one internal topic, ``logbroker-internal.schemas``
(partition 0), so it is as durable as the log and works the same on the embedded store and on
Kafka, for every gateway process over one store or one Kafka cluster:

``log_type/<log type>``
    JSON ``{"compatibility", "versions": [{"version", "id", "registered_ms"}]}``
``schema/<id>``
    the schema text of that id (immutable)
``log_types``
    JSON list of the structured log types

A registration is one store transaction: it reads the log type's versions, checks the new
schema against each under the log type's compatibility mode, and writes the new version, so
two gateways registering at once cannot both add a version that the other breaks.

Gateways cache what they read for :data:`CACHE_SECONDS`; a version registered through another
gateway process is used for validation by this one at most that long afterwards.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from log_store.errors import LimitReached, TopicExists, UnknownTopic
from log_store.interface import LogStore, PartitionState, TopicConfig
from schema_registry.avro_schema import AvroSchema, format_schema_id, parse
from schema_registry.compatibility import DEFAULT_MODE, Mode, compatibility_problems, parse_mode
from schema_registry.errors import IncompatibleSchema, UnknownSchema

REGISTRY_TOPIC = "logbroker-internal.schemas"
_PARTITION = 0
CACHE_SECONDS = 1.0
_MAX_CACHED_LOG_TYPES = 10_000
_LOG_TYPES_KEY = "log_types"
MAX_VERSIONS = 1000
MAX_LOG_TYPES = 10_000


def _log_type_key(log_type: str) -> str:
    return f"log_type/{log_type}"


def _schema_key(schema_id: int) -> str:
    return f"schema/{format_schema_id(schema_id)}"


@dataclass(frozen=True)
class SchemaVersion:
    """One registered version of a log type's schema."""

    log_type: str
    version: int
    schema: AvroSchema
    registered_ms: int

    @property
    def schema_id(self) -> int:
        return self.schema.schema_id

    def to_json(self, *, with_schema: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "log_type": self.log_type,
            "version": self.version,
            "id": self.schema.id_hex,
            "registered_ms": self.registered_ms,
        }
        if with_schema:
            doc["schema"] = orjson.loads(self.schema.text)
        return doc


@dataclass(frozen=True)
class StructuredLogType:
    """A structured log type: its compatibility mode and its versions, oldest first."""

    log_type: str
    compatibility: Mode
    versions: tuple[SchemaVersion, ...]

    @property
    def latest(self) -> SchemaVersion | None:
        return self.versions[-1] if self.versions else None

    def version(self, number: int) -> SchemaVersion:
        for v in self.versions:
            if v.version == number:
                return v
        raise UnknownSchema(f"log type {self.log_type!r} has no schema version {number}")


@dataclass(frozen=True)
class Registration:
    version: SchemaVersion
    created: bool
    """False: the same schema was already registered; its version is answered."""


class SchemaRegistry:
    """Reads and changes the registry; thread-safe.  ``store`` may be read-only for reads."""

    def __init__(
        self,
        store: LogStore,
        *,
        cache_seconds: float = CACHE_SECONDS,
        max_versions: int = MAX_VERSIONS,
        max_log_types: int = MAX_LOG_TYPES,
    ) -> None:
        """``max_versions``: versions one log type may have; ``max_log_types``: log types
        the registry may hold.  A change past either is refused with :class:`LimitReached`
        and changes nothing."""
        self._store = store
        self._max_versions = max_versions
        self._max_log_types = max_log_types
        self._cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._parsed: dict[int, AvroSchema] = {}
        self._log_types: dict[str, tuple[float, StructuredLogType | None]] = {}
        self._topic_ready = False

    # -- reading ---------------------------------------------------------------------------
    def _get(self, key: str) -> bytes | None:
        try:
            return self._store.get_state(REGISTRY_TOPIC, _PARTITION, key)
        except UnknownTopic:
            return None

    def _schema(self, schema_id: int, raw: bytes | None) -> AvroSchema:
        with self._lock:
            known = self._parsed.get(schema_id)
        if known is not None:
            return known
        if raw is None:
            raise UnknownSchema(f"no schema has id {format_schema_id(schema_id)}")
        # No depth bound: a schema registered before there was one still reads back.
        schema = parse(raw.decode("utf-8"), max_depth=None)
        with self._lock:
            self._parsed[schema_id] = schema
        return schema

    def schema_by_id(self, schema_id: int) -> AvroSchema:
        """The schema a record stamped with ``schema_id`` was written with."""
        with self._lock:
            known = self._parsed.get(schema_id)
        if known is not None:
            return known
        return self._schema(schema_id, self._get(_schema_key(schema_id)))

    def _build(self, log_type: str, doc: dict[str, Any], get: Any) -> StructuredLogType:
        versions = []
        for v in doc["versions"]:
            schema_id = int(v["id"], 16)
            with self._lock:
                schema = self._parsed.get(schema_id)
            if schema is None:
                schema = self._schema(schema_id, get(_schema_key(schema_id)))
            versions.append(SchemaVersion(log_type, v["version"], schema, v["registered_ms"]))
        return StructuredLogType(log_type, parse_mode(doc["compatibility"]), tuple(versions))

    def log_type(self, log_type: str, *, fresh: bool = False) -> StructuredLogType | None:
        """The log type's schemas, or ``None`` if it is not structured (no version yet and
        no compatibility set).  ``fresh=False`` may answer from a cache up to
        :data:`CACHE_SECONDS` old."""
        now = time.monotonic()
        if not fresh:
            with self._lock:
                cached = self._log_types.get(log_type)
            if cached is not None and now - cached[0] < self._cache_seconds:
                return cached[1]
        raw = self._get(_log_type_key(log_type))
        found = None if raw is None else self._build(log_type, orjson.loads(raw), self._get)
        with self._lock:
            if len(self._log_types) >= _MAX_CACHED_LOG_TYPES:
                self._log_types.clear()
            self._log_types[log_type] = (now, found)
        return found

    def known_unstructured(self, log_type: str) -> bool:
        """Whether the cache says, freshly enough, that ``log_type`` has no schema version."""
        with self._lock:
            cached = self._log_types.get(log_type)
        return (
            cached is not None
            and time.monotonic() - cached[0] < self._cache_seconds
            and (cached[1] is None or cached[1].latest is None)
        )

    def latest(self, log_type: str) -> SchemaVersion | None:
        """What a write of ``log_type`` is checked against (cached); ``None``: not structured."""
        found = self.log_type(log_type)
        return None if found is None else found.latest

    def structured_log_types(self) -> list[str]:
        raw = self._get(_LOG_TYPES_KEY)
        return [] if raw is None else list(orjson.loads(raw))

    # -- changing --------------------------------------------------------------------------
    def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        # Another process may create it between exist_ok's check and our create.
        with contextlib.suppress(TopicExists):
            self._store.create_topic(REGISTRY_TOPIC, TopicConfig(partitions=1), exist_ok=True)
        self._topic_ready = True

    def _change(self, log_type: str, change: Any) -> Any:
        """Run ``change(state, doc) -> (new doc, result)`` as one transaction; drop the cache."""
        self._ensure_topic()
        box: list[Any] = []

        def fn(state: PartitionState) -> Sequence[bytes]:
            key = _log_type_key(log_type)
            raw = state.get(key)
            doc = orjson.loads(raw) if raw else {"compatibility": DEFAULT_MODE, "versions": []}
            new, result = change(state, doc)
            if new is not None:
                state.put(key, orjson.dumps(new))
                if raw is None:
                    names = state.get(_LOG_TYPES_KEY)
                    listed = set(orjson.loads(names)) if names else set()
                    if log_type not in listed and len(listed) >= self._max_log_types:
                        raise LimitReached(
                            f"the schema registry holds {len(listed)} structured log types, "
                            f"its limit (limits.max_structured_log_types in the gateway's "
                            f"configuration); log type {log_type!r} was not added",
                            "max_structured_log_types",
                            self._max_log_types,
                        )
                    listed.add(log_type)
                    state.put(_LOG_TYPES_KEY, orjson.dumps(sorted(listed)))
            box.append(result)
            return []

        try:
            self._store.transact(REGISTRY_TOPIC, _PARTITION, fn)
        finally:
            with self._lock:
                self._log_types.pop(log_type, None)
        return box[-1]

    def register(self, log_type: str, schema: AvroSchema) -> Registration:
        """Add ``schema`` as the log type's next version, if its compatibility mode allows.

        Registering a schema the log type already has answers that version (``created``
        False).  Raises :class:`IncompatibleSchema` listing every rule the schema breaks.
        """
        now_ms = int(time.time() * 1000)

        def change(state: PartitionState, doc: dict[str, Any]) -> tuple[Any, Registration]:
            current = self._build(log_type, doc, state.get)
            for v in current.versions:
                if v.schema_id == schema.schema_id:
                    return None, Registration(v, created=False)
            if len(current.versions) >= self._max_versions:
                raise LimitReached(
                    f"log type {log_type!r} has {len(current.versions)} schema versions, its "
                    "limit (limits.max_schema_versions in the gateway's configuration); "
                    "nothing was registered",
                    "max_schema_versions",
                    self._max_versions,
                )
            existing = [(v.version, v.schema) for v in current.versions]
            problems = compatibility_problems(current.compatibility, schema, existing)
            if problems:
                raise IncompatibleSchema(
                    f"the schema breaks log type {log_type!r}'s compatibility mode "
                    f"{current.compatibility!r}: {problems[0]}"
                    + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                    problems,
                )
            number = current.versions[-1].version + 1 if current.versions else 1
            if state.get(_schema_key(schema.schema_id)) is None:
                state.put(_schema_key(schema.schema_id), schema.text.encode("utf-8"))
            doc["versions"].append(
                {"version": number, "id": schema.id_hex, "registered_ms": now_ms}
            )
            with self._lock:
                self._parsed[schema.schema_id] = schema
            return doc, Registration(SchemaVersion(log_type, number, schema, now_ms), True)

        registration: Registration = self._change(log_type, change)
        return registration

    def set_compatibility(self, log_type: str, mode: Mode) -> StructuredLogType:
        """Set the mode later registrations of ``log_type`` are checked under."""

        def change(state: PartitionState, doc: dict[str, Any]) -> tuple[Any, None]:
            doc["compatibility"] = mode
            return doc, None

        self._change(log_type, change)
        found = self.log_type(log_type, fresh=True)
        assert found is not None
        return found
