"""The gateways' internal API on Kafka: a partition's owner serves the other gateways.

==========================================================  =================================
``POST /v1/internal/partitions/{topic}/{p}/state``          JSON ``{"keys": [...]}``: the
                                                            values the owner has, and the
                                                            partition's next offset
``POST /v1/internal/partitions/{topic}/{p}/transactions``   a prepared transaction (what a
                                                            function read, wrote, appends):
                                                            committed, or conflict with the
                                                            current values
``POST /v1/internal/transactions``                          a batch of prepared transactions
                                                            of partitions the gateway owns
                                                            (those one client request
                                                            forwards here): an answer or an
                                                            error per transaction, in order
==========================================================  =================================

Permission: :data:`~ingest_api.access.PEER` - the ``peer_token`` as bearer (it must be
configured when ``[tokens]`` are; no client token passes, not even an admin's).  A gateway
that does not own the partition answers 409 ``not_owner``; the caller looks for the new owner
(see ``log_store.kafka.remote_transaction``).  A transaction of a batch that the owner refuses
as the client's fault (a record larger than Kafka takes: ``record_too_large``, ...) is
answered with that refusal's name, and the caller answers its client as this gateway would.

When the app stops, the gateway leaves the gateways' group (joined in ``open_context``),
handing every partition it owns on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from ingest_api.access import PEER, RouteDeclaration, route
from ingest_api.audit_api import CommittedCounter, gateway_counts
from ingest_api.body import read_body
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.openapi import operation, path_param
from log_store.errors import LogbrokerError, UnknownTopic
from log_store.kafka.gateway_group import GatewayGroup
from log_store.kafka.remote_transaction import (
    BATCH_BYTES,
    CommitAnswer,
    NotOwner,
    PreparedTransaction,
    answer_of,
    checked_transaction,
    decode_batch,
    encode_outcomes,
    encode_values,
)
from log_store.kafka.store import KafkaLogStore
from log_store.topic_names import validate_topic_name

log = logging.getLogger(__name__)

_PREPARED_OVERHEAD = 1024 * 1024


def _group(ctx: GatewayContext) -> GatewayGroup | None:
    store = ctx.store
    if isinstance(store, KafkaLogStore) and isinstance(store.placement, GatewayGroup):
        return store.placement
    return None


class PeerApi:
    def __init__(self, ctx: GatewayContext, store: KafkaLogStore) -> None:
        self.ctx = ctx
        self.store = store
        self.count_committed = CommittedCounter(gateway_counts(ctx))
        """Counts the chunks of forwarded writes committed here (see ``_count``)."""
        self.batches = 0
        """Batches of forwarded transactions received (one request each)."""
        self.batched_transactions = 0

    @staticmethod
    def _target(request: Request) -> tuple[str, int]:
        topic = request.path_params["topic"]
        validate_topic_name(topic)
        try:
            partition = int(request.path_params["partition"])
        except ValueError:
            raise ApiError(400, "bad_request", "partition must be an integer") from None
        return topic, partition

    @staticmethod
    def _refusal(exc: LogbrokerError) -> Response:
        if isinstance(exc, NotOwner):
            raise ApiError(409, "not_owner", str(exc))
        if isinstance(exc, UnknownTopic):
            raise ApiError(404, "unknown_topic", str(exc))
        raise exc

    async def read_state(self, request: Request) -> Response:
        topic, partition = self._target(request)
        body = await read_body(request, self.ctx.settings.limits)
        try:
            doc = orjson.loads(body)
            keys = doc["keys"]
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise ValueError("keys must be a list of strings")
        except (ValueError, KeyError, TypeError) as exc:
            raise ApiError(400, "bad_request", f"state read: {exc}") from None
        try:
            values, next_offset = await anyio.to_thread.run_sync(
                self.store.read_local_state, topic, partition, keys
            )
        except LogbrokerError as exc:
            return self._refusal(exc)
        payload = orjson.dumps(encode_values(values, next_offset))
        return Response(payload, media_type="application/json")

    async def commit(self, request: Request) -> Response:
        topic, partition = self._target(request)
        limit = self.ctx.settings.limits.max_body_bytes + _PREPARED_OVERHEAD
        body = await read_body(request, self.ctx.settings.limits, max_bytes=limit)
        try:
            prepared = PreparedTransaction.decode(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise ApiError(400, "bad_request", f"prepared transaction: {exc}") from None
        future = self.store.submit_local(
            topic, partition, checked_transaction(prepared, self.count_committed)
        )
        with contextlib.suppress(Exception):  # the outcome is read just below
            await asyncio.wrap_future(future)
        try:
            answer = answer_of(future)
        except LogbrokerError as exc:
            return self._refusal(exc)
        self._count(topic, prepared, answer)
        return Response(orjson.dumps(answer.to_json()), media_type="application/json")

    def _count(self, topic: str, prepared: PreparedTransaction, answer: CommitAnswer) -> None:
        """The audit counts a forwarded write where it is committed (see ``late_commit_hook``):
        here, whether or not the answer reaches the gateway that forwarded it.  The answer
        says so, and the sender counts only what an answer does not say was counted (the
        answers of an older owner, during an upgrade)."""
        if answer.committed is not None and prepared.counted_at_owner:
            answer.counted = True
            try:
                self.count_committed(topic, prepared.records, prepared.record_lines)
            except Exception:  # a peer's record this version cannot read: the commit stands
                log.exception("counting a forwarded write to %s for the audit failed", topic)

    async def commit_batch(self, request: Request) -> Response:
        """Every transaction of the batch goes to its partition's owner here at once (each
        joins its partition's next group commit); each is answered on its own."""
        limits = self.ctx.settings.limits
        limit = limits.max_body_bytes + BATCH_BYTES + _PREPARED_OVERHEAD
        body = await read_body(request, limits, max_bytes=limit)
        try:
            items = decode_batch(body)
            for item in items:
                validate_topic_name(item.topic)
        except (ValueError, KeyError, TypeError, LogbrokerError) as exc:
            raise ApiError(400, "bad_request", f"prepared transactions: {exc}") from None
        self.batches += 1
        self.batched_transactions += len(items)
        futures = [
            self.store.submit_local(
                item.topic, item.partition, checked_transaction(item.prepared, self.count_committed)
            )
            for item in items
        ]
        await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        outcomes: list[CommitAnswer | LogbrokerError] = []
        for item, future in zip(items, futures, strict=True):
            try:
                answer = answer_of(future)
            except LogbrokerError as exc:
                outcomes.append(exc)
                continue
            self._count(item.topic, item.prepared, answer)
            outcomes.append(answer)
        return Response(orjson.dumps(encode_outcomes(outcomes)), media_type="application/json")


def _metrics(ctx: GatewayContext, store: KafkaLogStore, api: PeerApi) -> None:
    m = ctx.metrics
    m.gauge(
        "logbroker_kafka_takeovers",
        "partition takeovers by this gateway since it started (fencing, state rebuilt)",
        read=lambda: float(len(store.takeovers)),
    )
    m.gauge(
        "logbroker_kafka_takeover_seconds_max",
        "the longest of the recent takeovers: fencing plus rebuilding the seqno table",
        read=lambda: max((t[2] for t in list(store.takeovers)), default=0.0),
        mode="livemax",
    )
    m.gauge(
        "logbroker_kafka_takeover_entries_max",
        "state entries (sources' seqnos, pins) of the largest recent takeover",
        read=lambda: float(max((t[3] for t in list(store.takeovers)), default=0)),
        mode="livemax",
    )
    m.gauge(
        "logbroker_kafka_commits",
        "Kafka transactions committed by this gateway's partition writers",
        read=lambda: float(store.commits.commits),
    )
    m.gauge(
        "logbroker_kafka_committed_transactions",
        "writes (one per request and partition) those commits carried: group commit",
        read=lambda: float(store.commits.transactions),
    )
    m.gauge(
        "logbroker_kafka_committed_records",
        "data records those commits wrote",
        read=lambda: float(store.commits.records),
    )
    m.gauge(
        "logbroker_kafka_visibility_looks",
        "requests for a partition's last stable offset made to see those commits readable",
        read=lambda: float(store.commits.visibility_looks),
    )
    m.gauge(
        "logbroker_kafka_partition_looks",
        "looks at one partition's start and last stable offset (two requests each); a fetch "
        "of many partitions looks at theirs together, one request per leader",
        read=lambda: float(store.partition_looks),
    )
    group = _group(ctx)
    if group is not None:
        m.gauge(
            "logbroker_kafka_peer_batches",
            "batches of forwarded transactions this gateway received as owner (one request each)",
            read=lambda: float(api.batches),
        )
        m.gauge(
            "logbroker_kafka_peer_batched_transactions",
            "forwarded transactions this gateway received as owner in batches",
            read=lambda: float(api.batched_transactions),
        )
        m.gauge(
            "logbroker_kafka_owned_partitions",
            "partitions the gateways' group gave this gateway",
            read=lambda: float(len(group.assigned())),
        )


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    store = ctx.store
    if not isinstance(store, KafkaLogStore):
        return []
    api = PeerApi(ctx, store)
    _metrics(ctx, store, api)
    if _group(ctx) is None:
        return []
    base = "/v1/internal/partitions/{topic}/{partition}"
    return [
        route("POST", "/v1/internal/transactions", api.commit_batch, PEER, name="peer_batch"),
        route("POST", base + "/state", api.read_state, PEER, name="peer_read_state"),
        route("POST", base + "/transactions", api.commit, PEER, name="peer_commit"),
    ]


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    if _group(ctx) is None:
        return {}
    base = "/v1/internal/partitions/{topic}/{partition}"
    params = [path_param("topic"), path_param("partition", "integer")]
    keys = {"type": "object", "required": ["keys"], "properties": {"keys": {"type": "array"}}}
    return {
        "/v1/internal/transactions": {
            "post": operation(
                "peerCommitBatch",
                "internal: commit prepared transactions of partitions this gateway owns",
                errors=("400", "413"),
            )
        },
        base + "/state": {
            "post": operation(
                "peerReadState",
                "internal: the owner's values of these state keys and the next offset",
                params=params,
                body=keys,
                errors=("400", "404", "409"),
            )
        },
        base + "/transactions": {
            "post": operation(
                "peerCommit",
                "internal: commit a prepared transaction on the partition's owner",
                params=params,
                errors=("400", "404", "409", "413"),
            )
        },
    }


async def on_shutdown(ctx: GatewayContext) -> None:
    group = _group(ctx)
    if group is not None:
        await anyio.to_thread.run_sync(group.stop, ctx.stop_time_left(group.stop_budget_s))
