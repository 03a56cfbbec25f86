"""Pull reads: ``/v1/topics``, one partition's messages, and ``/v1/fetch`` of many partitions.

Reads are stateless on the server: a reader passes its position with every request (a reader
catching up finds its next answer read ahead, :class:`ReadAhead`, but gets the same answer
either way).  Every long-poll waits on :class:`~delivery.append_watch.AppendWatch`, woken by
appends, and every store call runs in a worker thread so the event loop keeps serving other
requests.  The wire format is in docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from audit.records import in_prefix
from delivery.filters import FILTER_FIELDS, MessageFilter
from delivery.framing import (
    BINARY_MEDIA_TYPE,
    binary_pieces,
    coalesced,
    encode_json_multi,
    encode_json_single,
)
from delivery.internal_state import is_internal
from delivery.partition_reader import (
    DEFAULT_MAX_BYTES,
    RESOLVE_BUDGET_S,
    PartitionBatch,
    recreated_batch,
    scan_budget_of,
)
from ingest_api.access import RouteDeclaration, access_of, read, route
from ingest_api.context import GatewayContext
from ingest_api.delivery_parts import delivery_parts
from ingest_api.errors import ApiError
from ingest_api.openapi import OBJECT, operation, path_param, query_param
from ingest_api.params import (
    decimal,
    int_param,
    json_body,
    json_filter,
    json_int,
    json_response,
    max_bytes_param,
    query_filter,
    refuse_unknown,
    str_field,
    wants_binary,
)
from ingest_api.settings import Limits
from ingest_api.waiting_reads import AbsentPartitions, WaitingPositions
from log_store.errors import CorruptData, LimitReached, UnknownPartition, UnknownTopic
from log_store.interface import PartitionInfo
from log_store.topic_names import validate_topic_name

_log = logging.getLogger("ingest_api")

MAX_WAIT_MS = 60_000
_GONE_LOOK_S = 0.5
"""How often a long-poll naming a partition that is not there (a topic not made yet) looks
for it again (:class:`AbsentPartitions`: one look per topic for all long-polls); appends to
the partitions that are there wake it at once."""
_DAMAGE_LOG_S = 3600.0
"""A damaged partition's reads are logged once per this long (per worker), whatever offsets
its readers ask for."""
Position = tuple[str, int, int]
TopicIds = dict[tuple[str, int], str]
"""The topic identity a read's offset belongs to, per (topic, partition) that names one."""
# What identifies an answer: positions, max_bytes, filter, raw, txn window, topic ids.
_AnswerKey = tuple[
    tuple[Position, ...], int, MessageFilter, bool, int, tuple[tuple[tuple[str, int], str], ...]
]


_SEND_BLOCK = 256 * 1024

# Every option a read names: anything else is a typo (``servr=``) that would otherwise widen
# a filtered read to everything, so it is refused.
_READ_QUERY = frozenset(
    (
        "offset",
        "max_bytes",
        "wait_ms",
        "format",
        "txn_window_ms",
        "raw",
        "topic_id",
        *FILTER_FIELDS,
    )
)
# The filters that take alternatives (``server=a&server=b``); any other read option is given
# once (which of two offsets would be meant?).
_ALTERNATIVES = ("source_id", "server", "file", "log_type")
_FETCH_FIELDS = frozenset(
    ("partitions", "max_bytes", "wait_ms", "format", "filter", "raw", "txn_window_ms")
)
_POSITION_FIELDS = frozenset(("topic", "partition", "offset", "topic_id"))
_LIST_QUERY = frozenset(("prefix", "include_audit"))
_FLAGS = {"0": False, "false": False, "1": True, "true": True}


async def json_request(request: Request, limits: Limits) -> dict[str, Any]:
    """The request's JSON object body; 415 if it is declared anything but JSON (a form sent
    by ``curl -d``), as on the write routes.  A body without a type is read as JSON."""
    declared = request.headers.get("content-type")
    if declared is not None:
        media = declared.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiError(
                415,
                "unsupported_media_type",
                f"{request.url.path} takes application/json, not {declared!r}",
            )
    return await json_body(request, limits)


def _max_bytes_query(params: Any) -> int:
    """The ``max_bytes`` query parameter, refused as out of range however large it is."""
    raw = params.get("max_bytes")
    if raw is None:
        return DEFAULT_MAX_BYTES
    return max_bytes_param(decimal("max_bytes", raw))


class BinaryAnswer(Response):
    """A binary read answer sent as it lies: the stored values as they are, the small pieces
    between them in blocks of :data:`_SEND_BLOCK`.

    Joining a 16 MiB answer into one ``bytes`` first would copy all of it into fresh memory
    (page faults included) for every fetch, only for the socket to copy it again.
    """

    def __init__(self, batches: Sequence[PartitionBatch]) -> None:
        self._pieces = binary_pieces(batches)
        size = sum(map(len, self._pieces))
        super().__init__(headers={"content-length": str(size)}, media_type=BINARY_MEDIA_TYPE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        for block in coalesced(self._pieces, _SEND_BLOCK):
            await send({"type": "http.response.body", "body": block, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


class ReadAhead:
    """The next answers of readers that are catching up, read while they handle the last one.

    A reader behind the end fetches, handles the answer and fetches again from where the
    answer ended: the gateway reads nothing while the reader handles an answer, and the reader
    waits while the gateway reads.  So once an answer that stops short of the end is sent, the
    next one is read at once; a fetch that asks for exactly that answer soon after
    (``max_age_s``) gets it.  At most ``max_bytes`` of answers are held (counted by the
    budgets they were read for); the oldest is dropped first.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_age_s: float = 1.0) -> None:
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._pending: OrderedDict[
            _AnswerKey, tuple[float, asyncio.Task[list[PartitionBatch] | None]]
        ] = OrderedDict()

    def start(self, key: _AnswerKey, read: Callable[[], Awaitable[list[PartitionBatch]]]) -> None:
        """Read the answer ``key`` names now, unless it is being read already."""
        if key in self._pending or key[1] > self._max_bytes:
            return
        self._pending[key] = (time.monotonic(), asyncio.ensure_future(_or_none(read)))
        while sum(k[1] for k in self._pending) > self._max_bytes:
            self._pending.popitem(last=False)  # its read finishes unseen

    async def take(self, key: _AnswerKey) -> list[PartitionBatch] | None:
        """The answer read ahead for ``key``, if one was started lately; None otherwise (also
        when reading it failed: a read now says why)."""
        entry = self._pending.pop(key, None)
        if entry is None:
            return None
        started, task = entry
        if time.monotonic() - started > self._max_age_s:
            return None
        return await task


async def _or_none(
    read: Callable[[], Awaitable[list[PartitionBatch]]],
) -> list[PartitionBatch] | None:
    try:
        return await read()
    except Exception:
        return None


async def _unless_disconnected(
    receive: Receive, poll: Coroutine[Any, Any, list[PartitionBatch]]
) -> list[PartitionBatch]:
    """``poll``'s answer, unless the client disconnects first: then the poll is cancelled,
    which lets go of its waits at once (not when its ``wait_ms`` is up)."""
    answer = asyncio.ensure_future(poll)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            return answer.result()
        raise ApiError(400, "client_disconnected", "the client went away during its long-poll")
    finally:
        for task in (answer, gone):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects (the request's body was read already: the
    server has nothing else to say until then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _topic_id_value(value: object) -> str:
    """A position's ``topic_id``: the identity an earlier answer named (1-64 of
    ``[0-9A-Za-z_-]``, as both stores' ids are)."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 64
        or not all(c.isascii() and (c.isalnum() or c in "-_") for c in value)
    ):
        raise ApiError(
            400,
            "bad_request",
            "topic_id must be a topic's id as a read or GET /v1/topics/{topic} named it "
            f"(1-64 letters, digits, '-' or '_'), got {value!r}"[:300],
        )
    return value


def _ids_key(ids: TopicIds) -> tuple[tuple[tuple[str, int], str], ...]:
    return tuple(sorted(ids.items()))


def _has_news(batches: Sequence[PartitionBatch]) -> bool:
    """Whether an answer has something to say: messages, records it left out because they
    are not envelopes (a long-poll that waited on past them would never name them), or a
    partition it cannot read past (damaged data).  A partition that is not there is not news:
    a reader started before its topic waits for it (see :meth:`ReadApi._fetch`)."""
    return any(b.messages or b.not_envelopes or b.corrupt or b.recreated for b in batches)


def _answered(batches: list[PartitionBatch]) -> list[PartitionBatch]:
    """``batches`` as the answer, or the refusal (404) when none of its partitions is there,
    as a fetch always was, which a client from before partitions were answered alone knows to
    look at the topics again for."""
    gone = [b.gone for b in batches if b.gone is not None]
    if len(gone) == len(batches):
        raise gone[0]
    return batches


def _partition_json(p: PartitionInfo) -> dict[str, Any]:
    """One partition of ``GET /v1/topics/{topic}``; a damaged one (embedded store) says why
    (``damaged``): a reader reads the others, and its reads of this one say it as damaged
    data, which it stops at and reports."""
    described: dict[str, Any] = {
        "partition": p.partition,
        "start_offset": p.start_offset,
        "end_offset": p.end_offset,
        "size_bytes": p.size_bytes,  # null where unknown (Kafka)
    }
    if p.damaged is not None:
        described["damaged"] = p.damaged
    return described


def _refuse_raw_filter(raw: bool, filt: MessageFilter) -> None:
    """400 for a filter given with ``raw``: a raw read returns every record as stored, so the
    filter would be dropped without a word and the read widened to everything."""
    if raw and not filt.matches_all:
        raise ApiError(
            400,
            "bad_request",
            "a filter cannot be combined with raw (a raw read returns every record as stored)",
        )


def readable_topic(request: Request, name: object) -> str:
    """``name`` if it is a topic this request may read; internal topics do not exist for it.

    400 for an invalid name, 404 for an internal topic, 403 if the token may not read it.
    """
    topic = validate_topic_name(name)
    if is_internal(topic):
        raise UnknownTopic(f"no topic named {topic!r}")
    access_of(request).require_read(topic)
    return topic


class ReadApi:
    """The read endpoints; one per worker process."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        parts = delivery_parts(ctx)
        self.reader = parts.reader
        self.watch = parts.watch
        limits = ctx.settings.limits
        self.max_positions = limits.max_fetch_positions
        self.waiting = WaitingPositions(
            limits.max_waiting_positions, limits.waiting_positions_per_token
        )
        self._absent = AbsentPartitions(self.store, _GONE_LOOK_S)
        self._read_bytes = ctx.metrics.counter(
            "logbroker_pull_bytes_total", "bytes of message values sent to pull readers"
        )
        self._read_messages = ctx.metrics.counter(
            "logbroker_pull_messages_total", "messages sent to pull readers"
        )
        self._ahead = ReadAhead()
        self._damage_logged: dict[tuple[str, int], float] = {}
        self._read_ahead_answers = ctx.metrics.counter(
            "logbroker_pull_read_ahead_answers_total",
            "pull answers read while the reader handled its previous answer",
        )

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    def _count(self, batches: Sequence[PartitionBatch]) -> None:
        self._read_bytes.inc(sum(b.value_bytes for b in batches))
        self._read_messages.inc(sum(len(b.messages) for b in batches))

    async def list_topics(self, request: Request) -> Response:
        """``GET /v1/topics``: the topics this token may read."""
        prefix = request.query_params.get("prefix", "")
        # a mirror copies the audit topics too; readers of a prefix see them only by name
        audit = _FLAGS.get(request.query_params.get("include_audit", "false"))
        if audit is None:
            raise ApiError(400, "bad_request", "include_audit must be 1, 0, true or false")
        access = access_of(request)
        infos = await self._run(self.store.list_topics)
        topics = [
            {"name": t.name, "partitions": t.config.partitions}
            for t in sorted(infos, key=lambda t: t.name)
            if (t.name.startswith(prefix) if audit else in_prefix(t.name, prefix))
            and not is_internal(t.name)
            and access.may_read(t.name)
        ]
        return json_response({"topics": topics})

    async def describe_topic(self, request: Request) -> Response:
        topic = readable_topic(request, request.path_params["topic"])
        info = await self._run(self.store.describe_topic, topic)
        return json_response(
            {
                "name": info.name,
                "topic_id": info.topic_id,
                "partitions": [_partition_json(p) for p in info.partitions],
            }
        )

    async def read_partition(self, request: Request) -> Response:
        """``GET /v1/topics/{topic}/partitions/{partition}/messages``: one partition, long-poll."""
        params = request.query_params  # the route takes only _READ_QUERY (routes below)
        topic = readable_topic(request, request.path_params["topic"])
        partition: int = request.path_params["partition"]
        offset = int_param(params, "offset", None, 0, 2**63 - 1)
        max_bytes = _max_bytes_query(params)
        wait_ms = int_param(params, "wait_ms", 0, 0, MAX_WAIT_MS)
        window = int_param(params, "txn_window_ms", self.reader.txn_window_ms, 0, 86_400_000)
        raw = _FLAGS.get(params.get("raw", "0"))
        if raw is None:
            raise ApiError(400, "bad_request", "raw must be 1, 0, true or false")
        binary = wants_binary(request, params.get("format"))
        filt = query_filter(params)
        _refuse_raw_filter(raw, filt)
        ids: TopicIds = {}
        if "topic_id" in params:
            ids[(topic, partition)] = _topic_id_value(params["topic_id"])
        batches = await self._fetch(
            request, [(topic, partition, offset)], max_bytes, wait_ms, filt, raw, window, ids
        )
        if batches[0].corrupt is not None:
            raise batches[0].corrupt
        if batches[0].recreated is not None:
            raise ApiError(
                409,
                "topic_recreated",
                batches[0].recreated,
                extra={
                    "topic": topic,
                    "partition": partition,
                    "topic_id": batches[0].topic_id,
                    "start_offset": batches[0].start_offset,
                    "end_offset": batches[0].end_offset,
                },
            )
        self._count(batches)
        if binary:
            return BinaryAnswer(batches)
        return Response(encode_json_single(batches[0]), media_type="application/json")

    async def fetch(self, request: Request) -> Response:
        """``POST /v1/fetch``: several partitions at once, each from its own offset."""
        body = await json_request(request, self.ctx.settings.limits)
        refuse_unknown(body, _FETCH_FIELDS, "fields")
        parts = body.get("partitions")
        if not isinstance(parts, list) or not parts:
            raise ApiError(400, "bad_request", "partitions must be a non-empty list")
        if len(parts) > self.max_positions:
            raise LimitReached(
                f"a fetch names at most {self.max_positions} partitions, this one {len(parts)}",
                "max_fetch_positions",
                self.max_positions,
            )
        positions: list[Position] = []
        ids: TopicIds = {}
        named: set[tuple[str, int]] = set()
        for item in parts:
            if not isinstance(item, dict):
                raise ApiError(400, "bad_request", "each partition is {topic, partition, offset}")
            refuse_unknown(item, _POSITION_FIELDS, "fields of a partition")
            topic = readable_topic(request, str_field(item, "topic"))
            partition = json_int(item, "partition", -1, 0, 1_000_000)
            offset = json_int(item, "offset", -1, 0, 2**63 - 1)
            if (topic, partition) in named:
                # Which of its offsets would the answer continue from?  And each copy would
                # be read (and waited on) again: a fetch of one partition 1,000 times.
                raise ApiError(
                    400,
                    "bad_request",
                    f"partition {topic}/{partition} is named twice: a fetch names each "
                    "partition once, with one offset",
                    extra={"topic": topic, "partition": partition},
                )
            named.add((topic, partition))
            positions.append((topic, partition, offset))
            if "topic_id" in item:
                ids[(topic, partition)] = _topic_id_value(item["topic_id"])
        max_bytes = body.get("max_bytes", DEFAULT_MAX_BYTES)
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool):
            raise ApiError(400, "bad_request", "max_bytes must be an integer")
        max_bytes_param(max_bytes)
        wait_ms = json_int(body, "wait_ms", 0, 0, MAX_WAIT_MS)
        window = json_int(body, "txn_window_ms", self.reader.txn_window_ms, 0, 86_400_000)
        raw = body.get("raw", False)
        if not isinstance(raw, bool):
            raise ApiError(400, "bad_request", "raw must be true or false")
        filt = json_filter(body.get("filter"))
        _refuse_raw_filter(raw, filt)
        binary = wants_binary(request, body.get("format"))
        batches = await self._fetch(request, positions, max_bytes, wait_ms, filt, raw, window, ids)
        self._count(batches)
        if binary:
            return BinaryAnswer(batches)
        return Response(encode_json_multi(batches), media_type="application/json")

    async def _fetch(
        self,
        request: Request,
        positions: Sequence[Position],
        max_bytes: int,
        wait_ms: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
        ids: TopicIds,
    ) -> list[PartitionBatch]:
        key: _AnswerKey = (tuple(positions), max_bytes, filt, raw, window_ms, _ids_key(ids))
        ahead = await self._ahead.take(key)
        if ahead is not None and _has_news(ahead):
            self._read_ahead_answers.inc()
            self._read_ahead(ahead, max_bytes, filt, raw, window_ms, ids)
            return ahead
        if wait_ms == 0:
            return await self._poll(positions, max_bytes, filt, raw, window_ms, ids, deadline=0.0)
        # A long-poll: its positions count among the worker's waiting ones from the start
        # (429 if they do not fit, before anything is read: refusing costs nothing).
        with self.waiting.hold(access_of(request).owner, len(positions)):
            deadline = time.monotonic() + wait_ms / 1000
            return await _unless_disconnected(
                request.receive,
                self._poll(positions, max_bytes, filt, raw, window_ms, ids, deadline),
            )

    async def _poll(
        self,
        positions: Sequence[Position],
        max_bytes: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
        ids: TopicIds,
        deadline: float,
    ) -> list[PartitionBatch]:
        """Read ``positions``; until ``deadline`` (a ``time.monotonic()``), wait for news."""
        batches = await self._read(positions, max_bytes, filt, raw, window_ms, ids)
        while not _has_news(batches):
            if time.monotonic() >= deadline:
                return _answered(batches)
            # Filtered-out records were scanned: wait from where the scan ended.
            current = [(b.topic, b.partition, b.next_offset) for b in batches]
            if not await self._wait(current, batches, deadline):
                return _answered(await self._read(current, max_bytes, filt, raw, window_ms, ids))
            batches = await self._read(current, max_bytes, filt, raw, window_ms, ids)
        self._read_ahead(batches, max_bytes, filt, raw, window_ms, ids)
        return batches

    async def _read(
        self,
        positions: Sequence[Position],
        max_bytes: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
        ids: TopicIds,
    ) -> list[PartitionBatch]:
        batches: list[PartitionBatch] = await self._run(
            self._read_all, positions, max_bytes, filt, raw, window_ms, ids
        )
        return batches

    async def _wait(
        self, positions: Sequence[Position], batches: Sequence[PartitionBatch], deadline: float
    ) -> bool:
        """Wait until ``deadline`` for something new at ``positions`` (as last read:
        ``batches``): True once a partition that is there has an append, or one that was not
        there (a topic not made yet) is there now; False when the time is up."""
        there = [pos for pos, b in zip(positions, batches, strict=True) if b.gone is None]
        absent = [(b.topic, b.partition) for b in batches if b.gone is not None]
        if not absent:
            return await self.watch.wait_any(there, deadline - time.monotonic())
        # No append wakes the readers of a topic when it is made: it is looked for every
        # _GONE_LOOK_S (one look per topic for all long-polls), while the partitions that are
        # there wake the wait as usual.
        appended: asyncio.Future[bool] | None = None
        if there:
            appended = asyncio.ensure_future(
                self.watch.wait_any(there, deadline - time.monotonic())
            )
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if appended is None:
                    await asyncio.sleep(min(left, _GONE_LOOK_S))
                else:
                    done, _ = await asyncio.wait({appended}, timeout=min(left, _GONE_LOOK_S))
                    if done:
                        if appended.result():
                            return True
                        appended = None  # its time is up
                if len(await self._absent.still_absent(absent)) < len(absent):
                    return True
        finally:
            if appended is not None and not appended.done():
                appended.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await appended

    def _read_ahead(
        self,
        answer: Sequence[PartitionBatch],
        max_bytes: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
        ids: TopicIds,
    ) -> None:
        """Start reading the answer that follows ``answer`` if it stopped short of the end."""
        if all(b.next_offset >= b.end_offset for b in answer):
            return  # at the end: the reader waits for appends, a read now finds nothing
        if any(b.recreated for b in answer):
            return  # the reader's next fetch names other identities
        following = [(b.topic, b.partition, b.next_offset) for b in answer]
        self._ahead.start(
            (tuple(following), max_bytes, filt, raw, window_ms, _ids_key(ids)),
            lambda: self._read(following, max_bytes, filt, raw, window_ms, ids),
        )

    def _read_all(
        self,
        positions: Sequence[Position],
        max_bytes: int,
        filt: MessageFilter,
        raw: bool,
        window_ms: int,
        ids: TopicIds,
    ) -> list[PartitionBatch]:
        # An even share per partition, so a backlog in the first partition listed does not
        # starve the others; each still returns at least one message if it has one.  The
        # scan budget of one read is shared the same way: a fetch of many partitions scans
        # no more than a read of one.
        share = max(1, max_bytes // len(positions))
        scan = max(share, scan_budget_of(max_bytes) // len(positions))
        # legacy commit markers whose data must be looked up: one time budget for the fetch
        resolve_until = time.monotonic() + RESOLVE_BUDGET_S
        batches = []
        # the partitions' bounds looked up together (on Kafka one request per leader, not a
        # look per partition: 132 partitions took 1 s under load)
        with self.store.reads_of([(topic, partition) for topic, partition, _ in positions]):
            for topic, partition, offset in positions:
                try:
                    batch = self.reader.read(
                        topic,
                        partition,
                        offset,
                        share,
                        filt,
                        raw=raw,
                        txn_window_ms=window_ms,
                        scan_bytes=scan,
                        resolve_until=resolve_until,
                        topic_id=ids.get((topic, partition)),
                    )
                except CorruptData as exc:
                    # One damaged partition must not keep the others from their readers: it is
                    # answered with the error, the others with their messages.
                    self._log_damage(topic, partition, exc)
                    # (kept without its traceback: a long-poll holds its answer while it waits,
                    # and the traceback would keep every frame of the failed read alive)
                    batch = PartitionBatch(
                        topic,
                        partition,
                        exc.start_offset,
                        exc.end_offset,
                        offset,
                        corrupt=exc.with_traceback(None),
                    )
                except (UnknownTopic, UnknownPartition) as exc:
                    # A topic deleted, or made again with fewer partitions, under a reader that
                    # follows others too: they are answered, this one says it is gone.
                    batch = PartitionBatch(
                        topic, partition, offset, offset, offset, gone=exc.with_traceback(None)
                    )
                batches.append(batch)
        if ids and not self.store.capabilities.exact_read_identity:
            return self._confirmed(positions, batches, ids)
        return batches

    def _confirmed(
        self, positions: Sequence[Position], batches: list[PartitionBatch], ids: TopicIds
    ) -> list[PartitionBatch]:
        """``batches`` with the topic identity of each that moved on confirmed by a look at
        the topic after the reads (one per topic): on Kafka a read names the identity the
        gateway's last look saw (at most a few seconds old), and records read by name from a
        topic made again meanwhile must not pass as the old topic's from the reader's
        offset.  A batch of a topic made again is answered as such (its reader starts the new
        topic from offset 0), one of a topic gone as gone."""
        now: dict[str, str | UnknownTopic] = {}
        out = []
        for (topic, partition, offset), batch in zip(positions, batches, strict=True):
            asked = ids.get((topic, partition))
            if (
                asked is None
                or batch.next_offset == offset
                or batch.recreated is not None
                or batch.gone is not None
                or batch.corrupt is not None
            ):
                out.append(batch)
                continue
            if topic not in now:
                try:
                    now[topic] = self.store.current_topic_id(topic)
                except UnknownTopic as exc:
                    now[topic] = exc.with_traceback(None)
            current = now[topic]
            if isinstance(current, UnknownTopic):
                batch = PartitionBatch(topic, partition, offset, offset, offset, gone=current)
            elif current != asked:
                batch = recreated_batch(topic, partition, asked, current, 0, batch.end_offset)
            out.append(batch)
        return out

    def _log_damage(self, topic: str, partition: int, exc: CorruptData) -> None:
        """Log a damaged partition's read once per :data:`_DAMAGE_LOG_S`: its readers choose
        the offsets they ask for, so logging each offset once would log (and remember) as
        many as they ask for."""
        now = time.monotonic()
        logged = self._damage_logged.get((topic, partition))
        if logged is not None and now - logged < _DAMAGE_LOG_S:
            return
        # Only damaged partitions are remembered, and those too old to matter are forgotten.
        self._damage_logged = {
            tp: at for tp, at in self._damage_logged.items() if now - at < _DAMAGE_LOG_S
        }
        self._damage_logged[(topic, partition)] = now
        _log.error("%s (logged once an hour per partition)", exc)


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = ReadApi(ctx)
    messages = "/v1/topics/{topic}/partitions/{partition:int}/messages"
    return [
        route("GET", "/v1/topics", api.list_topics, read(lists=True), query=_LIST_QUERY),
        route("GET", "/v1/topics/{topic}", api.describe_topic, read(topic="topic")),
        route(
            "GET",
            messages,
            api.read_partition,
            read(topic="topic"),
            query=_READ_QUERY,
            repeatable=_ALTERNATIVES,
        ),
        route("POST", "/v1/fetch", api.fetch, read()),
    ]


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    topic = path_param("topic")
    partition = path_param("partition", "integer")
    read_media = {
        "application/json": {"schema": OBJECT},
        BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
    }
    filters = [
        query_param("source_id", "string"),
        query_param("server", "string"),
        query_param("file", "string"),
        query_param("log_type", "string"),
        query_param("hash_key", "string"),
        query_param("hash_mod"),
        query_param("hash_rem"),
    ]
    return {
        "/v1/topics": {
            "get": operation(
                "list_topics",
                "Topics this token may read, optionally by DC prefix",
                params=[
                    query_param("prefix", "string"),
                    {
                        "name": "include_audit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": sorted(_FLAGS)},
                    },
                ],
                errors=(),
            )
        },
        "/v1/topics/{topic}": {
            "get": operation("describe_topic", "A topic's partitions and offsets", params=[topic])
        },
        "/v1/topics/{topic}/partitions/{partition}/messages": {
            "get": operation(
                "read_partition",
                "Long-poll read of one partition from an offset",
                params=[
                    topic,
                    partition,
                    query_param("offset", required=True),
                    query_param("max_bytes"),
                    query_param("wait_ms"),
                    query_param("txn_window_ms"),
                    query_param("format", "string"),
                    query_param("topic_id", "string"),
                    {
                        "name": "raw",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": sorted(_FLAGS)},
                    },
                    *filters,
                ],
                ok_media=read_media,
                errors=("400", "404", "409", "416", "429", "500"),
            )
        },
        "/v1/fetch": {
            "post": operation(
                "fetch",
                "Long-poll read of several partitions, each from its offset",
                body={
                    "type": "object",
                    "required": ["partitions"],
                    "additionalProperties": False,
                    "properties": {
                        "partitions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": sorted(_POSITION_FIELDS - {"topic_id"}),
                                "additionalProperties": False,
                                "properties": {
                                    "topic": {"type": "string"},
                                    "partition": {"type": "integer"},
                                    "offset": {"type": "integer"},
                                    "topic_id": {"type": "string"},
                                },
                            },
                        },
                        "max_bytes": {"type": "integer"},
                        "wait_ms": {"type": "integer"},
                        "format": {"type": "string", "enum": ["json", "binary"]},
                        "filter": OBJECT,
                        "raw": {"type": "boolean"},
                        "txn_window_ms": {"type": "integer"},
                    },
                },
                ok_media=read_media,
                errors=("400", "404", "413", "416", "429"),
            )
        },
    }
