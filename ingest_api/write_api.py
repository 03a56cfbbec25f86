"""The rt write protocol: ``POST /v1/sessions`` and ``POST /v1/write``.

See ``docs/protocol.md`` for the wire format.  Everything a request asks for is checked
(auth, framing, meta, seqnos, limits, rates) before anything is submitted to the log, so a 4xx
writes nothing; a 200 is sent only after every written chunk is fsynced.

A request carries many sources, and one bad source must not hold back the others: a section
(or a session of a batch) whose log type the token may not write, or whose meta, seqnos or
chunk sizes fail validation, is refused on its own with a per-section error result, and the
other sections are written.  Only when every section is refused is the request answered with a
4xx as a whole (the first section's error), as it is for request-level problems.
"""

from __future__ import annotations

import math
import time
from typing import Any, cast

import orjson
from starlette.requests import Request
from starlette.responses import Response

from audit.records import AUDIT_LOG_TYPE
from ingest_api.access import RouteDeclaration, route, source_refusal, write
from ingest_api.audit_api import (
    CommittedCounter,
    WrittenTally,
    audit_write_refusal,
    gateway_counts,
)
from ingest_api.body import read_body, read_body_pieces
from ingest_api.codec_check import check_codecs
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError, partitions_unavailable
from ingest_api.framing import (
    BINARY_MEDIA_TYPE,
    NDJSON_MEDIA_TYPE,
    Section,
    meta_from_json,
    parse_binary,
    parse_ndjson,
    refuse_whole_sources,
)
from ingest_api.owners_api import FORWARDED_HEADER, owned_here
from ingest_api.rate_limit import SourceRateLimiter
from ingest_api.schemas_api import STRUCTURED_WRITES
from ingest_api.settings import TokenGrant
from log_store.errors import LimitReached, PartitionUnavailable
from session_dedup.envelope import CODECS
from session_dedup.exactly_once import (
    CHUNK_STATUSES,
    WRITTEN,
    ExactlyOnceWriter,
    PinsUnavailable,
    Session,
    SessionRequest,
    WriteOutcome,
)
from session_dedup.source import (
    FILE_REFUSED_CHARACTERS,
    ID_REFUSED_CHARACTERS,
    LOG_TYPE_PATTERN,
    MAX_CREATE_TIME_MS,
    MAX_META_FIELD_CHARS,
    MAX_SEQNO,
    MAX_SOURCE_ID_CHARS,
    SourceMeta,
)

ACTIVE_SOURCE_WINDOW_S = 300.0
MAX_ACTIVE_SOURCES_COUNTED = 1_000_000
_WRITTEN = "written"


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


class _ActiveSources:
    """Sources that opened a session or wrote recently: the gateway's "open sessions".

    At most :data:`MAX_ACTIVE_SOURCES_COUNTED` are remembered: a client inventing source ids
    saturates the gauge instead of growing the gateway's memory.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: dict[tuple[str, str], float] = {}
        self._pruned = time.monotonic()

    def touch(self, metas: list[SourceMeta]) -> None:
        now = time.monotonic()
        seen = self._seen
        if len(seen) + len(metas) > MAX_ACTIVE_SOURCES_COUNTED:
            self._prune(now)
            seen = self._seen
        for meta in metas:
            key = (meta.log_type, meta.source_id)
            if key in seen or len(seen) < MAX_ACTIVE_SOURCES_COUNTED:
                seen[key] = now
        if now - self._pruned > self.window_s / 10:
            self._prune(now)

    def _prune(self, now: float) -> None:
        self._seen = {k: t for k, t in self._seen.items() if now - t < self.window_s}
        self._pruned = now

    def count(self) -> float:
        # read every second for the metrics: a full prune only as often as ``touch`` does one
        now = time.monotonic()
        if now - self._pruned > self.window_s / 10:
            self._prune(now)
        return float(len(self._seen))


class WriteApi:
    """The write endpoints over one :class:`ExactlyOnceWriter` per worker process."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.limits = ctx.settings.limits
        self.audit = gateway_counts(ctx)
        self.writer = ExactlyOnceWriter(
            ctx.store,
            dc=ctx.settings.dc,
            partitions=ctx.settings.partitions,
            quota=ctx.topic_quota,
            max_sources_per_partition=self.limits.max_sources_per_partition,
            committed_late=CommittedCounter(self.audit),
        )
        self.rates = SourceRateLimiter(
            self.limits.source_chunks_per_second, self.limits.source_burst_chunks
        )
        self.active = _ActiveSources(ACTIVE_SOURCE_WINDOW_S)
        self.owned_here = owned_here(ctx)
        m = ctx.metrics
        self.chunks = m.counter(
            "logbroker_chunks_total", "chunks answered, by topic and status", ("topic", "status")
        )
        self.bytes_written = m.counter(
            "logbroker_written_bytes_total", "chunk data bytes written", ("topic",)
        )
        self.sessions_opened = m.counter(
            "logbroker_sessions_opened_total", "sessions opened (each source of a batch counts)"
        )
        self.ack_latency = m.histogram(
            "logbroker_ack_latency_seconds",
            "from a write request's arrival to its ack (after fsync)",
        )
        m.gauge(
            "logbroker_open_sessions",
            f"sources that opened a session or wrote in the last {ACTIVE_SOURCE_WINDOW_S:g} s "
            "(this worker)",
            read=self.active.count,
        )

        self.sections_refused = m.counter(
            "logbroker_sections_refused_total",
            "sections and sessions refused on their own (the rest of the request went on)",
            ("error",),
        )

    # -- auth -----------------------------------------------------------------------------
    def _forbidden(self, grant: TokenGrant | None, log_type: str) -> ApiError | None:
        if self.ctx.auth.may_write(grant, log_type):
            return None
        return ApiError(403, "forbidden", f"this token may not write log type {log_type!r}")

    def _refuse_unless_all_refused(self, errors: list[ApiError | None]) -> None:
        """Raise the first error if nothing of the request can be done; count the refusals."""
        if errors and all(e is not None for e in errors):
            raise next(e for e in errors if e is not None)
        for error in errors:
            if error is not None:
                self.sections_refused.inc(1, (error.error,))

    # -- sessions -------------------------------------------------------------------------
    async def open_sessions(self, request: Request) -> Response:
        grant = self.ctx.grant(request)
        if _media_type(request) != "application/json":
            raise ApiError(415, "unsupported_media_type", "sessions take application/json")
        body = await read_body(request, self.limits)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "bad_json", f"the body is not UTF-8 JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "bad_json", "the body must be a JSON object")
        batch = "sessions" in doc
        if batch:
            items = doc["sessions"]
            if set(doc) != {"sessions"}:
                raise ApiError(400, "bad_json", "a batch has only the key 'sessions'")
            if not isinstance(items, list) or not items:
                raise ApiError(400, "bad_json", "'sessions' must be a non-empty list")
            if len(items) > self.limits.max_sessions_per_request:
                raise ApiError(
                    413,
                    "too_many_sessions",
                    f"at most {self.limits.max_sessions_per_request} sessions per request",
                )
            asked = [_refusable_session(item, f"sessions[{i}]") for i, item in enumerate(items)]
        else:
            asked = [_session_request(doc, "session")]
        errors = [
            error
            if error is not None
            else self._forbidden(grant, meta.log_type)
            or source_refusal(self.ctx.auth, grant, meta.source_id)
            for meta, _, error in asked
        ]
        self._refuse_unless_all_refused(errors)
        kept = [i for i, error in enumerate(errors) if error is None]
        metas = [asked[i][0] for i in kept]
        sessions = await self.writer.open_sessions_async(
            metas, [asked[i][1] for i in kept], self.ctx.topic_creator(grant)
        )
        limited = [s.refused for s in sessions if s.refused is not None]
        # a topic not created (partition -1) refuses its sessions alone, unless it is all
        # the request asked, as a request of only new log types is refused as a whole
        only_new = len(sessions) == len(asked) and all(s.partition < 0 for s in sessions)
        if limited and (not batch or only_new):
            raise limited[0]  # 429 (counted by the route's guard)
        for limit in limited:
            self.ctx.limit_refusals.inc(1, (limit.limit,))
            self.sections_refused.inc(1, ("limit_reached",))
        self.sessions_opened.inc(len(metas) - len(limited))
        self.active.touch(metas)
        opened = iter(sessions)
        answers: list[dict[str, Any]] = []
        for (meta, _, _), error in zip(asked, errors, strict=True):
            if error is not None:
                answers.append(_refusal_json(meta.source_id, error))
            else:
                answers.append(_session_json(meta, next(opened)))
        payload: Any = {"sessions": answers} if batch else answers[0]
        return Response(orjson.dumps(payload), media_type="application/json")

    # -- writes ---------------------------------------------------------------------------
    async def write_chunks(self, request: Request) -> Response:
        started = time.perf_counter()
        grant = self.ctx.grant(request)
        media = _media_type(request)
        if media not in (BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE):
            raise ApiError(
                415,
                "unsupported_media_type",
                f"write takes {BINARY_MEDIA_TYPE} or {NDJSON_MEDIA_TYPE}, not {media!r}",
            )
        pieces = await read_body_pieces(request, self.limits)
        if media == BINARY_MEDIA_TYPE:
            sections = parse_binary(pieces, self.limits)
        else:
            sections = parse_ndjson(b"".join(pieces), self.limits, int(time.time() * 1000))
        forbidden: dict[str, ApiError | None] = {}  # decided once per log type
        for section in sections:
            if section.error is None:
                log_type = section.meta.log_type
                if log_type not in forbidden:
                    forbidden[log_type] = self._forbidden(grant, log_type)
                section.error = forbidden[log_type] or source_refusal(
                    self.ctx.auth, grant, section.meta.source_id
                )
                if section.error is None and log_type == AUDIT_LOG_TYPE:
                    section.error = audit_write_refusal(
                        self.ctx.auth, grant, self.ctx.settings.dc, section
                    )
        # Compressed chunks are decompressed once, here: refused if corrupt, counted if not;
        # the request is refused as a whole past its budget of decompressed bytes.
        await check_codecs(sections, self.limits.max_decompressed_bytes_per_request)
        structured = self.ctx.extensions.get(STRUCTURED_WRITES)
        if structured is not None:  # records of structured log types: checked and stamped
            await structured.check(sections)
        # A source is written or refused as a whole, whatever refused one of its sections.
        refuse_whole_sources(sections)
        self._refuse_unless_all_refused([s.error for s in sections])
        admitted = [s for s in sections if s.error is None]
        wait_s = self.rates.admit(
            ((s.meta.log_type, s.meta.source_id), len(s.batch)) for s in admitted
        )
        if wait_s is not None:
            raise ApiError(
                429,
                "rate_limited",
                f"a source is over {self.limits.source_chunks_per_second:g} chunks/s",
                headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
                extra={
                    "limit": "source_chunks_per_second",
                    "max": self.limits.source_chunks_per_second,
                },
            )
        try:
            results = await self.writer.write_each_async(
                [(s.meta, s.batch) for s in admitted], self.ctx.topic_creator(grant)
            )
        except PinsUnavailable as exc:
            # sources routed here for the first time whose pins' partition has no reachable
            # owner: named, so that a client holds back those alone and sends the others
            if not exc.source_ids:
                raise
            raise partitions_unavailable([(s, exc) for s in exc.source_ids], pins=True) from None
        # counted also when the request fails: its retry answers what was written `duplicate`
        self._audit(admitted, results)
        failed = [
            (s, r)
            for s, r in zip(admitted, results, strict=True)
            if isinstance(r, BaseException) and not isinstance(r, LimitReached)
        ]
        if failed:
            raise _failure(failed)
        limited = [r for r in results if isinstance(r, LimitReached)]
        if limited and len(limited) == len(sections):
            raise limited[0]  # 429 for a request of only new log types (counted by the guard)
        outcomes = iter(cast(list[WriteOutcome | LimitReached], results))
        answer = _Answer()
        for s in sections:
            if s.error is not None:
                answer.results.append(_refusal_json(s.meta.source_id, s.error))
                continue
            outcome = next(outcomes)
            if isinstance(outcome, LimitReached):  # a new log type's topic was not created
                self.ctx.limit_refusals.inc(1, (outcome.limit,))
                self.sections_refused.inc(1, ("limit_reached",))
                answer.results.append(_limit_refusal_json(s.meta.source_id, outcome))
            elif outcome.refused is not None:
                self.ctx.limit_refusals.inc(1, (outcome.refused.limit,))
                self.sections_refused.inc(1, ("limit_reached",))
                answer.results.append(_limit_refusal_json(s.meta.source_id, outcome.refused))
            else:
                answer.add(s, outcome)
        for (topic, code), count in answer.tally.items():
            self.chunks.inc(count, (topic, CHUNK_STATUSES[code]))
        for topic, size in answer.written_bytes.items():
            if size:
                self.bytes_written.inc(size, (topic,))
        payload = orjson.dumps({"results": answer.results})
        self.active.touch([s.meta for s in admitted])
        self.ack_latency.observe(time.perf_counter() - started)
        return Response(payload, media_type="application/json", headers=self._forwarded(answer))

    def _audit(self, sections: list[Section], results: list[WriteOutcome | BaseException]) -> None:
        """The gateway tier's count of what the sections wrote (not what another gateway, the
        partition's owner, committed and counted)."""
        audited = WrittenTally(self.audit)
        for s, outcome in zip(sections, results, strict=True):
            if not isinstance(outcome, WriteOutcome):
                continue
            if outcome.refused is None and not outcome.counted_elsewhere:
                audited.section(outcome.route.topic, s.meta.codec, s.batch, outcome.written)
        audited.flush()

    def _forwarded(self, answer: _Answer) -> dict[str, str] | None:
        """``Logbroker-Forwarded: N`` when N sections went to partitions another gateway owns:
        a client sending to owners directly learns that its owners' map is stale."""
        owns = self.owned_here
        if owns is None:
            return None
        forwarded = sum(
            1 for r in answer.results if "partition" in r and not owns(r["topic"], r["partition"])
        )
        return {FORWARDED_HEADER: str(forwarded)} if forwarded else None


def _failure(failed: list[tuple[Section, BaseException]]) -> BaseException:
    """What fails a write request: its first error, or, when every failed section's
    partition lacks a reachable owner (the other sections were written), a 503 naming those
    sections' sources (:func:`~ingest_api.errors.partitions_unavailable`)."""
    unavailable = [(s.meta.source_id, r) for s, r in failed if isinstance(r, PartitionUnavailable)]
    if len(unavailable) == len(failed):
        return partitions_unavailable(unavailable)
    return next(r for _, r in failed if not isinstance(r, PartitionUnavailable))


class _Answer:
    """The results of a write request in section order, and its chunks counted per topic and
    status (``tally``) and its written bytes per topic, for the metrics."""

    __slots__ = ("results", "tally", "written_bytes")

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.tally: dict[tuple[str, int], int] = {}
        self.written_bytes: dict[str, int] = {}

    def add(self, section: Section, outcome: WriteOutcome) -> None:
        """One written section's result: an ack per chunk (an offset for each written)."""
        batch = section.batch
        route = outcome.route
        topic = route.topic
        written = outcome.written
        tally = self.tally
        acks: list[dict[str, Any]]
        if len(written) == 1 and written[0] == WRITTEN:
            # the usual section of a new source; half the CPU of the general case below
            acks = [{"seqno": batch.seqnos[0], "status": _WRITTEN, "offset": outcome.first_offset}]
            self.written_bytes[topic] = self.written_bytes.get(topic, 0) + len(batch.datas[0])
            key = (topic, WRITTEN)
            tally[key] = tally.get(key, 0) + 1
        elif written.count(WRITTEN) == len(written):  # every chunk new
            offsets = range(outcome.first_offset, outcome.first_offset + len(written))
            acks = [
                {"seqno": seqno, "status": _WRITTEN, "offset": offset}
                for seqno, offset in zip(batch.seqnos, offsets, strict=True)
            ]
            key = (topic, WRITTEN)
            tally[key] = tally.get(key, 0) + len(written)
            self.written_bytes[topic] = self.written_bytes.get(topic, 0) + sum(
                map(len, batch.datas)
            )
        else:
            offset = outcome.first_offset
            acks = []
            size = 0
            for seqno, code, data in zip(batch.seqnos, written, batch.datas, strict=True):
                key = (topic, code)
                tally[key] = tally.get(key, 0) + 1
                if code == WRITTEN:
                    acks.append({"seqno": seqno, "status": _WRITTEN, "offset": offset})
                    offset += 1
                    size += len(data)
                else:
                    acks.append({"seqno": seqno, "status": CHUNK_STATUSES[code]})
            self.written_bytes[topic] = self.written_bytes.get(topic, 0) + size
        result: dict[str, Any] = {
            "source_id": section.meta.source_id,
            "topic": topic,
            "partition": route.partition,
            "last_seqno": outcome.last_seqno,
            "acks": acks,
        }
        if batch.epoch is not None:
            result["epoch"] = outcome.epoch
        self.results.append(result)


_SESSION_OPTIONS = ("fence", "acked_elsewhere")


def _session_request(obj: Any, where: str) -> tuple[SourceMeta, SessionRequest, ApiError | None]:
    """A session request's source meta and what it asks (fence, handover); raises if bad."""
    if not isinstance(obj, dict):
        raise ApiError(400, "bad_meta", f"{where}: a session is a JSON object")
    fence = obj.get("fence", False)
    if not isinstance(fence, bool):
        raise ApiError(400, "bad_meta", f"{where}: fence must be true or false")
    elsewhere = obj.get("acked_elsewhere")
    if isinstance(elsewhere, float) and elsewhere.is_integer():
        elsewhere = int(elsewhere)  # JSON has one number type: 300.0 is the integer 300
    if elsewhere is not None and (
        not isinstance(elsewhere, int)
        or isinstance(elsewhere, bool)
        or not 0 <= elsewhere <= MAX_SEQNO
    ):
        raise ApiError(
            400, "bad_meta", f"{where}: acked_elsewhere must be an integer in 0 .. 2**63-1"
        )
    meta = meta_from_json({k: v for k, v in obj.items() if k not in _SESSION_OPTIONS}, where)
    return meta, SessionRequest(fence, elsewhere), None


def _refusable_session(obj: Any, where: str) -> tuple[SourceMeta, SessionRequest, ApiError | None]:
    """Like :func:`_session_request`, but a bad session of a batch is refused on its own."""
    try:
        return _session_request(obj, where)
    except ApiError as exc:
        source_id = obj.get("source_id") if isinstance(obj, dict) else None
        placeholder = SourceMeta("", source_id if isinstance(source_id, str) else "")
        return placeholder, SessionRequest(), exc


def _refusal_json(source_id: str, error: ApiError) -> dict[str, Any]:
    """The result of a refused section or session: nothing of it was done."""
    return {
        "source_id": source_id,
        "status": error.status,
        "error": error.error,
        "reason": error.reason,
    }


def _limit_refusal_json(source_id: str, refused: LimitReached) -> dict[str, Any]:
    """The result of a section or session refused by a limit: 429, the limit and its value."""
    return {
        **_refusal_json(source_id, ApiError(429, "limit_reached", str(refused))),
        "limit": refused.limit,
        "max": refused.maximum,
    }


def _session_json(meta: SourceMeta, session: Session) -> dict[str, Any]:
    if session.refused is not None:
        return _limit_refusal_json(meta.source_id, session.refused)
    return {
        "source_id": meta.source_id,
        "topic": session.topic,
        "partition": session.partition,
        "last_seqno": session.last_seqno,
        "epoch": session.epoch,
    }


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = WriteApi(ctx)
    ctx.extensions[__name__] = api
    # A token that may write some log type; each section's (each session's) log type is
    # decided on its own once the body is parsed.
    return [
        route("POST", "/v1/sessions", api.open_sessions, write()),
        route("POST", "/v1/write", api.write_chunks, write()),
    ]


# -- OpenAPI ----------------------------------------------------------------------------------
_ERRORS = {
    "400": "bad input (framing, JSON, meta, seqno); nothing written",
    "401": "missing or unknown bearer token",
    "403": "the token may not write this log type, or a source outside its sources globs",
    "408": "the body did not arrive in time",
    "413": "body, chunk or chunk count over the limit",
    "415": "unsupported Content-Type",
    "429": "a source is over its rate (see Retry-After), or a limit is reached (limit, max)",
    "503": "the log cannot take writes now (store_unavailable: the reason says why, e.g. no "
    "space left, with the bytes needed and free), or the topic was deleted while the write was "
    "in flight (topic_deleted), or partitions have no reachable owner now "
    "(partition_unavailable: partitions names each with the source_ids that wait; sections "
    "of other partitions were written and a resend of them is answered duplicate); nothing "
    "acknowledged; see Retry-After",
    "507": "the write is larger than the data directory's whole file system "
    "(insufficient_storage): it never fits there; nothing acknowledged",
}


def _responses(ok_ref: str, ok_text: str) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {
            "description": ok_text,
            "content": {"application/json": {"schema": {"$ref": ok_ref}}},
        }
    }
    for status, text in _ERRORS.items():
        responses[status] = {
            "description": text,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return responses


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    return {
        "/v1/sessions": {
            "post": {
                "summary": "Open sessions: topic, pinned partition and last written seqno",
                "operationId": "openSessions",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "oneOf": [
                                    {"$ref": "#/components/schemas/SessionRequest"},
                                    {"$ref": "#/components/schemas/SessionBatchRequest"},
                                ]
                            }
                        }
                    },
                },
                "responses": _responses(
                    "#/components/schemas/SessionAnswer",
                    "one session, or {sessions: [...]} in request order for a batch",
                ),
            }
        },
        "/v1/write": {
            "post": {
                "summary": "Write chunks of one or more sources exactly once",
                "description": (
                    "Binary framing (application/x-logbroker-chunks): 'LBW1' then sections of "
                    "u16 meta_len, UTF-8 JSON meta, u32 chunk_count, chunks of u64 seqno, "
                    "i64 create_time_ms, u32 data_len, data (big-endian). NDJSON "
                    "(application/x-ndjson): one ChunkLine object per line. A 200 means every "
                    "chunk is durable or was already there."
                ),
                "operationId": "writeChunks",
                "requestBody": {
                    "required": True,
                    "content": {
                        BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
                        NDJSON_MEDIA_TYPE: {
                            "schema": {
                                "type": "string",
                                "description": "lines, each a ChunkLine JSON object",
                            }
                        },
                    },
                },
                "responses": _responses(
                    "#/components/schemas/WriteAnswer", "every chunk written or duplicate"
                ),
            }
        },
    }


def openapi_schemas(ctx: GatewayContext) -> dict[str, Any]:
    limits = ctx.settings.limits
    meta_props: dict[str, Any] = {
        "log_type": {"type": "string", "pattern": f"^(?!.*\\.\\.){LOG_TYPE_PATTERN.pattern}$"},
        "source_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_SOURCE_ID_CHARS,
            "pattern": f"^[^{ID_REFUSED_CHARACTERS}]+$",
        },
        "server": {
            "type": "string",
            "maxLength": MAX_META_FIELD_CHARS,
            "pattern": f"^[^{ID_REFUSED_CHARACTERS}]*$",
        },
        "file": {
            "type": "string",
            "maxLength": MAX_META_FIELD_CHARS,
            "pattern": f"^[^{FILE_REFUSED_CHARACTERS}]*$",
        },
        "codec": {"type": "string", "enum": list(CODECS)},
    }
    condition_props: dict[str, Any] = {
        "epoch": {
            "type": "integer",
            "minimum": 0,
            "maximum": 2**63 - 1,
            "description": "write only if this is the source's current epoch, else 'fenced'",
        },
        "prev_seqno": {
            "type": "integer",
            "minimum": 0,
            "maximum": 2**63 - 1,
            "description": "write only if the source's last seqno is at least this, "
            "else 'out_of_order'",
        },
    }
    position: dict[str, Any] = {
        "source_id": {"type": "string"},
        "topic": {"type": "string"},
        "partition": {"type": "integer", "minimum": 0},
        "last_seqno": {"type": "integer", "minimum": 0},
        "epoch": {"type": "integer", "minimum": 0},
    }
    return {
        "SessionRequest": {
            "type": "object",
            "required": ["log_type", "source_id"],
            "additionalProperties": False,
            "properties": {
                **meta_props,
                "fence": {
                    "type": "boolean",
                    "description": "start a new epoch: later writes naming an older one fail",
                },
                "acked_elsewhere": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 2**63 - 1,
                    "description": "the source's data up to this seqno was acknowledged by "
                    "another installation: if the last seqno here is lower, a handover record "
                    "moves it to this seqno",
                },
            },
        },
        "SessionBatchRequest": {
            "type": "object",
            "required": ["sessions"],
            "additionalProperties": False,
            "properties": {
                "sessions": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.max_sessions_per_request,
                    "items": {"$ref": "#/components/schemas/SessionRequest"},
                }
            },
        },
        "Session": {
            "type": "object",
            "required": ["source_id", "topic", "partition", "last_seqno", "epoch"],
            "properties": position,
        },
        "SessionAnswer": {
            "oneOf": [
                {"$ref": "#/components/schemas/Session"},
                {
                    "type": "object",
                    "required": ["sessions"],
                    "properties": {
                        "sessions": {
                            "type": "array",
                            "items": {
                                "oneOf": [
                                    {"$ref": "#/components/schemas/Session"},
                                    {"$ref": "#/components/schemas/Refusal"},
                                ]
                            },
                        }
                    },
                },
            ]
        },
        "ChunkLine": {
            "type": "object",
            "required": ["log_type", "source_id", "seqno"],
            "oneOf": [{"required": ["data"]}, {"required": ["data_b64"]}],
            "additionalProperties": False,
            "properties": {
                **meta_props,
                **condition_props,
                "seqno": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                "data": {"type": "string", "description": "text data (UTF-8)"},
                "data_b64": {
                    "type": "string",
                    "description": "base64 data",
                    "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
                },
                "create_time": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_CREATE_TIME_MS,
                    "description": "ms since the epoch, up to 9999-12-31 UTC",
                },
            },
        },
        "Ack": {
            "type": "object",
            "required": ["seqno", "status"],
            "properties": {
                "seqno": {"type": "integer"},
                "status": {
                    "type": "string",
                    "enum": [s for s in CHUNK_STATUSES if s != "refused"],
                },
                "offset": {"type": "integer", "minimum": 0},
            },
        },
        "WriteAnswer": {
            "type": "object",
            "required": ["results"],
            "properties": {
                "results": {
                    "type": "array",
                    "items": {
                        "oneOf": [
                            {
                                "type": "object",
                                "required": [
                                    "source_id",
                                    "topic",
                                    "partition",
                                    "last_seqno",
                                    "acks",
                                ],
                                "properties": {
                                    **position,
                                    "acks": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Ack"},
                                    },
                                },
                            },
                            {"$ref": "#/components/schemas/Refusal"},
                        ]
                    },
                }
            },
        },
        "Refusal": {
            "type": "object",
            "description": "a section or session refused on its own: nothing of it was done",
            "required": ["source_id", "status", "error", "reason"],
            "not": {"required": ["acks"]},
            "properties": {
                "source_id": {"type": "string"},
                "status": {"type": "integer", "minimum": 400, "maximum": 499},
                "error": {"type": "string"},
                "reason": {"type": "string"},
                "limit": {"type": "string"},
                "max": {"type": "integer"},
            },
        },
    }
