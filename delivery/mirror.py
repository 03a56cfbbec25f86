"""Cross-DC mirroring: copy every ``<prefix>*`` topic partition by partition, exactly once.

Partitions are copied one to one (partition p of the source to partition p of the destination)
and messages are never mixed or reordered.  Where Logbroker saved two offsets per partition
every 60 s and reconciled them with the partitions' sizes after a failure, the destination
here keeps the next source offset it expects in the partition's state area, updated in the
same transaction as the append.  An append that does not start exactly there is refused with
the expected offset, so a mirror that crashed, restarted, or raced another mirror resumes
exactly where the destination's log ends: no duplicates, no loss.

Two things break the one-to-one copy, and both are handled in the open.  Records the source's
retention dropped before they were copied are lost: the mirror tells the destination
("dropped up to X"), which moves its expected offset forward under the lock and records the
gap, and both log it and count it.  A source topic deleted and created again has a new topic id
and offsets starting over: the mirror starts it over too, and the destination accepts a first
copy only from the source's start offset, so it can never begin in the middle.

Legacy commit markers name their data record by offset; offsets differ between the
installations, so the destination rewrites the marker to the data record's new offset (it
remembers where each copied legacy data record went).

Copying into the wrong installation cannot be undone, so the mirror asks both gateways which
installation they belong to (``/healthz``'s ``installation``) before its first copy and again
after every outage (a URL may reach another gateway then): the same installation at both ends
would read back every record it appends and copy it again, for ever.  The destination itself
refuses appends into the topics of its own DC, which its gateways write.

Offsets need not be dense on either side (on Kafka, transaction markers take offsets too): an
append says from which source offset its fetch started and where the next fetch starts, and
the destination checks the first against what it expects and moves to the second.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from audit.publisher import AuditPublisher
from audit.records import is_audit_topic
from audit.sinks import start_http_publisher
from audit.windows import WindowCounts, count_lines, window_start
from delivery.envelope_view import NotAnEnvelope, view
from delivery.framing import MAGIC, decode_binary
from delivery.installations import gateway_said
from delivery.legacy_txn import validate_txn_id
from delivery.partition_reader import check_max_bytes
from delivery.pull_client import GatewayUnavailable, PullClient, RequestRefused, corrupt_of
from log_store.errors import BadRequest, CorruptData, InvalidTopicName, LogbrokerError
from log_store.interface import LogStore, PartitionState
from log_store.topic_names import validate_topic_name
from session_dedup.envelope import EnvelopeWriter
from session_dedup.source import MAX_SEQNO, source_meta

_log = logging.getLogger(__name__)
_STATE_PREFIX = "mirror/"
_DISCOVER_S = 5.0
_STATUS_S = 5.0
REPLICA_MEDIA_TYPE = "application/x-logbroker-records"


class MirrorGap(BadRequest):
    """A replica append that does not start at the source offset the destination expects."""

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        self.expected = expected


@dataclass(frozen=True)
class ReplicaPosition:
    next_source_offset: int | None
    next_dest_offset: int | None
    dropped_offsets: int = 0
    """Source offsets the source's retention dropped before they were copied."""
    gaps: tuple[tuple[int, int], ...] = ()
    """The most recent such ranges, [from, to) in source offsets."""
    audit: dict[int, list[int]] | None = None
    """Messages and lines copied so far per window of create time (the audit's mirror tier),
    committed with the data they count: into this partition from every source topic so far
    (see :data:`_TOTALS_KEY`)."""


_MAX_GAPS_KEPT = 20


def _position(doc: dict[str, Any] | None) -> ReplicaPosition:
    if doc is None:
        return ReplicaPosition(None, None)
    next_dest = doc.get("next_dest")
    return ReplicaPosition(
        int(doc["next_source"]),
        None if next_dest is None else int(next_dest),
        int(doc.get("dropped", 0)),
        tuple((int(a), int(b)) for a, b in doc.get("gaps", ())),
        {int(w): [int(m), int(n)] for w, (m, n) in doc.get("audit", {}).items()},
    )


def _load(state: PartitionState, key: str) -> dict[str, Any] | None:
    raw = state.get(key)
    return dict(json.loads(raw)) if raw else None


def replica_position(
    store: LogStore, topic: str, partition: int, source_id: str
) -> ReplicaPosition:
    raw = store.get_state(topic, partition, _STATE_PREFIX + source_id)
    position = _position(dict(json.loads(raw)) if raw else None)
    totals = store.get_state(topic, partition, _TOTALS_KEY)
    if totals:
        audit = {int(w): [int(m), int(n)] for w, (m, n) in json.loads(totals)["audit"].items()}
        position = replace(position, audit=audit)
    return position


def _legacy_key(source_id: str, source_offset: int) -> str:
    return f"{_STATE_PREFIX}{source_id}/legacy/{source_offset}"


def _rewrite_marker(value: bytes, dest_of: Any) -> bytes:
    """A legacy commit marker pointing at its data's offset in this installation.

    ``dest_of(source_offset)`` is where that source record was copied to (None: unknown).
    """
    try:
        env = view(value)
    except NotAnEnvelope:
        return value
    if env.kind != "legacy_commit":
        return value
    try:
        body = json.loads(env.data)
        copied_to = dest_of(int(body["data_offset"]))
    except (ValueError, KeyError, TypeError):
        return value
    if copied_to is None:
        return value
    body["data_offset"] = copied_to
    writer = EnvelopeWriter(
        source_id=env.source_id,
        server=env.server,
        file=env.file,
        log_type=env.log_type,
        codec=env.codec,
        kind=env.kind,
        txn_id=env.txn_id,
    )
    return writer.encode(env.seqno, env.create_time, env.write_time, json.dumps(body).encode())


class ReplicaRecords(list[tuple[int, bytes]]):
    """Source records (offset, value) of one replica append, and where their fetch started
    (``from_offset``) and where the next one starts (``next_offset``); both None in appends
    of mirrors that send consecutive offsets only.  ``audit``: the messages and lines of the
    records per window, ``[[window_start, messages, lines], ...]``, added to the partition's
    audit totals in the append's transaction."""

    from_offset: int | None = None
    next_offset: int | None = None
    audit: list[list[int]] | None = None


_AUDIT_WINDOWS_KEPT = 1008
"""A week of 10-minute windows of audit totals per mirrored partition."""

_TOTALS_KEY = "mirror-totals"
"""The audit totals of everything copied into the partition, from every source topic id.

A source topic made again (a topic deleted and created, an installation's store lost and
started empty) is a new source id, whose own totals start at zero; the mirror's audit
instance is named for the source's URL, and a total that started over would replace the
copies of the old topic, which the partition still holds.  These totals add both.  A
partition copied to before they were kept starts them from the totals of the source id of
its next append."""


def _add_audit(doc: dict[str, Any], audit: list[list[int]] | None) -> None:
    if not audit:
        return
    totals: dict[str, list[int]] = doc.setdefault("audit", {})
    for window, messages, lines in audit:
        counts = totals.setdefault(str(window), [0, 0])
        counts[0] += messages
        counts[1] += lines
    if len(totals) > _AUDIT_WINDOWS_KEPT:
        for old in sorted(totals, key=int)[: len(totals) - _AUDIT_WINDOWS_KEPT]:
            del totals[old]


def append_replica(
    store: LogStore,
    topic: str,
    partition: int,
    source_id: str,
    records: Sequence[tuple[int, bytes]],
    source_start: int,
) -> tuple[int, dict[int, list[int]]]:
    """Append source records (offset, value) exactly once; returns the next source offset
    and the partition's audit totals after the append (see :class:`ReplicaRecords`).

    Raises :class:`MirrorGap` (with the expected offset) if the append does not start where
    the destination expects: the recorded next offset, or for the first copy of this source
    the source partition's start offset ``source_start``, so a copy can never begin in the
    middle of a source.  Source offsets must increase (and be consecutive, unless the append
    says where its fetch started: see :class:`ReplicaRecords`).
    """
    if not records:
        raise BadRequest("no records to append")
    first = records[0][0]
    from_offset = getattr(records, "from_offset", None)
    next_offset = getattr(records, "next_offset", None)
    for i, (offset, _) in enumerate(records):
        if from_offset is None and offset != first + i:
            raise BadRequest("replica records must have consecutive source offsets")
        if i and offset <= records[i - 1][0]:
            raise BadRequest("replica records must have increasing source offsets")
    start = first if from_offset is None else from_offset
    if first < start:
        raise BadRequest("replica records start before the offset their fetch started at")
    last = records[-1][0]
    following = max(last + 1, next_offset or 0)
    key = _STATE_PREFIX + source_id
    batch_index = {offset: i for i, (offset, _) in enumerate(records)}
    audit = getattr(records, "audit", None)
    totals: dict[int, list[int]] = {}

    def fn(state: PartitionState) -> list[bytes]:
        doc = _load(state, key)
        expected = source_start if doc is None else int(doc["next_source"])
        if start != expected:
            raise MirrorGap(
                f"{topic}/{partition} expects source offset {expected}, got {start}", expected
            )
        doc = doc or {}
        dest_first = state.next_offset()

        def dest_of(source_offset: int) -> int | None:
            index = batch_index.get(source_offset)
            if index is not None:
                return dest_first + index  # one append: consecutive on every backend
            raw = state.get(_legacy_key(source_id, source_offset))
            return None if not raw else int.from_bytes(raw, "big")

        values = []
        for i, (offset, value) in enumerate(records):
            values.append(_rewrite_marker(value, dest_of))
            if _is_legacy_data(value):
                state.put(_legacy_key(source_id, offset), (dest_first + i).to_bytes(8, "big"))
        doc["next_source"] = following
        doc["next_dest"] = dest_first + len(records)
        copied = _load(state, _TOTALS_KEY)
        if copied is None and audit:
            copied = {"audit": {w: list(c) for w, c in doc.get("audit", {}).items()}}
        _add_audit(doc, audit)
        if copied is not None and audit:
            _add_audit(copied, audit)
            state.put(_TOTALS_KEY, json.dumps(copied).encode())
        totals.clear()
        totals.update({int(w): list(c) for w, c in (copied or doc).get("audit", {}).items()})
        state.put(key, json.dumps(doc).encode())
        return values

    store.transact(topic, partition, fn)
    return following, totals


def _is_legacy_data(value: bytes) -> bool:
    try:
        return view(value).kind == "legacy_data"
    except NotAnEnvelope:
        return False


def skip_dropped_source(
    store: LogStore, topic: str, partition: int, source_id: str, dropped_from: int, to: int
) -> tuple[ReplicaPosition, int]:
    """The source's retention dropped offsets below ``to`` before they were copied.

    Moves the expected source offset forward to ``to`` (never back) and records the gap, in
    the partition's lock, so every mirror of this source resumes after it.  ``dropped_from`` is
    where the caller stood; it names the gap only when this partition has no copy yet.
    Returns the new position and how many offsets this call skipped.
    """
    if to < 0 or dropped_from < 0:
        raise BadRequest("offsets must not be negative")
    key = _STATE_PREFIX + source_id
    box: list[tuple[ReplicaPosition, int]] = []

    def fn(state: PartitionState) -> list[bytes]:
        doc = _load(state, key)
        current = dropped_from if doc is None else int(doc["next_source"])
        skipped = max(0, to - current)
        doc = doc or {"next_dest": None}
        if skipped:
            doc["next_source"] = to
            doc["dropped"] = int(doc.get("dropped", 0)) + to - current
            doc["gaps"] = [*doc.get("gaps", []), [current, to]][-_MAX_GAPS_KEPT:]
            state.put(key, json.dumps(doc).encode())
        box.append((_position(doc if "next_source" in doc else None), skipped))
        return []

    store.transact(topic, partition, fn)
    return box[0]


def encode_replica_body(
    records: Sequence[tuple[int, bytes]],
    from_offset: int | None = None,
    next_offset: int | None = None,
    audit: list[list[int]] | None = None,
) -> bytes:
    """The body of a replica append: the binary read framing, one section."""
    fields: dict[str, Any] = {}
    if from_offset is not None:
        fields.update(from_offset=from_offset, next_offset=next_offset)
    if audit:
        fields["audit"] = audit
    meta = json.dumps(fields).encode()
    parts = [MAGIC, len(meta).to_bytes(2, "big"), meta, len(records).to_bytes(4, "big")]
    for offset, value in records:
        parts.append(offset.to_bytes(8, "big") + len(value).to_bytes(4, "big"))
        parts.append(value)
    return b"".join(parts)


def decode_replica_body(body: bytes) -> ReplicaRecords:
    sections = decode_binary(body)
    if len(sections) != 1:
        raise BadRequest("a replica append carries exactly one section")
    records = ReplicaRecords(sections[0].records)
    meta = sections[0].meta
    for name in ("from_offset", "next_offset"):
        value = meta.get(name)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise BadRequest(f"{name} must be a non-negative integer")
        setattr(records, name, value)
    audit = meta.get("audit")
    if audit is not None:
        # A window may start before 1970: a chunk's create time is any signed integer.
        if not isinstance(audit, list) or not all(
            isinstance(a, list)
            and len(a) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) for n in a)
            and a[1] >= 0
            and a[2] >= 0
            for a in audit
        ):
            raise BadRequest("audit must be a list of [window_start, messages, lines]")
        records.audit = audit
    return records


class BadReplicaRecord(BadRequest):
    """A mirrored record that no gateway of ``topic`` could have written."""


def check_replica_records(
    topic: str, records: Sequence[tuple[int, bytes]], max_data_bytes: int
) -> None:
    """Every record must be an envelope a gateway writes into ``topic``: valid source meta,
    the topic's log type, a seqno in range, data within the chunk limit, a valid transaction
    id.  A mirror only copies such records, so anything else is refused (nothing written).

    The text of the meta is held to the rules of every gateway version, and the create time
    is not checked: a record a gateway stored before it refused such text or such a time
    (a time outside ``0 .. MAX_CREATE_TIME_MS``, which the loader clamps) is copied as it is,
    or the mirror of its topic would stop there for good."""
    log_type = topic.split(".", 1)[-1]
    for offset, value in records:
        where = f"record at source offset {offset}"
        try:
            env = view(value)
            source_meta(
                log_type=env.log_type,
                source_id=env.source_id,
                server=env.server,
                file=env.file,
                codec=env.codec,
                copied=True,
            )
            if env.txn_id is not None:
                validate_txn_id(env.txn_id)
        except (NotAnEnvelope, BadRequest) as exc:
            raise BadReplicaRecord(f"{where}: {exc}") from None
        if env.log_type != log_type:
            raise BadReplicaRecord(
                f"{where}: log type {env.log_type!r} does not belong in topic {topic!r}"
            )
        if not 1 <= env.seqno <= MAX_SEQNO:
            raise BadReplicaRecord(f"{where}: seqno {env.seqno} is outside 1 .. 2**63-1")
        if len(value) - env.data_start > max_data_bytes:
            raise BadReplicaRecord(
                f"{where}: data of {len(value) - env.data_start} bytes is over the chunk "
                f"limit of {max_data_bytes}"
            )


@dataclass
class MirrorStats:
    copied_messages: int = 0
    refused_gaps: int = 0
    dropped_offsets: int = 0
    """Source offsets lost to the source's retention before they could be copied."""


@dataclass(frozen=True)
class MirrorProgress:
    lag: dict[tuple[str, int], int]
    """Source messages (offsets) not yet copied, per (topic, partition)."""
    copied_by_topic: dict[str, int]
    stats: MirrorStats


def audit_of(records: Sequence[tuple[int, bytes]]) -> list[list[int]]:
    """Messages and lines of data records per window: ``[[window_start, messages, lines]]``."""
    per_window: dict[int, list[int]] = {}
    for _, value in records:
        try:
            env = view(value)
        except NotAnEnvelope:
            continue
        if env.kind not in ("chunk", "legacy_data"):
            continue
        counts = per_window.setdefault(window_start(env.create_time), [0, 0])
        counts[0] += 1
        counts[1] += count_lines(env.codec, env.data)
    return [[w, m, n] for w, (m, n) in sorted(per_window.items())]


class MirrorStuck(LogbrokerError):
    """The destination keeps refusing appends at the offset it asks for itself."""


class WrongDestination(LogbrokerError):
    """The destination is the source's own installation, or the installation of the DC whose
    topics are copied: nothing is copied."""


_HEALTHZ_TIMEOUT_S = 10.0


def _healthz(side: str, url: str) -> dict[str, Any]:
    """What the gateway at ``url`` says of itself (``GET /healthz``).  GatewayUnavailable if
    it does not answer (or answers a 5xx, 408, 429); :class:`NotAGateway` for an answer no
    gateway gives (a 404 of a proxy with nothing behind it)."""
    try:
        response = httpx.get(
            url.rstrip("/") + "/healthz",
            timeout=_HEALTHZ_TIMEOUT_S,
            verify=not url.startswith("http://"),
        )
    except httpx.HTTPError as exc:
        raise GatewayUnavailable(f"{side} {url}: {type(exc).__name__}: {exc}") from None
    said = gateway_said(f"the {side} {url}", response)
    if said is None:
        raise GatewayUnavailable(f"{side} {url} answered {response.status_code}")
    return said


class DestinationRefused(RequestRefused):
    """The destination gateway answered 4xx (a :class:`RequestRefused` of the source's
    gateway is the source's)."""


def check_gateway_url(option: str, url: str) -> None:
    """BadRequest naming ``option`` unless ``url`` is an http:// or https:// URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"{option} {url!r} is not an http:// or https:// URL of a gateway")


def check_prefix(prefix: str) -> None:
    """BadRequest unless some topic name can start with ``prefix``."""
    if not prefix:
        raise BadRequest("prefix must not be empty (e.g. dc1.)")
    try:
        validate_topic_name(prefix + "x")
    except InvalidTopicName:
        raise BadRequest(
            f"no topic can start with prefix {prefix!r}: topic names are <dc>.<log_type> of "
            "[a-z0-9._-], starting with a letter or digit (e.g. dc1.)"
        ) from None


# A destination that answers the same expected offset this many times in a row, although the
# mirror moved there each time, is not racing another mirror: it is a loop.
_MAX_SAME_REFUSALS = 3


def _check_state_dir(state_dir: Path) -> None:
    """Refuse a state dir the status file cannot be written in, before anything is copied."""
    probe = state_dir / "mirror-status.json.tmp"
    if state_dir.exists() and not state_dir.is_dir():
        raise BadRequest(f"cannot use state dir {state_dir}: it is not a directory")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("{}")
        probe.unlink()
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and exc.filename != str(state_dir) else ""
        raise BadRequest(
            f"cannot use state dir {state_dir}: {exc.strerror or exc}{where}"
        ) from None


class Mirror:
    """Copies ``prefix`` topics from one installation to another until stopped."""

    def __init__(
        self,
        source_url: str,
        dest_url: str,
        prefix: str,
        *,
        state_dir: Path | None = None,
        max_bytes: int = 4 * 1024 * 1024,
        token: str | None = None,
    ) -> None:
        check_prefix(prefix)
        check_gateway_url("source", source_url)
        check_gateway_url("destination", dest_url)
        self._max_bytes = check_max_bytes(max_bytes)
        if state_dir is not None:
            _check_state_dir(state_dir)
        self._source = PullClient(source_url, token=token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._dest = httpx.Client(
            base_url=dest_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(60.0)
        )
        self._prefix = prefix
        self._state_dir = state_dir
        self._positions: dict[tuple[str, int], int] = {}
        self._skipped: dict[tuple[str, int], int] = {}
        """Fetch positions past offsets that held no record, ahead of ``_positions``."""
        self._starts: dict[tuple[str, int], int] = {}
        self._refusals: dict[tuple[str, int], tuple[int, int]] = {}
        self._topic_ids: dict[str, str] = {}
        self._partitions: dict[str, int] = {}
        self._last_discovery = 0.0
        self._last_status = 0.0
        self._source_ends: dict[tuple[str, int], int] = {}
        """The source's end offset per partition, as its last answer said (for the lag)."""
        self._copied_by_topic: dict[str, int] = {}
        self._last_report = 0.0
        self._report_refused = False
        self.name = f"{socket.gethostname()}:{prefix}:{source_url}"
        """How the destination's dashboard names this mirror (its lag reports)."""
        self.stats = MirrorStats()
        self._dest_url = dest_url
        self._token = token
        self._source_name = urlsplit(source_url).netloc or source_url
        self._source_url = source_url
        self.audit = WindowCounts()
        """The mirror tier's counts: the destination's totals, which commit with the data."""
        self._audit_totals: dict[tuple[str, int], dict[str, list[int]]] = {}
        self.found_topics = False
        """Whether the source has had a topic of the prefix (that the token may read)."""
        self._said_no_topics = False
        self.corrupt: dict[tuple[str, int], tuple[int, CorruptData]] = {}
        """Partitions the copy stopped, with the source offset it stopped at: the source
        cannot read past it (a batch there fails its checksum).  The others go on; nothing
        is skipped."""
        self._ends_checked = False
        """Whether both gateways were asked which installation they belong to since the
        last outage (:meth:`check_ends`)."""
        self._said_unnamed = False

    def no_topics_reason(self) -> str:
        """What the source has instead of a topic of the prefix (for a user who mistyped)."""
        try:
            names = self._source.list_topics()
        except (GatewayUnavailable, RequestRefused):
            names = []
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        there = f"topics there: {shown}" if names else "it has no topic this token may read"
        return f"no topic at the source {self._source_url} starts with {self._prefix!r} ({there})"

    def close(self) -> None:
        self._source.close()
        self._dest.close()

    def check_ends(self) -> None:
        """Raise :class:`WrongDestination` if the destination is the source's installation
        (both gateways' ``/healthz`` name the same ``installation``), or the installation
        of the DC the prefix names (its ``dc`` + "." starts the prefix).

        A gateway too old to name its installation leaves only the URLs' comparison, which
        the command makes: that is said once.  GatewayUnavailable if either does not answer
        or cannot name it yet.
        """
        source = _healthz("source", self._source_url)
        dest = _healthz("destination", self._dest_url)
        for side, url, said in (
            ("source", self._source_url, source),
            ("destination", self._dest_url, dest),
        ):
            if "installation" in said and not isinstance(said["installation"], str):
                raise GatewayUnavailable(
                    f"the {side} {url} cannot name its installation yet (its store does not answer)"
                )
        if "installation" in source and "installation" in dest:
            if source["installation"] == dest["installation"]:
                raise WrongDestination(
                    f"--from and --to are the same installation ({self._source_url} and "
                    f"{self._dest_url} both belong to installation {source['installation']}): "
                    "the mirror would read back what it appends and copy it again, for ever"
                )
        elif not self._said_unnamed:
            self._said_unnamed = True
            _log.warning(
                "mirror: the %s does not name its installation (an older gateway); only "
                "the URLs tell that the source and the destination are not the same",
                " or the ".join(
                    side
                    for side, said in (("source", source), ("destination", dest))
                    if "installation" not in said
                ),
            )
        dc = dest.get("dc")
        if isinstance(dc, str) and self._prefix.startswith(dc + "."):
            raise WrongDestination(
                f"the destination {self._dest_url} is the installation of DC {dc}, whose "
                f"gateways write the {dc}.* topics: mirroring --prefix {self._prefix} into it "
                "would mix copies into them; mirror into an installation of another DC"
            )
        self._ends_checked = True

    def _discover(self) -> None:
        topics = set(self._source.list_topics(self._prefix, include_audit=True))
        if topics:
            self.found_topics = True
        elif not self.found_topics and not self._said_no_topics:
            self._said_no_topics = True
            _log.warning("mirror: %s; waiting for one", self.no_topics_reason())
        for gone in set(self._topic_ids) - topics:
            self._forget(gone)
        for topic in sorted(topics):
            try:
                info = self._source.describe(topic)
            except RequestRefused as exc:
                if exc.error == "unknown_topic":
                    self._forget(topic)  # deleted since the listing
                    continue
                raise
            known = self._topic_ids.get(topic)
            if known is not None and known != info["topic_id"]:
                # Positions are source offsets of the old topic; the new one starts over.
                _log.warning(
                    "%s: the source topic was created again (id %s, was %s); copying the new "
                    "topic from its start",
                    topic,
                    info["topic_id"],
                    known,
                )
                self._forget(topic)
            self._topic_ids[topic] = info["topic_id"]
            self._partitions[topic] = len(info["partitions"])
            for p in info["partitions"]:
                tp = (topic, p["partition"])
                self._starts[tp] = int(p["start_offset"])
                self._source_ends[tp] = int(p["end_offset"])
                if tp not in self._positions:
                    self._positions[tp] = self._resume_offset(topic, p["partition"], p)
        self._last_discovery = time.monotonic()

    def _forget(self, topic: str) -> None:
        self._topic_ids.pop(topic, None)
        self._partitions.pop(topic, None)
        for table in (
            self._positions,
            self._starts,
            self._refusals,
            self._skipped,
            self._source_ends,
            self.corrupt,  # a topic made again holds other data
        ):
            for tp in [tp for tp in table if tp[0] == topic]:
                del table[tp]

    def _replica_path(self, topic: str, partition: int) -> str:
        return f"/v1/replica/{topic}/partitions/{partition}"

    def _dest_call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._dest.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise GatewayUnavailable(f"destination: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise GatewayUnavailable(f"destination answered {response.status_code}")
        return response

    @staticmethod
    def _refused(response: httpx.Response) -> DestinationRefused:
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        return DestinationRefused(
            response.status_code,
            str(body.get("error", "http_error")),
            str(body.get("reason", response.text[:200])),
            body,
        )

    def _resume_offset(self, topic: str, partition: int, source_info: dict[str, Any]) -> int:
        response = self._dest_call(
            "GET",
            self._replica_path(topic, partition),
            params={"source": self._topic_ids[topic]},
        )
        if response.status_code == 200:
            body = response.json()
            self._keep_audit(topic, partition, body)
            expected = body["next_source_offset"]
            if expected is not None:
                return int(expected)
        elif response.status_code != 404:
            raise self._refused(response)
        return int(source_info["start_offset"])

    def step(self, wait_ms: int = 1000) -> int:
        """One round: fetch what is new in every partition and copy it; returns messages."""
        if not self._ends_checked:
            self.check_ends()
        if time.monotonic() - self._last_discovery >= _DISCOVER_S:
            self._discover()
        if not self._positions:
            time.sleep(min(wait_ms, 500) / 1000)
            return 0
        # where to fetch from: past offsets that held no record (transaction markers on
        # Kafka), which the destination still expects the next append to start at
        positions = [
            (t, p, max(o, self._skipped.get((t, p), o)))
            for (t, p), o in sorted(self._positions.items())
            if (t, p) not in self.corrupt
        ]
        if not positions:
            time.sleep(min(wait_ms, 500) / 1000)
            return 0
        try:
            fetched = self._fetch_raw(positions, wait_ms)
        except RequestRefused as exc:
            if exc.error == "offset_out_of_range":
                self._last_discovery = 0.0  # re-read the bounds on the next round
                self._skip_dropped(positions)
                return 0
            if exc.error == "unknown_topic":
                self._last_discovery = 0.0  # a source topic was deleted
                return 0
            raise
        unchanged = self._still_known({t for t, _, records, _ in fetched if records})
        copied = 0
        for topic, partition, records, next_offset in fetched:
            tp = (topic, partition)
            if tp not in self._positions:
                continue
            if not records:
                if next_offset is not None and next_offset > self._positions[tp]:
                    self._skipped[tp] = next_offset
                continue
            if topic not in unchanged:
                continue
            copied += self._append(topic, partition, records, next_offset)
        self._write_status()
        self._report_lag()
        return copied

    def _still_known(self, topics: set[str]) -> set[str]:
        """The topics whose source is still the one the positions belong to.

        Asked after the fetch: an unchanged id then proves the records came from that topic,
        not from a topic of the same name created since (whose offsets start over, so a copy
        under the old id would skip the new topic's first records).
        """
        unchanged = set()
        for topic in sorted(topics):
            try:
                topic_id = self._source.describe(topic)["topic_id"]
            except RequestRefused as exc:
                if exc.error != "unknown_topic":
                    raise
                topic_id = None
            if topic_id == self._topic_ids.get(topic):
                unchanged.add(topic)
            else:
                _log.warning("%s: the source topic changed during the fetch; starting over", topic)
                self._last_discovery = 0.0
        return unchanged

    def _fetch_raw(
        self, positions: Sequence[tuple[str, int, int]], wait_ms: int
    ) -> list[tuple[str, int, list[tuple[int, bytes]], int | None]]:
        sections = self._source.fetch_sections(
            positions, max_bytes=self._max_bytes, wait_ms=wait_ms, raw=True
        )
        for s in sections:
            if s.meta.get("end_offset") is not None:
                self._source_ends[(s.meta["topic"], s.meta["partition"])] = s.meta["end_offset"]
            damage = corrupt_of(s.meta)
            if damage is not None:
                tp = (damage.topic, damage.partition)
                stopped_at = int(s.meta["next_offset"])
                _log.error(
                    "mirror: %s/%d: stopped at source offset %d, the source cannot read past "
                    "it: %s",
                    *tp,
                    stopped_at,
                    damage,
                )
                self.corrupt[tp] = (stopped_at, damage)
        return [
            (s.meta["topic"], s.meta["partition"], s.records, s.meta.get("next_offset"))
            for s in sections
            if "error" not in s.meta
        ]

    def _skip_dropped(self, positions: Sequence[tuple[str, int, int]]) -> None:
        """Positions outside the source's offsets: below its start, retention dropped records
        that were never copied; the destination is told, so it expects the start from now on.
        Past its end under a new topic id, discovery starts the new topic over; under the same
        id, the destination's position cannot be right and the mirror stops."""
        described: dict[str, dict[str, Any]] = {}
        for topic, partition, offset in positions:
            if topic not in described:
                try:
                    described[topic] = self._source.describe(topic)
                except RequestRefused as exc:
                    if exc.error != "unknown_topic":
                        raise
                    self._forget(topic)
                    continue
            info = described[topic]
            if info["topic_id"] != self._topic_ids.get(topic):
                continue  # discovery, due next round, resets this topic
            for p in info["partitions"]:
                if p["partition"] != partition:
                    continue
                if offset < p["start_offset"]:
                    self._skip_to(topic, partition, offset, int(p["start_offset"]))
                elif offset > p["end_offset"]:
                    # Same topic id, so not a new topic: the destination claims records of this
                    # source that the source never had.  Starting over would resume there again.
                    raise MirrorStuck(
                        f"{topic}/{partition}: the destination expects source offset {offset}, "
                        f"past the source's end {p['end_offset']} (source topic id "
                        f"{info['topic_id']}); its copy does not come from this source"
                    )

    def _skip_to(self, topic: str, partition: int, offset: int, start: int) -> None:
        response = self._dest_call(
            "POST",
            self._replica_path(topic, partition) + "/dropped",
            params={
                "source": self._topic_ids[topic],
                "partitions": self._partitions[topic],
                "from": offset,
                "to": start,
            },
        )
        if response.status_code != 200:
            raise self._refused(response)
        body = response.json()
        skipped = int(body["skipped"])
        if skipped:
            self.stats.dropped_offsets += skipped
            _log.warning(
                "%s/%d: source offsets %d..%d were dropped by the source's retention before "
                "they were mirrored; %d messages are lost to the destination",
                topic,
                partition,
                start - skipped,
                start - 1,
                skipped,
            )
        self._starts[(topic, partition)] = start
        expected = body["next_source_offset"]
        self._positions[(topic, partition)] = start if expected is None else int(expected)

    def _append(
        self,
        topic: str,
        partition: int,
        records: list[tuple[int, bytes]],
        next_offset: int | None = None,
    ) -> int:
        tp = (topic, partition)
        response = self._dest_call(
            "POST",
            self._replica_path(topic, partition),
            params={
                "source": self._topic_ids[topic],
                "partitions": self._partitions[topic],
                "start": self._starts[tp],
            },
            content=encode_replica_body(
                records,
                from_offset=self._positions[tp],
                next_offset=max(next_offset or 0, records[-1][0] + 1),
                audit=None if is_audit_topic(topic) else audit_of(records),
            ),
            headers={"Content-Type": REPLICA_MEDIA_TYPE},
        )
        if response.status_code == 409 and response.json().get("error") == "mirror_gap":
            expected = int(response.json()["expected_source_offset"])
            last, times = self._refusals.get(tp, (-1, 0))
            times = times + 1 if last == expected else 1
            if times >= _MAX_SAME_REFUSALS:
                raise MirrorStuck(
                    f"{topic}/{partition}: the destination refused {times} appends in a row "
                    f"and expects source offset {expected} each time; the mirror sent "
                    f"{records[0][0]}"
                )
            self._refusals[tp] = (expected, times)
            _log.info("%s/%d: destination expects %d; resuming there", topic, partition, expected)
            self._positions[tp] = expected
            self._skipped.pop(tp, None)
            self.stats.refused_gaps += 1
            return 0
        if response.status_code != 200:
            raise self._refused(response)
        self._refusals.pop(tp, None)
        body = response.json()
        self._keep_audit(topic, partition, body)
        self._positions[tp] = int(body["next_source_offset"])
        self._skipped.pop(tp, None)
        self.stats.copied_messages += len(records)
        self._copied_by_topic[topic] = self._copied_by_topic.get(topic, 0) + len(records)
        return len(records)

    def progress(self) -> MirrorProgress:
        """Where the copy stands, per partition and topic (safe to call from another thread)."""
        positions = dict(self._positions)
        skipped = dict(self._skipped)
        ends = dict(self._source_ends)
        lag = {
            tp: max(0, ends.get(tp, pos) - max(pos, skipped.get(tp, pos)))
            for tp, pos in positions.items()
        }
        return MirrorProgress(
            lag=lag,
            copied_by_topic=dict(self._copied_by_topic),
            stats=replace(self.stats),
        )

    def _keep_audit(self, topic: str, partition: int, body: dict[str, Any]) -> None:
        totals = body.get("audit")
        if isinstance(totals, dict) and not is_audit_topic(topic):
            self._audit_totals[(topic, partition)] = totals

    def _audit_counts(self) -> None:
        """The partitions' totals, summed per (topic, window), as the counts to publish."""
        sums: dict[tuple[str, int], list[int]] = {}
        for (topic, _), totals in list(self._audit_totals.items()):
            for window, (messages, lines) in totals.items():
                counts = sums.setdefault((topic, int(window)), [0, 0])
                counts[0] += messages
                counts[1] += lines
        for (topic, start), (messages, lines) in sums.items():
            self.audit.set(topic, start, messages, lines)

    def start_audit(self) -> AuditPublisher:
        """Publish the mirror tier's counts to the destination's audit topic until stopped.

        The instance is named for the source, not the process: the totals live in the
        destination with the data, so a restarted mirror publishes the same totals again.
        """
        return start_http_publisher(
            "mirror",
            self.audit,
            self._dest_url,
            token=self._token,
            instance=f"from-{self._source_name}",
            before_publish=self._audit_counts,
        )

    def _write_status(self) -> None:
        """An operator's view of the positions; the truth is in the destination's log."""
        if self._state_dir is None or time.monotonic() - self._last_status < _STATUS_S:
            return
        self._last_status = time.monotonic()
        status = {
            "prefix": self._prefix,
            "positions": {f"{t}/{p}": o for (t, p), o in sorted(self._positions.items())},
            "copied_messages": self.stats.copied_messages,
            "dropped_offsets": self.stats.dropped_offsets,
            "corrupt": {f"{t}/{p}": str(e) for (t, p), (_, e) in sorted(self.corrupt.items())},
            "written_at_ms": int(time.time() * 1000),
        }
        try:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            tmp = self._state_dir / "mirror-status.json.tmp"
            tmp.write_text(json.dumps(status, indent=1))
            tmp.replace(self._state_dir / "mirror-status.json")
        except OSError as exc:
            # only the operators' view: the copy goes on (its positions are the destination's)
            _log.warning("mirror: cannot write the status in %s: %s", self._state_dir, exc)

    def _report_lag(self) -> None:
        """Tell the destination how far behind each partition is (``POST /v1/mirrors/status``,
        shown by its dashboard).  Never retried: the next report replaces a lost one."""
        if time.monotonic() - self._last_report < _STATUS_S:
            return
        self._last_report = time.monotonic()
        partitions = [
            {
                "topic": t,
                "partition": p,
                "position": max(o, self._skipped.get((t, p), o)),
                "source_end_offset": self._source_ends[(t, p)],
            }
            for (t, p), o in sorted(self._positions.items())
            if (t, p) in self._source_ends
        ]
        body = {"client": self.name, "host": socket.gethostname(), "partitions": partitions}
        try:
            answer = self._dest.post("/v1/mirrors/status", json=body, timeout=5.0)
        except httpx.HTTPError as exc:
            _log.debug("mirror: lag report failed: %s", exc)
            return
        if answer.status_code != 200 and not self._report_refused:
            self._report_refused = True  # an older gateway (404): say it once
            _log.info("mirror: the destination refused the lag report (%d)", answer.status_code)

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        """Copy until ``stop`` is set (or nothing new came for ``idle_exit_s``)."""
        publisher = self.start_audit()
        try:
            self._copy_until(stop, idle_exit_s)
        finally:
            publisher.stop()

    def _copy_until(self, stop: threading.Event, idle_exit_s: float | None) -> None:
        last_new = time.monotonic()
        while not stop.is_set():
            try:
                copied = self.step()
            except GatewayUnavailable as exc:
                self._ends_checked = False  # the URLs may reach other gateways now
                if idle_exit_s is not None and time.monotonic() - last_new >= idle_exit_s:
                    raise GatewayUnavailable(
                        f"{exc}; still unavailable after {idle_exit_s:g} s without new data"
                    ) from None
                _log.warning("mirror: %s; retrying", exc)
                time.sleep(1.0)
                continue
            if copied:
                last_new = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - last_new >= idle_exit_s:
                break
        self._last_status = 0.0
        self._write_status()
        self._last_report = 0.0  # the positions it stopped at: the dashboard shows them
        self._report_lag()
