"""What clients report about themselves: push-clients their lag per file, mirrors theirs per
partition (``POST /v1/clients/status``, ``POST /v1/mirrors/status``).

Only a client knows how far behind it is: a push-client knows the size of the files it tails,
a mirror the end offsets of its source.  Each reports every few seconds; the gateway keeps the
last report of each client in the store's internal state (one document per client plus an
index), so every worker and every gateway over the same store shows the same reports.  A
report is a view for operators, never a position: nothing is delivered or skipped because of
it.

Bounded: at most :data:`MAX_CLIENTS` clients, :data:`MAX_ROWS` rows per report, of which the
first :data:`MAX_REPORT_BYTES` (as JSON) are kept and the rest only counted (``left_out``; a
push-client sends the files most behind first), a phase cut at :data:`MAX_PHASE` characters,
and a client silent for :data:`FORGET_AFTER_S` is dropped from the index.  Over
:data:`MAX_CLIENTS`, the least recently reporting client of the owner (token) with the most
clients is forgotten: a token reporting under ever new client names pushes out its own
reports, never another tenant's (a tenant's hosts share its token, so a cap per token would
hide a large fleet).  The reports one owner keeps are also bounded in bytes
(:data:`MAX_OWNER_BYTES`): past it, that owner's least recently reporting clients are
forgotten, whatever the others hold.  So the store holds at most ``MAX_CLIENTS *
MAX_REPORT_BYTES`` (32 MiB) of reports, and one token at most :data:`MAX_OWNER_BYTES`.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from delivery.internal_state import Doc, InternalState
from log_store.errors import BadRequest

MAX_CLIENTS = 1000
MAX_ROWS = 500
"""Rows a report may carry (a push-client sends at most this many files: the most behind)."""
MAX_REPORT_BYTES = 32 * 1024
"""Rows kept of one report, as JSON: some 150 files of ordinary paths; the rest are counted."""
MAX_OWNER_BYTES = 4 * 1024 * 1024
"""Reports kept of one owner (token) in all: 128 reports at their largest, thousands of hosts
with a few files each."""
MAX_PHASE = 256
"""A file's phase (a state and an error message) is cut to this many characters."""
FORGET_AFTER_S = 15 * 60.0
_INDEX_KEY = "clients-index"
_MAX_TEXT = 1024
_ERRNO = re.compile(r"E[A-Z0-9]{1,31}")

ClientKind = Literal["push", "mirror"]


@dataclass(frozen=True)
class ClientReport:
    """One client's last report: who, when, and its rows (one per file or partition)."""

    kind: ClientKind
    client: str
    host: str
    reported_ms: int
    owner: str | None
    rows: list[dict[str, Any]]
    left_out: int = 0
    """Rows of the report past :data:`MAX_REPORT_BYTES`: counted, not kept."""

    def to_json(self) -> Doc:
        return {
            "kind": self.kind,
            "client": self.client,
            "host": self.host,
            "reported_ms": self.reported_ms,
            "owner": self.owner,
            "rows": self.rows,
            "left_out": self.left_out,
        }

    @classmethod
    def from_json(cls, raw: Doc) -> ClientReport:
        return cls(
            raw["kind"],
            raw["client"],
            raw["host"],
            raw["reported_ms"],
            raw["owner"],
            raw["rows"],
            raw.get("left_out", 0),
        )


def _within_bytes(rows: list[Doc], limit: int) -> tuple[list[Doc], int]:
    """The first of ``rows`` whose JSON fits in ``limit`` bytes, and how many are left out."""
    size = 2  # the list's brackets
    for i, row in enumerate(rows):
        size += len(orjson.dumps(row)) + 1
        if size > limit:
            return rows[:i], len(rows) - i
    return rows, 0


def _text(raw: Any, name: str, *, required: bool = True) -> str:
    if raw is None and not required:
        return ""
    if not isinstance(raw, str) or (required and not raw) or len(raw) > _MAX_TEXT:
        raise BadRequest(f"{name} must be a string of 1..{_MAX_TEXT} characters")
    return raw


def _phase(raw: Any, name: str) -> str:
    """A file's phase, cut to :data:`MAX_PHASE` characters (it carries an error message, whose
    length a client does not choose: cutting it keeps the report)."""
    text = _text(raw, name, required=False)
    return text if len(text) <= MAX_PHASE else text[: MAX_PHASE - 1] + "…"


def _errno(raw: Any, name: str) -> str | None:
    """A symbolic errno (``EACCES``), or None for none."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or not _ERRNO.fullmatch(raw):
        raise BadRequest(f"{name} must be a symbolic errno such as EACCES, or null")
    return raw


def _count(raw: Any, name: str, *, optional: bool = False) -> int | None:
    if raw is None and optional:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 0:
        raise BadRequest(f"{name} must be a non-negative integer")
    return raw


def _seconds(raw: Any, name: str) -> float:
    if not isinstance(raw, int | float) or isinstance(raw, bool) or not 0 <= raw < 1e10:
        raise BadRequest(f"{name} must be a non-negative number of seconds")
    return float(raw)


def push_rows(body: Doc) -> list[dict[str, Any]]:
    """The rows of a push-client's report, validated: ``files`` of
    ``{path, log_type, size, acked, lag_bytes, lag_s, phase, errno}``; ``errno`` is what is
    wrong with the file (said in ``phase``) as a symbolic errno, None when nothing is or
    from a client too old to send it."""
    files = body.get("files")
    if not isinstance(files, list) or len(files) > MAX_ROWS:
        raise BadRequest(f"files must be a list of at most {MAX_ROWS} files")
    rows = []
    for i, raw in enumerate(files):
        if not isinstance(raw, dict):
            raise BadRequest(f"files[{i}] must be an object")
        rows.append(
            {
                "path": _text(raw.get("path"), f"files[{i}].path"),
                "log_type": _text(raw.get("log_type"), f"files[{i}].log_type"),
                "size": _count(raw.get("size"), f"files[{i}].size"),
                "acked": _count(raw.get("acked"), f"files[{i}].acked"),
                "lag_bytes": _count(raw.get("lag_bytes"), f"files[{i}].lag_bytes"),
                "lag_s": _seconds(raw.get("lag_s", 0), f"files[{i}].lag_s"),
                "phase": _phase(raw.get("phase"), f"files[{i}].phase"),
                "errno": _errno(raw.get("errno"), f"files[{i}].errno"),
            }
        )
    return rows


def mirror_rows(body: Doc) -> list[dict[str, Any]]:
    """The rows of a mirror's report, validated: ``partitions`` of
    ``{topic, partition, position, source_end_offset}`` (topics as written here)."""
    partitions = body.get("partitions")
    if not isinstance(partitions, list) or len(partitions) > MAX_ROWS:
        raise BadRequest(f"partitions must be a list of at most {MAX_ROWS} partitions")
    rows = []
    for i, raw in enumerate(partitions):
        if not isinstance(raw, dict):
            raise BadRequest(f"partitions[{i}] must be an object")
        position = _count(raw.get("position"), f"partitions[{i}].position")
        end = _count(raw.get("source_end_offset"), f"partitions[{i}].source_end_offset")
        assert position is not None and end is not None
        rows.append(
            {
                "topic": _text(raw.get("topic"), f"partitions[{i}].topic"),
                "partition": _count(raw.get("partition"), f"partitions[{i}].partition"),
                "position": position,
                "source_end_offset": end,
                "lag": max(0, end - position),
            }
        )
    return rows


class ClientReports:
    """The last report of each client, kept in the store's internal state."""

    def __init__(self, state: InternalState, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._clock = clock

    def record(
        self, kind: ClientKind, client: object, host: object, owner: str | None, rows: list[Doc]
    ) -> None:
        """Keep ``rows`` as the last report of the client named ``client`` (a non-empty
        string, else :class:`BadRequest`) of ``owner``, replacing that owner's one before;
        the rows past :data:`MAX_REPORT_BYTES` are only counted."""
        name = _text(client, "client")
        host_name = _text(host, "host", required=False)
        now_ms = int(self._clock() * 1000)
        kept, left_out = _within_bytes(rows, MAX_REPORT_BYTES)
        report = ClientReport(kind, name, host_name, now_ms, owner, kept, left_out)
        document = report.to_json()
        size = len(orjson.dumps(document))
        key = _client_key(kind, owner, name)
        self._state.update(key, lambda _old: (document, None))
        index = self._state.get(_INDEX_KEY) or {}
        seen = index.get("clients", {}).get(key)
        # The index is rewritten only for a new client, a stale entry or a report whose size
        # changed much: one write per report, mostly.
        known_size = int(index.get("bytes", {}).get(key, -1))
        if (
            seen is None
            or now_ms - int(seen) > FORGET_AFTER_S * 1000 / 4
            or abs(size - known_size) > MAX_REPORT_BYTES / 8
        ):
            dropped = self._state.update(
                _INDEX_KEY, lambda doc: self._indexed(doc, key, owner or "", now_ms, size)
            )
            # A client the index forgets is deleted too: otherwise every client name ever
            # reported would keep its document (up to MAX_ROWS rows) in the store for good.
            for gone, indexed_ms in dropped.items():
                self._state.update(gone, functools.partial(_unless_newer, indexed_ms))

    def _indexed(
        self, doc: Doc | None, key: str, owner: str, now_ms: int, size: int
    ) -> tuple[Doc, dict[str, int]]:
        """The index with ``key`` reported at ``now_ms`` (``size`` bytes), and the clients it
        forgot (by the time of their last report it had)."""
        before: dict[str, int] = dict((doc or {}).get("clients", {}))
        # an index written before owners were kept in it: its clients count as one owner's
        owners: dict[str, str] = {**(doc or {}).get("owners", {}), key: owner}
        # ... and before sizes were: its clients count as small until they report again
        sizes: dict[str, int] = {**(doc or {}).get("bytes", {}), key: size}
        clients = {**before, key: now_ms}
        oldest_kept = now_ms - int(FORGET_AFTER_S * 1000)
        clients = {k: t for k, t in clients.items() if t >= oldest_kept}
        clients = _within_owner_bytes(clients, owners, sizes, key)
        if len(clients) > MAX_CLIENTS:
            clients = _fair_share(clients, owners, MAX_CLIENTS)
        dropped = {k: t for k, t in before.items() if k not in clients}
        kept_owners = {k: owners.get(k, "") for k in clients}
        kept_sizes = {k: sizes.get(k, 0) for k in clients}
        return {"clients": clients, "owners": kept_owners, "bytes": kept_sizes}, dropped

    def reports(self, kind: ClientKind) -> list[ClientReport]:
        """The last report of every client of ``kind`` heard from recently, by client name."""
        now_ms = int(self._clock() * 1000)
        oldest_kept = now_ms - int(FORGET_AFTER_S * 1000)
        index = (self._state.get(_INDEX_KEY) or {}).get("clients", {})
        out = []
        for key in sorted(index):
            if not key.startswith(f"client-status/{kind}/"):
                continue
            raw = self._state.get(key)
            if raw is not None and raw["reported_ms"] >= oldest_kept:
                out.append(ClientReport.from_json(raw))
        return out


def _fair_share(clients: dict[str, int], owners: dict[str, str], limit: int) -> dict[str, int]:
    """``clients`` (key -> last report) cut to ``limit``: each time, the least recently
    reporting client of the owner that holds the most is dropped."""
    by_owner: dict[str, list[str]] = {}
    for key in sorted(clients, key=clients.__getitem__, reverse=True):  # newest first
        by_owner.setdefault(owners.get(key, ""), []).append(key)
    kept = dict(clients)
    while len(kept) > limit:
        largest = max(by_owner.values(), key=len)
        kept.pop(largest.pop())
    return kept


def _within_owner_bytes(
    clients: dict[str, int], owners: dict[str, str], sizes: dict[str, int], newest: str
) -> dict[str, int]:
    """``clients`` without the least recently reporting ones of ``newest``'s owner while that
    owner's reports add up to more than :data:`MAX_OWNER_BYTES` (``newest`` itself stays)."""
    owner = owners.get(newest, "")
    own = sorted(
        (k for k in clients if owners.get(k, "") == owner and k != newest),
        key=clients.__getitem__,
    )  # oldest first
    total = sum(sizes.get(k, 0) for k in own) + sizes.get(newest, 0)
    kept = dict(clients)
    for key in own:
        if total <= MAX_OWNER_BYTES:
            break
        total -= sizes.get(key, 0)
        kept.pop(key)
    return kept


def _unless_newer(indexed_ms: int, doc: Doc | None) -> tuple[Doc | None, None]:
    """Delete a forgotten client's report, unless it reported again since it was forgotten."""
    if doc is not None and int(doc.get("reported_ms", 0)) > indexed_ms:
        return doc, None
    return None, None


def _client_key(kind: ClientKind, owner: str | None, client: str) -> str:
    # A client name is free text: hashed into the key, kept readable in the document.  The
    # owner is part of the key, so a token reporting under another tenant's client name adds
    # a report of its own instead of replacing that tenant's.
    named = f"{owner or ''}\0{client}"
    digest = hashlib.sha256(named.encode("utf-8")).hexdigest()[:32]
    return f"client-status/{kind}/{digest}"
