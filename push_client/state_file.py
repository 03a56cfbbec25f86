"""The local positions file: written atomically, never ahead of acks, corruption detected.

Layout: one line of JSON (the payload) and a second line ``sha256:<hex of the first line>``.
A file that is empty, cut short, or whose checksum does not match is *corrupt*: it is moved
aside (``state.json.corrupt-<ms>``) and the client starts from the gateway's last seqnos, which
are the truth anyway.  The file only ever holds positions the gateway acknowledged, so it can
lag the log (then the gateway's answer moves it forward) but never lead it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from log_store.errors import LogbrokerError

log = logging.getLogger("logbroker.push")

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 1 (before installations) reads as version 2 with the new fields at their defaults;
its sources keep the ids they were recorded with (which still hold the path)."""
STATE_NAME = "state.json"


class CorruptStateFile(LogbrokerError):
    """The state file exists but is empty, torn, does not match its checksum, or holds a
    field of the wrong type (an offset that is a string, a negative seqno)."""


@dataclass
class SourcePosition:
    """One source's last acknowledged position and where its file was last seen.

    ``acked`` is the frontier: every byte below it was acknowledged by some installation or
    lies in one of ``doubts`` (``[installation, start, end]``, see ``push_client.handover``);
    ``installation`` is where its newest data went.  ``source_id`` is kept as it was made:
    ids of earlier versions (with the path in them) stay valid after an upgrade.
    """

    source_id: str
    entry_path: str
    first_path: str
    path: str
    dev: int
    ino: int
    fingerprint: str
    generation: int
    log_type: str
    codec: str
    acked: int
    size: int = 0
    pending_since: float | None = None
    draining: bool = False
    installation: str = ""
    doubts: list[list[str | int]] = field(default_factory=list)


@dataclass
class RetiredSource:
    """A source that is finished: rotated away, deleted or truncated."""

    source_id: str
    dev: int
    ino: int
    fingerprint: str
    generation: int
    reason: str
    retired_at: float
    size: int = 0
    path: str = ""
    acked: int = 0
    log_type: str = ""
    """The log type it was shipped as ("" in state files of older versions)."""


@dataclass
class PushState:
    sources: dict[str, SourcePosition] = field(default_factory=dict)
    retired: list[RetiredSource] = field(default_factory=list)
    clean: bool = False
    """Written by a clean stop: every position is exact (nothing was acked after it)."""
    audit: dict[str, Any] | None = None
    """The audit counts of what was acknowledged up to these positions, as
    :class:`push_client.audit_publishing.PushAuditCounts` saves them (which also checks them
    when it reads them back: counts it cannot read cost the counts, not the positions).
    Earlier versions ignore the field."""
    saved_at: float = 0.0
    """When it was saved (wall clock; the file's modification time for a file of an earlier
    version): the last moment the client is known to have run.  A rotated file modified
    after that, at the next start, was written while the client was stopped (``FileSet``'s
    rotations while stopped).  Earlier versions ignore the field."""

    def to_json(self) -> bytes:
        payload: dict[str, Any] = {
            "version": STATE_VERSION,
            "clean": self.clean,
            "saved_at": self.saved_at,
            "sources": [asdict(s) for s in self.sources.values()],
            "retired": [asdict(r) for r in self.retired],
        }
        if self.audit is not None:
            payload["audit"] = self.audit
        try:
            return orjson.dumps(payload)
        except TypeError:
            # A path that is not UTF-8 (a Latin-1 file name) is a str with surrogate escapes,
            # which orjson refuses; the standard library writes them as \udcXX escapes,
            # which it reads back to the same path.
            return json.dumps(payload, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_json(cls, body: bytes) -> PushState:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = json.loads(body)  # the escapes of :meth:`to_json`'s fallback
        if not isinstance(payload, dict) or payload.get("version") not in READABLE_VERSIONS:
            raise CorruptStateFile("state file has an unknown version")
        clean = payload.get("clean", False)
        if not isinstance(clean, bool):
            raise CorruptStateFile(f"clean must be true or false, not {_shown(clean)}")
        sources = [
            SourcePosition(**_checked(raw, f"sources[{i}]", _SOURCE_FIELDS, SourcePosition))
            for i, raw in enumerate(_records(payload, "sources"))
        ]
        retired = [
            RetiredSource(**_checked(raw, f"retired[{i}]", _RETIRED_FIELDS, RetiredSource))
            for i, raw in enumerate(_records(payload, "retired"))
        ]
        audit = payload.get("audit")
        saved_at = payload.get("saved_at", 0.0)
        if not _is_seconds(saved_at):
            raise CorruptStateFile(f"saved_at must be {_TIME}, not {_shown(saved_at)}")
        return cls(
            {s.source_id: s for s in sources},
            retired,
            clean,
            audit if isinstance(audit, dict) else None,
            float(saved_at),
        )


_TEXT = "a string"
_COUNT = "a non-negative integer"
_OPTIONAL_TIME = "a number of seconds or null"
_TIME = "a number of seconds"
_FLAG = "true or false"
_DOUBTS = "a list of [installation, start, end] with 0 <= start <= end"
_SOURCE_FIELDS = {
    "source_id": _TEXT,
    "entry_path": _TEXT,
    "first_path": _TEXT,
    "path": _TEXT,
    "dev": _COUNT,
    "ino": _COUNT,
    "fingerprint": _TEXT,
    "generation": _COUNT,
    "log_type": _TEXT,
    "codec": _TEXT,
    "acked": _COUNT,
    "size": _COUNT,
    "pending_since": _OPTIONAL_TIME,
    "draining": _FLAG,
    "installation": _TEXT,
    "doubts": _DOUBTS,
}
_RETIRED_FIELDS = {
    "source_id": _TEXT,
    "dev": _COUNT,
    "ino": _COUNT,
    "fingerprint": _TEXT,
    "generation": _COUNT,
    "reason": _TEXT,
    "retired_at": _TIME,
    "size": _COUNT,
    "path": _TEXT,
    "acked": _COUNT,
    "log_type": _TEXT,
}


def _shown(value: Any) -> str:
    return repr(value)[:80]


def _records(payload: dict[str, Any], name: str) -> list[Any]:
    records = payload.get(name)
    if not isinstance(records, list):
        raise CorruptStateFile(f"{name} must be a list of records, not {_shown(records)}")
    return records


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e12


def _fits(value: Any, kind: str) -> bool:
    if kind == _TEXT:
        return isinstance(value, str)
    if kind == _COUNT:
        return _is_count(value)
    if kind == _TIME:
        return _is_seconds(value)
    if kind == _OPTIONAL_TIME:
        return value is None or _is_seconds(value)
    if kind == _FLAG:
        return isinstance(value, bool)
    return isinstance(value, list) and all(
        isinstance(d, list)
        and len(d) == 3
        and isinstance(d[0], str)
        and _is_count(d[1])
        and _is_count(d[2])
        and d[1] <= d[2]
        for d in value
    )


def _required(record_type: type) -> set[str]:
    return {
        f.name for f in fields(record_type) if f.default is MISSING and f.default_factory is MISSING
    }


def _checked(raw: Any, where: str, kinds: dict[str, str], record_type: type) -> dict[str, Any]:
    """``raw`` if it is a record with every field of the type it needs (a position read back
    as a string or a negative number would crash the loop or send wrong seqnos later: the
    file is corrupt, like a torn one), else raise :class:`CorruptStateFile` naming the field."""
    if not isinstance(raw, dict):
        raise CorruptStateFile(f"{where} must be a record, not {_shown(raw)}")
    missing = sorted(_required(record_type) - set(raw))
    if missing:
        raise CorruptStateFile(f"{where} lacks {', '.join(missing)}")
    for name, value in raw.items():
        kind = kinds.get(name)
        if kind is None:
            raise CorruptStateFile(f"{where} has an unknown field {name!r}")
        if not _fits(value, kind):
            raise CorruptStateFile(f"{where}.{name} must be {kind}, not {_shown(value)}")
    return raw


def encode_state(state: PushState) -> bytes:
    body = state.to_json()
    return body + b"\nsha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n"


def decode_state(raw: bytes) -> PushState:
    """Parse a state file's bytes; raise :class:`CorruptStateFile` on any damage."""
    if not raw:
        raise CorruptStateFile("state file is empty")
    body, sep, trailer = raw.rstrip(b"\n").rpartition(b"\nsha256:")
    if not sep:
        raise CorruptStateFile("state file has no checksum line (torn write?)")
    if hashlib.sha256(body).hexdigest().encode() != trailer:
        raise CorruptStateFile("state file checksum does not match its contents")
    try:
        return PushState.from_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStateFile(f"state file is not JSON: {exc}") from exc


def write_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class StateFile:
    """The positions file of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_NAME
        self.corruptions = 0
        self.found = False
        """Whether :meth:`load` found a good state file (else the positions were lost)."""

    def load(self) -> PushState:
        """The saved state; a missing file is an empty state, a corrupt one is set aside."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return PushState()
        try:
            state = decode_state(raw)
            self.found = True
            if not state.saved_at:  # written by an earlier version
                state.saved_at = self.path.stat().st_mtime
            return state
        except CorruptStateFile as exc:
            self.corruptions += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
            os.replace(self.path, aside)
            log.warning(
                "state file %s is corrupt (%s); moved to %s, resuming from the gateway's "
                "last seqnos",
                self.path,
                exc,
                aside.name,
            )
            return PushState()

    def save(self, state: PushState) -> None:
        state.saved_at = time.time()
        write_atomically(self.path, encode_state(state))
