"""The gateway's part of the end-to-end audit: its own counts, and the reconciled windows.

The gateway counts what it wrote (tier ``gateway``) per topic and window of the chunks' create
time, and publishes its totals to ``<dc>.logbroker-audit`` every few seconds and when it stops
(see :mod:`audit.publisher`).  Every change of the counts is journaled in the data dir first
(:mod:`audit.journal`), and a gateway starting there publishes what killed ones had not.
``GET /v1/audit/windows?topic=<glob>&since=<unix s>`` answers the reconciled windows (see
:mod:`audit.reconcile`) of the topics the token may read.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from audit.journal import CountJournal, journal_counts, recover_journals
from audit.ledger import AuditLedger
from audit.publisher import AuditPublisher, interval_from_env
from audit.reconcile import reconcile
from audit.records import decode_records, is_audit_topic
from audit.sinks import StoreAuditSink, incarnation_id
from audit.windows import Key, WindowCounts
from delivery.envelope_view import view
from ingest_api.access import RouteDeclaration, access_of, read, route
from ingest_api.auth import Authorizer
from ingest_api.context import GatewayContext
from ingest_api.delivery_parts import delivery_parts
from ingest_api.errors import ApiError
from ingest_api.framing import Section
from ingest_api.openapi import operation, query_param
from ingest_api.params import int_param, json_response
from ingest_api.settings import TokenGrant
from session_dedup.chunk_codecs import newlines
from session_dedup.exactly_once import WRITTEN, ChunkBatch, ExactlyOnceWriter

_log = logging.getLogger("logbroker.audit")
_COUNTS = "audit.gateway_counts"
_PUBLISHER = "audit.gateway_publisher"
_JOURNAL = "audit.gateway_journal"
JOURNAL_DIR = "audit-gateway"
"""Where in the data dir the gateway's workers journal their counts (see :mod:`audit.journal`)."""
MAX_GLOB_CHARS = 200


GATEWAY_MAX_AGE_S = 7 * 24 * 3600.0
"""A chunk's create time is the client's: the gateway counts one older than this (or more
than a day ahead, :data:`~audit.windows.MAX_AHEAD_S`) at that bound, so a client naming a new
window in every chunk cannot make it hold (and publish) a count per window; and it forgets
windows older than that, plus :data:`_FORGET_MARGIN_S` for the clock, once their totals are
published."""
_FORGET_MARGIN_S = 3600.0


def gateway_counts(ctx: GatewayContext) -> WindowCounts:
    """The gateway tier's counts in this worker (made on first use)."""
    counts = ctx.extensions.get(_COUNTS)
    if counts is None:
        counts = ctx.extensions[_COUNTS] = WindowCounts(max_age_s=GATEWAY_MAX_AGE_S)
    assert isinstance(counts, WindowCounts)
    return counts


def count_written(
    counts: WindowCounts, topic: str, codec: str, batch: ChunkBatch, written: bytearray
) -> None:
    """The write path's hook: count the chunks of one section that were written."""
    tally = WrittenTally(counts)
    tally.section(topic, codec, batch, written)
    tally.flush()


class CommittedCounter:
    """Counts the chunks of committed records that no answer to a client counts (see
    ``late_commit_hook``): a commit answered as failed and found committed later, whose retry
    is answered ``duplicate`` (in a store thread), and a write forwarded here by another
    gateway, counted by the owner that commits it."""

    __slots__ = ("_counts",)

    def __init__(self, counts: WindowCounts) -> None:
        self._counts = counts

    def __call__(
        self, topic: str, records: Sequence[bytes], lines: Sequence[int] | None = None
    ) -> None:
        """Count ``records``; ``lines``, if given, holds each record's line count where the
        gateway that wrote it counted them (-1 where not): a compressed chunk is then not
        decompressed a second time."""
        if is_audit_topic(topic):
            return
        counts = self._counts
        known: dict[int, list[int]] = {}  # create time -> [messages, lines], added once each
        for i, value in enumerate(records):
            envelope = view(value)  # the fields only: a raw chunk's lines are counted in place
            if envelope.kind != "chunk":
                continue
            if envelope.codec == "raw":
                found = newlines(memoryview(value)[envelope.data_start :])
            elif lines is not None and lines[i] >= 0:
                found = lines[i]
            else:
                counts.add_chunk(topic, envelope.create_time, envelope.codec, envelope.data)
                continue
            tally = known.setdefault(envelope.create_time, [0, 0])
            tally[0] += 1
            tally[1] += found
        counts.add_many(
            [
                (topic, create_time, messages, found)
                for create_time, (messages, found) in known.items()
            ]
        )


class WrittenTally:
    """The chunks one request wrote, summed per (topic, create time) and added to the counts
    once per request (:meth:`flush`), not once per section.

    Clients stamp a whole batch with one create time, and a request of thousands of new
    sources' first chunks holds a few create times at most.
    """

    __slots__ = ("_counts", "_raw")

    def __init__(self, counts: WindowCounts) -> None:
        self._counts = counts
        self._raw: dict[tuple[str, int], list[int]] = {}

    def section(self, topic: str, codec: str, batch: ChunkBatch, written: bytearray) -> None:
        """Count the written chunks of one section: a compressed one by the line counts the
        write path kept (:attr:`ChunkBatch.lines`), if it kept them, else later, decompressed."""
        if is_audit_topic(topic):
            return
        every = written.count(WRITTEN) == len(written)
        lines = batch.lines
        if lines is None and codec != "raw":
            for i, create_time in enumerate(batch.create_times):
                if every or written[i] == WRITTEN:
                    self._counts.add_chunk(topic, create_time, codec, batch.datas[i])
            return
        raw = self._raw
        for i, create_time in enumerate(batch.create_times):
            if every or written[i] == WRITTEN:
                found = lines[i] if lines is not None else newlines(batch.datas[i])
                tally = raw.get((topic, create_time))
                if tally is None:
                    raw[(topic, create_time)] = [1, found]
                else:
                    tally[0] += 1
                    tally[1] += found

    def flush(self) -> None:
        """Add what was counted to the window counts."""
        if self._raw:
            self._counts.add_many(
                [(topic, t, messages, lines) for (topic, t), (messages, lines) in self._raw.items()]
            )
            self._raw.clear()


_CLIENT_TIERS = ("push-client", "mirror", "loader")
"""The tiers that publish over ``POST /v1/write``; the gateway and push delivery publish
inside the gateway, never through a client's token."""


def audit_write_refusal(
    auth: Authorizer, grant: TokenGrant | None, dc: str, section: Section
) -> ApiError | None:
    """Why a client may not write this section of the audit log type, or None if it may.

    A token that writes the audit log type (every push-client's must) may publish only the
    counts of its own tier of topics it has that tier's right over: a push-client's of the
    log types it writes here, a mirror's of the topics it replicates into, a loader's of the
    topics it reads.  Otherwise any push-client could publish counts as the gateway, or of
    another tenant's topic, and make the audit show loss or duplication that did not happen
    (or hide what did).  Admin tokens, and a gateway without tokens, may publish anything.
    """
    if not auth.enabled or grant is None or grant.admin:
        return None
    if section.meta.codec != "raw":
        return ApiError(
            403, "forbidden", f"audit records are written raw, not {section.meta.codec}"
        )
    for data in section.batch.datas:
        for record in decode_records(bytes(data)):
            if not _may_publish(auth, grant, dc, record.tier, record.topic):
                return ApiError(
                    403,
                    "forbidden",
                    f"this token may not publish {record.tier[:40]!r} audit counts of topic "
                    f"{record.topic[:210]!r}",
                )
    return None


def _may_publish(auth: Authorizer, grant: TokenGrant, dc: str, tier: str, topic: str) -> bool:
    if tier == "push-client":
        prefix = dc + "."
        return topic.startswith(prefix) and auth.may_write(grant, topic[len(prefix) :])
    if tier == "mirror":
        return auth.may_replicate(grant, topic)
    if tier == "loader":
        return auth.may_read(grant, topic)
    return False


class AuditApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.ledger = AuditLedger()

    async def windows(self, request: Request) -> Response:
        params = request.query_params
        glob = params.get("topic", "*")
        if not glob or len(glob) > MAX_GLOB_CHARS:
            raise ApiError(400, "bad_request", f"topic must be a glob of 1..{MAX_GLOB_CHARS} chars")
        since = int_param(params, "since", 0, 0, 2**40)
        access = access_of(request)
        rows = await anyio.to_thread.run_sync(self._reconcile, glob, since)
        return json_response(
            {"windows": [row.as_json() for row in rows if access.may_read(row.topic)]}
        )

    def _reconcile(self, glob: str, since: int) -> list[Any]:
        self.ledger.refresh(self.ctx.store)
        return reconcile(self.ledger, topic_glob=glob, since=since)


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = AuditApi(ctx)
    gateway_counts(ctx)
    return [
        route("GET", "/v1/audit/windows", api.windows, read(lists=True), query=("topic", "since"))
    ]


async def on_startup(ctx: GatewayContext) -> None:
    settings = ctx.settings
    writer = ExactlyOnceWriter(ctx.store, dc=settings.dc, partitions=settings.partitions)
    sink = StoreAuditSink(writer)
    instance = incarnation_id()
    counts = gateway_counts(ctx)
    directory = settings.data_dir / JOURNAL_DIR
    journals: list[CountJournal] = []
    ctx.extensions[_JOURNAL] = journals
    push = delivery_parts(ctx).push

    def push_counts(name: str) -> WindowCounts:
        """A push subscription's counts, journaled beside the gateway's (made in the event
        loop on its first delivery: one file made, no data written)."""
        made = WindowCounts()
        kept = _journal(directory, instance, f"push:{name}", made)
        if kept is not None:
            journals.append(kept)
        return made

    # set before the first await: push delivery started already, and counts its first batch
    # with the counts this makes
    push.new_counts = push_counts
    journal = await anyio.to_thread.run_sync(_journal, directory, instance, "gateway", counts)
    if journal is not None:
        journals.append(journal)
    # what gateways killed on this data dir counted and did not publish: published now, in
    # the background (on Kafka a write may wait for its partition's owner)
    threading.Thread(
        target=recover_journals,
        args=(directory, functools.partial(_publish_recovered, sink)),
        name="audit-gateway-recovery",
        daemon=True,
    ).start()
    ctx.extensions[_PUBLISHER] = AuditPublisher(
        "gateway",
        instance,
        counts,
        sink,
        interval_s=interval_from_env(),
        forget_after_s=GATEWAY_MAX_AGE_S + _FORGET_MARGIN_S,
        more_tiers=lambda: {f"push:{name}": c for name, c in list(push.audit.items())},
        kept_for_next=str(directory) if journal is not None else "",
    ).start()


def _journal(
    directory: Path, instance: str, tier: str, counts: WindowCounts
) -> CountJournal | None:
    """A journal of ``counts`` (None, said in a warning, if the directory takes none)."""
    try:
        journal = CountJournal(directory, instance, tier)
    except OSError as exc:
        _log.warning(
            "audit: cannot journal the %s counts in %s: %s; a kill of this gateway loses "
            "what it counted since its last publication",
            tier,
            directory,
            exc,
        )
        return None
    journal_counts(counts, journal)
    return journal


def _publish_recovered(
    sink: StoreAuditSink, tier: str, instance: str, totals: dict[Key, tuple[int, int]]
) -> None:
    """Publish a killed instance's journaled totals of ``tier`` under its name (raises if
    they were not written)."""
    counts = WindowCounts()
    for (topic, window), (messages, lines) in totals.items():
        counts.set(topic, window, messages, lines)
    AuditPublisher(tier, instance, counts, sink).publish()


async def on_shutdown(ctx: GatewayContext) -> None:
    publisher = ctx.extensions.pop(_PUBLISHER, None)
    journals = ctx.extensions.pop(_JOURNAL, None)
    published = False
    if isinstance(publisher, AuditPublisher):
        timeout_s = ctx.stop_time_left(publisher.stop_timeout_s)
        await anyio.to_thread.run_sync(publisher.stop, timeout_s)
        published = await anyio.to_thread.run_sync(publisher.all_published)
    for journal in journals if isinstance(journals, list) else []:
        # kept when the last publish did not get through: the next start publishes them
        journal.close(remove=published)


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    return {
        "/v1/audit/windows": {
            "get": operation(
                "audit_windows",
                "The end-to-end audit per 10-minute window: each tier's messages and lines, "
                "and whether every tier holds the source's count",
                params=[query_param("topic", "string"), query_param("since")],
                errors=("400",),
            )
        }
    }
