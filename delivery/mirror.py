"""Cross-DC mirroring: copy every ``<prefix>*`` topic partition by partition, exactly once.

Partitions are copied one to one (partition p of the source to partition p of the destination)
and messages are never mixed or reordered.  Where Logbroker saved two offsets per partition
every 60 s and reconciled them with the partitions' sizes after a failure, the destination
here keeps the next source offset it expects in the partition's state area, updated in the
same transaction as the append.  An append that does not start exactly there is refused with
the expected offset, so a mirror that crashed, restarted, or raced another mirror resumes
exactly where the destination's log ends: no duplicates, no loss.

Legacy commit markers name their data record by offset; offsets differ between the
installations, so the destination rewrites the marker to the data record's new offset.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from delivery.envelope_view import NotAnEnvelope, view
from delivery.framing import MAGIC, decode_binary
from delivery.pull_client import GatewayUnavailable, PullClient, RequestRefused
from log_store.errors import BadRequest, TopicExists, UnknownTopic
from log_store.interface import LogStore, PartitionState, TopicConfig
from session_dedup.envelope import EnvelopeWriter

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


def replica_position(
    store: LogStore, topic: str, partition: int, source_id: str
) -> ReplicaPosition:
    raw = store.get_state(topic, partition, _STATE_PREFIX + source_id)
    if not raw:
        return ReplicaPosition(None, None)
    doc = json.loads(raw)
    return ReplicaPosition(int(doc["next_source"]), int(doc["next_dest"]))


def ensure_replica_topic(store: LogStore, topic: str, partitions: int) -> None:
    """The destination topic exists with at least the source's partition count."""
    try:
        info = store.describe_topic(topic)
    except UnknownTopic:
        with contextlib.suppress(TopicExists):  # a concurrent request created it
            store.create_topic(topic, TopicConfig(partitions=partitions), exist_ok=True)
        info = store.describe_topic(topic)
    if len(info.partitions) < partitions:
        store.set_partitions(topic, partitions)


def _rewrite_marker(value: bytes, shift: int) -> bytes:
    """A legacy commit marker pointing at its data's offset in this installation."""
    try:
        env = view(value)
    except NotAnEnvelope:
        return value
    if env.kind != "legacy_commit":
        return value
    try:
        body = json.loads(env.data)
        body["data_offset"] = int(body["data_offset"]) + shift
    except (ValueError, KeyError, TypeError):
        return value
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


def append_replica(
    store: LogStore,
    topic: str,
    partition: int,
    source_id: str,
    records: Sequence[tuple[int, bytes]],
) -> int:
    """Append source records (offset, value) exactly once; returns the next source offset.

    Raises :class:`MirrorGap` (with the expected offset) if the first record is not the one
    the destination expects next.  Source offsets must be consecutive.
    """
    if not records:
        raise BadRequest("no records to append")
    first = records[0][0]
    for i, (offset, _) in enumerate(records):
        if offset != first + i:
            raise BadRequest("replica records must have consecutive source offsets")
    key = _STATE_PREFIX + source_id
    end_before = store.end_offset(topic, partition)

    def fn(state: PartitionState) -> list[bytes]:
        raw = state.get(key)
        if raw:
            doc = json.loads(raw)
            expected, next_dest = int(doc["next_source"]), int(doc["next_dest"])
            if first != expected:
                raise MirrorGap(
                    f"{topic}/{partition} expects source offset {expected}, got {first}",
                    expected,
                )
        else:
            # The first copy into this partition: only this mirror writes it, so its end is
            # where the copy starts.
            next_dest = end_before
        shift = next_dest - first
        values = [_rewrite_marker(v, shift) for _, v in records]
        state.put(
            key,
            json.dumps(
                {"next_source": first + len(records), "next_dest": next_dest + len(records)}
            ).encode(),
        )
        return values

    store.transact(topic, partition, fn)
    return first + len(records)


def encode_replica_body(records: Sequence[tuple[int, bytes]]) -> bytes:
    """The body of a replica append: the binary read framing, one section."""
    parts = [MAGIC, len(b"{}").to_bytes(2, "big"), b"{}", len(records).to_bytes(4, "big")]
    for offset, value in records:
        parts.append(offset.to_bytes(8, "big") + len(value).to_bytes(4, "big"))
        parts.append(value)
    return b"".join(parts)


def decode_replica_body(body: bytes) -> list[tuple[int, bytes]]:
    sections = decode_binary(body)
    if len(sections) != 1:
        raise BadRequest("a replica append carries exactly one section")
    return sections[0].records


@dataclass
class MirrorStats:
    copied_messages: int = 0
    refused_gaps: int = 0


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
        if not prefix:
            raise BadRequest("prefix must not be empty (e.g. dc1.)")
        self._source = PullClient(source_url, token=token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._dest = httpx.Client(
            base_url=dest_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(60.0)
        )
        self._prefix = prefix
        self._state_dir = state_dir
        self._max_bytes = max_bytes
        self._positions: dict[tuple[str, int], int] = {}
        self._topic_ids: dict[str, str] = {}
        self._partitions: dict[str, int] = {}
        self._last_discovery = 0.0
        self._last_status = 0.0
        self.stats = MirrorStats()

    def close(self) -> None:
        self._source.close()
        self._dest.close()

    def _discover(self) -> None:
        for topic in self._source.list_topics(self._prefix):
            info = self._source.describe(topic)
            self._topic_ids[topic] = info["topic_id"]
            self._partitions[topic] = len(info["partitions"])
            for p in info["partitions"]:
                tp = (topic, p["partition"])
                if tp not in self._positions:
                    self._positions[tp] = self._resume_offset(topic, p["partition"], p)
        self._last_discovery = time.monotonic()

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

    def _resume_offset(self, topic: str, partition: int, source_info: dict[str, Any]) -> int:
        response = self._dest_call(
            "GET",
            self._replica_path(topic, partition),
            params={"source": self._topic_ids[topic]},
        )
        if response.status_code == 200:
            expected = response.json()["next_source_offset"]
            if expected is not None:
                return int(expected)
        elif response.status_code != 404:
            raise RequestRefused(response.status_code, "replica", response.text[:200], {})
        return int(source_info["start_offset"])

    def step(self, wait_ms: int = 1000) -> int:
        """One round: fetch what is new in every partition and copy it; returns messages."""
        if time.monotonic() - self._last_discovery >= _DISCOVER_S:
            self._discover()
        if not self._positions:
            time.sleep(min(wait_ms, 500) / 1000)
            return 0
        positions = [(t, p, o) for (t, p), o in sorted(self._positions.items())]
        try:
            fetched = self._fetch_raw(positions, wait_ms)
        except RequestRefused as exc:
            if exc.error == "offset_out_of_range":
                self._last_discovery = 0.0  # re-read the bounds on the next round
                self._skip_dropped(positions)
                return 0
            raise
        copied = 0
        for topic, partition, records in fetched:
            if not records:
                continue
            copied += self._append(topic, partition, records)
        self._write_status()
        return copied

    def _fetch_raw(
        self, positions: Sequence[tuple[str, int, int]], wait_ms: int
    ) -> list[tuple[str, int, list[tuple[int, bytes]]]]:
        sections = self._source.fetch_sections(
            positions, max_bytes=self._max_bytes, wait_ms=wait_ms, raw=True
        )
        return [(s.meta["topic"], s.meta["partition"], s.records) for s in sections]

    def _skip_dropped(self, positions: Sequence[tuple[str, int, int]]) -> None:
        for topic, partition, offset in positions:
            info = self._source.describe(topic)
            for p in info["partitions"]:
                if p["partition"] == partition and offset < p["start_offset"]:
                    _log.warning(
                        "%s/%d: source offsets %d..%d were dropped by retention before mirroring",
                        topic,
                        partition,
                        offset,
                        p["start_offset"] - 1,
                    )
                    self._positions[(topic, partition)] = p["start_offset"]

    def _append(self, topic: str, partition: int, records: list[tuple[int, bytes]]) -> int:
        response = self._dest_call(
            "POST",
            self._replica_path(topic, partition),
            params={"source": self._topic_ids[topic], "partitions": self._partitions[topic]},
            content=encode_replica_body(records),
            headers={"Content-Type": REPLICA_MEDIA_TYPE},
        )
        if response.status_code == 409:
            expected = int(response.json()["expected_source_offset"])
            _log.info("%s/%d: destination expects %d; resuming there", topic, partition, expected)
            self._positions[(topic, partition)] = expected
            self.stats.refused_gaps += 1
            return 0
        if response.status_code != 200:
            body = response.json() if response.content else {}
            raise RequestRefused(
                response.status_code,
                str(body.get("error", "http_error")),
                str(body.get("reason", response.text[:200])),
                body,
            )
        next_offset = int(response.json()["next_source_offset"])
        self._positions[(topic, partition)] = next_offset
        self.stats.copied_messages += len(records)
        return len(records)

    def _write_status(self) -> None:
        """An operator's view of the positions; the truth is in the destination's log."""
        if self._state_dir is None or time.monotonic() - self._last_status < _STATUS_S:
            return
        self._last_status = time.monotonic()
        status = {
            "prefix": self._prefix,
            "positions": {f"{t}/{p}": o for (t, p), o in sorted(self._positions.items())},
            "copied_messages": self.stats.copied_messages,
            "written_at_ms": int(time.time() * 1000),
        }
        self._state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._state_dir / "mirror-status.json.tmp"
        tmp.write_text(json.dumps(status, indent=1))
        tmp.replace(self._state_dir / "mirror-status.json")

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> None:
        """Copy until ``stop`` is set (or nothing new came for ``idle_exit_s``)."""
        last_new = time.monotonic()
        while not stop.is_set():
            try:
                copied = self.step()
            except GatewayUnavailable as exc:
                _log.warning("mirror: %s; retrying", exc)
                time.sleep(1.0)
                continue
            if copied:
                last_new = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - last_new >= idle_exit_s:
                break
        self._last_status = 0.0
        self._write_status()
