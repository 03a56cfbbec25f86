"""The old Archive API, kept under its old names: ``/store``, ``/commit_request``, ``/commit``.

Wire format (stable; see docs/protocol.md, "Legacy Archive API"):

``POST /store?log_type=T[&server=H][&file=F]`` with the data as the body
    answers ``{"store_id": "<32 hex>"}``: the data is staged (fsynced), not yet in the log.
``POST /commit_request?store_id=S[&txn_id=X]``
    writes the staged data to ``<dc>.<T>`` as one record of transaction X (default: S) and
    answers ``{"txn_id", "topic", "partition", "offset"}``.  Repeating it is harmless; the
    first request binds S to X, and S under any other id is refused (409 ``store_id_written``)
    and written nowhere, also when the requests race or a gateway was killed in between.
``POST /commit?txn_id=X&log_type=T``
    writes the transaction's commit marker and answers ``{"txn_id", "topic", "partition",
    "data_offset", "committed": true}``.  Repeating it is harmless.  More than 60 s after the
    data was written it is refused (409 ``window_expired``) and writes nothing.

Readers deliver a transaction's data once, at its marker, if the marker came within the
window (60 s by default) after the data; see :mod:`delivery.legacy_txn`.

With tokens, a transaction id belongs to the token (its ``name``) whose ``/commit_request``
wrote it: the owner is recorded in the topic's state before the data is written, another
token's ``/commit_request`` of the id is 409 ``txn_id_taken`` and its ``/commit`` 403, both
writing nothing.  Transactions written before owners were recorded have none and stay
anyone's (of their log type), as before.  A token with ``sources`` globs also writes only
the transactions whose source id, ``legacy:<txn_id>``, they match.

Staged data is held per token owner: one token's pieces may hold at most
``max_staged_bytes_per_token`` of the gateway's ``max_staged_bytes`` (the limit is on the
gateway that stages them: with several gateways on Kafka each keeps its own), and a piece
never requested is dropped after ``staged_max_age_s``.  ``logbroker_legacy_staged_bytes{owner}``
shows who holds what.  A piece whose store id was never answered holds nothing: the client
that went away before the answer has it dropped at once, and a file a killed gateway was
writing is removed by the next start (:meth:`LegacyStaging.drop_abandoned`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import replace
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from audit.records import AUDIT_LOG_TYPE
from delivery.legacy_txn import (
    LegacyStaging,
    StagedData,
    StoreIdWritten,
    TxnIdTaken,
    UnknownStagedData,
    UnknownTransaction,
    find_txn_partition,
    reach,
    store_id_written_elsewhere,
    txn_store_id,
    validate_store_id,
    validate_txn_id,
    write_commit,
    write_data,
)
from ingest_api.access import PEER, Access, RouteDeclaration, access_of, route, write
from ingest_api.auth import forbidden
from ingest_api.body import announces_body, read_body
from ingest_api.context import GatewayContext
from ingest_api.errors import ApiError
from ingest_api.legacy_peers import STAGING_PATH, StagingPeers
from ingest_api.openapi import operation, path_param
from ingest_api.owners_api import owner_directory
from log_store.errors import BadRequest, UnknownTopic
from log_store.topic_names import LOG_TYPE_RULE, is_valid_log_type
from session_dedup.source import check_shown_text

_FIELD_MAX = 4096
_SWEEP_S = 600.0
_COUNT_S = 5.0
"""How often the staged bytes per owner are counted for the metrics (a scrape only reads the
last count: a hung disk must not hold it)."""
_GAUGE_KEY = __name__ + ".staged_gauge"
_NOTE_PEERS_S = 2.0
_OWNER_KEY = "legacy-txn-owner/"
"""Topic-state key prefix: the name of the token whose /commit_request wrote a txn_id."""
_log = logging.getLogger(__name__)


def _source_id(txn_id: str) -> str:
    """The source id of a transaction's records (:func:`delivery.legacy_txn.write_data`)."""
    return f"legacy:{txn_id}"


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _log_type(request: Request) -> str:
    log_type = request.query_params.get("log_type")
    if log_type is None:
        raise ApiError(400, "bad_request", "query parameter log_type is required")
    if not is_valid_log_type(log_type):
        raise ApiError(400, "bad_log_type", f"log_type must be {LOG_TYPE_RULE}")
    if log_type == AUDIT_LOG_TYPE:  # its records are checked on POST /v1/write only
        raise ApiError(400, "bad_log_type", f"{AUDIT_LOG_TYPE} is not written by the legacy API")
    return log_type


def _text_param(request: Request, name: str, default: str) -> str:
    value = request.query_params.get(name, default)
    if len(value) > _FIELD_MAX:
        raise ApiError(400, "bad_request", f"{name}: at most {_FIELD_MAX} characters")
    try:
        check_shown_text(name, value)  # the same characters as a write's meta
    except BadRequest as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    return value


class LegacyApi:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        limits = ctx.settings.limits
        self.staging = LegacyStaging(
            ctx.settings.data_dir / "legacy-staging",
            max_age_s=limits.staged_max_age_s,
            max_bytes=limits.max_staged_bytes,
            max_bytes_per_owner=limits.staged_bytes_per_token,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        directory = owner_directory(ctx)
        self.peers: StagingPeers | None = None
        """With several gateways on Kafka: the other gateways, which may hold a piece."""
        if directory is not None:
            self_url = ctx.settings.url

            def peer_urls() -> set[str]:
                return {url for url in directory.snapshot().values() if url and url != self_url}

            self.peers = StagingPeers(
                peer_urls, ctx.settings.peer_token, remember_s=self.staging.max_age_s
            )

    async def store(self, request: Request) -> Response:
        log_type = _log_type(request)  # the route's guard checked the token may write it
        client = request.client.host if request.client else ""
        server = _text_param(request, "server", client)
        file = _text_param(request, "file", "")
        if not announces_body(request):  # an empty piece is sent with Content-Length: 0
            raise ApiError(
                400,
                "bad_request",
                "the request has no body (neither Content-Length nor chunked encoding), so "
                "nothing was stored",
            )
        limits = self.ctx.settings.limits
        # A piece is written as one record, so a body over max_chunk_bytes can never be: it is
        # refused on its Content-Length (before "100 Continue") or once it passes the limit,
        # not received whole first, holding room other bodies wait for.
        limit = min(limits.max_chunk_bytes, limits.max_body_bytes)
        try:
            data = await read_body(request, limits, max_bytes=limit)
        except ApiError as exc:
            if exc.status != 413 or limit != limits.max_chunk_bytes:
                raise
            raise ApiError(
                413, "chunk_too_large", f"data is over the limit of {limit} bytes"
            ) from None
        store_id = await anyio.to_thread.run_sync(
            functools.partial(
                self.staging.put,
                log_type=log_type,
                server=server,
                file=file,
                data=data,
                owner=access_of(request).owner,
            )
        )
        if await request.is_disconnected():
            # nobody will ever know this store_id: the piece would only hold the token's
            # share until staged_max_age_s
            await anyio.to_thread.run_sync(self.staging.discard, store_id)
            raise ApiError(
                400, "client_disconnected", "the client went away before the store_id was sent"
            )
        return _json({"store_id": store_id})

    async def commit_request(self, request: Request) -> Response:
        store_id = request.query_params.get("store_id")
        if not store_id:
            raise ApiError(400, "bad_request", "query parameter store_id is required")
        try:
            validate_store_id(store_id)
        except UnknownStagedData as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        txn_id = validate_txn_id(request.query_params.get("txn_id", store_id))
        staged, holder = await anyio.to_thread.run_sync(self._staged, store_id)
        access = access_of(request)
        access.require_write(staged.log_type)
        access.require_write_source(_source_id(txn_id))
        if staged.owner is not None and not access.owns(staged.owner):
            # a piece staged before owners were kept (or without tokens) has none: anyone's
            raise forbidden(
                f"store_id {store_id} was staged by another token; only its token (or an "
                "admin) may request its commit"
            )
        topic = self.ctx.topic_for(staged.log_type)
        try:
            staged = await anyio.to_thread.run_sync(self._bind, topic, txn_id, staged, holder)
            reach("after-claim")
            written = await anyio.to_thread.run_sync(
                self._write_data, topic, txn_id, staged, access
            )
        except TxnIdTaken as exc:
            # The piece is not in the log under txn_id and never will be: unbind it, so that
            # it can be requested under another id.
            await anyio.to_thread.run_sync(self._release, store_id, txn_id, holder)
            raise ApiError(409, "txn_id_taken", str(exc)) from None
        except StoreIdWritten as exc:
            raise ApiError(409, "store_id_written", str(exc)) from None
        reach("after-data-write")
        if not staged.written:
            if holder is None:
                await anyio.to_thread.run_sync(self.staging.mark_written, store_id)
            elif self.peers is not None:
                await anyio.to_thread.run_sync(self.peers.mark_written, holder, store_id)
        return _json(
            {
                "txn_id": written.txn_id,
                "topic": written.topic,
                "partition": written.partition,
                "offset": written.data_offset,
            }
        )

    def _bind(self, topic: str, txn_id: str, staged: StagedData, holder: str | None) -> StagedData:
        """The piece, bound to ``txn_id`` where it is staged; :class:`StoreIdWritten` if it
        is bound to another id that may still write it.

        A binding to an id whose transaction holds another piece is dead (this piece can
        never be written under it; a crash cut off its release): it is dropped, once."""
        for _ in range(2):
            bound = self._claim(staged, txn_id, holder)
            if bound.txn_id is None or bound.txn_id == txn_id:
                return bound
            partitions = self._partitions(topic)
            owner = (
                None
                if partitions is None
                else txn_store_id(self.ctx.store, topic, partitions, bound.txn_id)
            )
            if owner is None or owner == staged.store_id:
                break
            self._release(staged.store_id, bound.txn_id, holder)
        raise store_id_written_elsewhere(staged.store_id, str(bound.txn_id))

    def _claim(self, staged: StagedData, txn_id: str, holder: str | None) -> StagedData:
        if holder is None:
            return self.staging.claim(staged.store_id, txn_id)
        assert self.peers is not None  # a holder is only ever found among the peers
        bound, written = self.peers.claim(holder, staged.store_id, txn_id)
        return replace(staged, txn_id=bound, written=written or staged.written)

    def _release(self, store_id: str, txn_id: str, holder: str | None) -> None:
        if holder is None:
            self.staging.release(store_id, txn_id)
        elif self.peers is not None:
            self.peers.release(holder, store_id, txn_id)

    def _staged(self, store_id: str) -> tuple[StagedData, str | None]:
        """The piece, and the URL of the gateway holding it (None: this one)."""
        validate_store_id(store_id)
        try:
            return self.staging.get(store_id), None
        except UnknownStagedData:
            if self.peers is None:
                raise
        return self.peers.find(store_id)

    async def peer_staged(self, request: Request) -> Response:
        """For another gateway: the piece as stored here (404 ``unknown_store_id``: none)."""
        raw = await anyio.to_thread.run_sync(self.staging.raw, request.path_params["store_id"])
        return Response(raw, media_type="application/octet-stream")

    async def peer_claim(self, request: Request) -> Response:
        """For another gateway about to write this gateway's piece: bind it to ``txn_id``
        (unless bound already) and answer the id it is bound to."""
        store_id = request.path_params["store_id"]
        txn_id = validate_txn_id(request.query_params.get("txn_id", ""))
        staged = await anyio.to_thread.run_sync(self.staging.claim, store_id, txn_id)
        body = {"store_id": store_id, "txn_id": staged.txn_id, "written": staged.written}
        return _json(body)

    async def peer_release(self, request: Request) -> Response:
        """For another gateway that found ``txn_id`` holding other data: unbind the piece."""
        store_id = request.path_params["store_id"]
        txn_id = validate_txn_id(request.query_params.get("txn_id", ""))
        await anyio.to_thread.run_sync(self.staging.release, store_id, txn_id)
        return _json({"store_id": store_id})

    async def peer_mark_written(self, request: Request) -> Response:
        """For another gateway that wrote this gateway's piece to the log."""
        staged = await anyio.to_thread.run_sync(
            self.staging.mark_written, request.path_params["store_id"]
        )
        return _json({"store_id": staged.store_id, "written": True})

    def _write_data(self, topic: str, txn_id: str, staged: Any, access: Access) -> Any:
        partitions = self._ensure_topic(topic, access)
        self._take_txn_id(topic, partitions, txn_id, access)
        return write_data(self.ctx.store, topic, partitions, txn_id, staged)

    def _take_txn_id(self, topic: str, partitions: int, txn_id: str, access: Access) -> None:
        """Record the request's token as the owner of ``txn_id`` unless it has one (or was
        written before owners were recorded); :class:`TxnIdTaken` if it is another token's.

        The owner is recorded before the data is written, and first wins (the store's
        put-if-absent), so of two tokens racing for a new id one writes and the other gets
        409; a crash in between leaves an id that only its owner's repeat completes."""
        owner = access.owner
        if owner is None:  # auth off: transactions belong to no one, as they always did
            return
        store = self.ctx.store
        key = _OWNER_KEY + txn_id
        try:
            find_txn_partition(store, topic, partitions, txn_id)
            written_before = True
        except UnknownTransaction:
            written_before = False
        # Read after looking for the data: an owner is recorded before its data, so data
        # found without an owner was written before owners were (anyone's, as it was).
        recorded = store.get_topic_state(topic, key)
        if recorded is None and not written_before:
            recorded = store.put_topic_state_if_absent(topic, key, owner.encode())
        if recorded is not None and recorded.decode() != owner and not access.is_admin:
            raise TxnIdTaken(
                f"txn_id {txn_id!r} belongs to another token, whose /commit_request wrote it "
                "first; nothing was written: request the data under another txn_id"
            )

    def _require_txn_owner(self, topic: str, txn_id: str, access: Access) -> None:
        """403 unless ``txn_id`` is the request token's (or has no owner recorded)."""
        if access.is_admin:
            return
        recorded = self.ctx.store.get_topic_state(topic, _OWNER_KEY + txn_id)
        if recorded is not None and recorded.decode() != access.owner:
            raise forbidden(
                f"transaction {txn_id!r} belongs to another token (its /commit_request wrote "
                "it); only that token may commit it"
            )

    def _partitions(self, topic: str) -> int | None:
        try:
            return len(self.ctx.store.describe_topic(topic).partitions)
        except UnknownTopic:
            return None

    def _ensure_topic(self, topic: str, access: Access) -> int:
        try:
            return len(self.ctx.store.describe_topic(topic).partitions)
        except UnknownTopic:
            creator = self.ctx.topic_creator(access.grant)
            created = self.ctx.topic_quota.create(topic, self.ctx.settings.partitions, creator)
            return len(created.partitions)

    async def commit(self, request: Request) -> Response:
        txn_raw = request.query_params.get("txn_id")
        if not txn_raw:
            raise ApiError(400, "bad_request", "query parameter txn_id is required")
        txn_id = validate_txn_id(txn_raw)
        log_type = _log_type(request)  # the route's guard checked the token may write it
        access = access_of(request)
        access.require_write_source(_source_id(txn_id))
        topic = self.ctx.topic_for(log_type)
        server = request.client.host if request.client else ""
        partition, data_offset = await anyio.to_thread.run_sync(
            self._write_commit, topic, txn_id, server, access
        )
        return _json(
            {
                "txn_id": txn_id,
                "topic": topic,
                "partition": partition,
                "data_offset": data_offset,
                "committed": True,
            }
        )

    def _write_commit(
        self, topic: str, txn_id: str, server: str, access: Access
    ) -> tuple[int, int]:
        store = self.ctx.store
        try:
            partitions = len(store.describe_topic(topic).partitions)
        except UnknownTopic:
            # named as when the topic exists (find_txn_partition): which topic was looked in
            raise UnknownTransaction(
                f"no /commit_request wrote transaction {txn_id!r} to {topic}"
            ) from None
        partition = find_txn_partition(store, topic, partitions, txn_id)
        self._require_txn_owner(topic, txn_id, access)
        data_offset, _ = write_commit(store, topic, partition, txn_id, server)
        return partition, data_offset

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="legacy-staging-sweep")
        if self.peers is not None:
            self._watcher = asyncio.create_task(
                self._note_peers_forever(self.peers), name="legacy-staging-peers"
            )

    async def stop(self) -> None:
        for task in (self._sweeper, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.peers is not None:
            self.peers.close()

    @staticmethod
    async def _note_peers_forever(peers: StagingPeers) -> None:
        while True:
            peers.note_peers()
            await asyncio.sleep(_NOTE_PEERS_S)

    async def _sweep_forever(self) -> None:
        # a piece lives at most a quarter of its age longer than staged_max_age_s
        sweep_s = min(_SWEEP_S, self.staging.max_age_s / 4)
        swept_at = float("-inf")
        while True:
            try:
                if time.monotonic() - swept_at >= sweep_s:
                    swept_at = time.monotonic()
                    dropped = await anyio.to_thread.run_sync(self.staging.sweep)
                    if dropped:
                        _log.info(
                            "dropped %d staged legacy pieces never committed (expired, or "
                            "cut short by a kill)",
                            dropped,
                        )
                await anyio.to_thread.run_sync(self.staging.staged_bytes)  # for the gauge
            except OSError:
                _log.exception("cannot sweep the legacy staging directory")
            await asyncio.sleep(min(_COUNT_S, sweep_s))

    def staged_samples(self) -> list[tuple[tuple[str, ...], float]]:
        """``logbroker_legacy_staged_bytes`` from the last count (no disk access)."""
        by_owner = self.staging.staged_by_owner(recount=False)
        return [((owner,), float(size)) for owner, size in sorted(by_owner.items())]


def routes(ctx: GatewayContext) -> list[RouteDeclaration]:
    api = LegacyApi(ctx)
    ctx.extensions[__name__] = api
    if _GAUGE_KEY not in ctx.extensions:  # once per context, reading its current LegacyApi
        ctx.extensions[_GAUGE_KEY] = True
        ctx.metrics.collected_gauge(
            "logbroker_legacy_staged_bytes",
            "bytes of legacy /store pieces staged on this gateway, by the token owner that "
            'staged them (owner="": without tokens), counted every few seconds',
            ("owner",),
            lambda: ctx.extensions[__name__].staged_samples(),
        )
    by_query = write(log_type="log_type")
    stored = ("log_type", "server", "file")
    # Old clients send parameters of their own (cache busters): ignored here, as they always
    # were; every other route refuses a query parameter it does not take.
    declared = [
        route(
            "POST",
            "/store",
            api.store,
            by_query,
            query=stored,
            unknown_query="ignore",
            name="legacy_store",
        ),
        route(
            "PUT",
            "/store",
            api.store,
            by_query,
            query=stored,
            unknown_query="ignore",
            name="legacy_store_put",
        ),
        # the log type is the staged data's: checked once the store_id is looked up
        route(
            "POST",
            "/commit_request",
            api.commit_request,
            write(),
            query=("store_id", "txn_id"),
            unknown_query="ignore",
            name="legacy_commit_request",
        ),
        route(
            "POST",
            "/commit",
            api.commit,
            by_query,
            query=("txn_id", "log_type"),
            unknown_query="ignore",
            name="legacy_commit",
        ),
    ]
    if api.peers is None:
        return declared
    # another gateway's /commit_request for a piece staged here (several gateways on Kafka)
    return [
        *declared,
        route("GET", STAGING_PATH + "/{store_id}", api.peer_staged, PEER, name="peer_staged"),
        route(
            "POST",
            STAGING_PATH + "/{store_id}/claim",
            api.peer_claim,
            PEER,
            query=("txn_id",),
            name="peer_staged_claim",
        ),
        route(
            "POST",
            STAGING_PATH + "/{store_id}/release",
            api.peer_release,
            PEER,
            query=("txn_id",),
            name="peer_staged_release",
        ),
        route(
            "POST",
            STAGING_PATH + "/{store_id}/written",
            api.peer_mark_written,
            PEER,
            name="peer_staged_written",
        ),
    ]


async def on_startup(ctx: GatewayContext) -> None:
    api: LegacyApi = ctx.extensions[__name__]
    api.start()


async def on_shutdown(ctx: GatewayContext) -> None:
    api: LegacyApi = ctx.extensions[__name__]
    await api.stop()


def openapi_paths(ctx: GatewayContext) -> dict[str, Any]:
    def query(name: str, required: bool) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": required, "schema": {"type": "string"}}

    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}

    def op(op_id: str, summary: str, params: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "operationId": op_id,
            "summary": summary,
            "parameters": params,
            "responses": {
                "200": {
                    "description": "see docs/protocol.md, Legacy Archive API",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                "400": {"description": "bad or missing parameters", "content": error},
                "404": {"description": "unknown store_id or transaction", "content": error},
                "409": {
                    "description": "txn_id taken by other data, or a commit past its window",
                    "content": error,
                },
                "413": {"description": "data over the limit", "content": error},
            },
        }

    store = op(
        "legacy_store",
        "Stage data",
        [query("log_type", True), query("server", False), query("file", False)],
    )
    store["requestBody"] = {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
    paths: dict[str, Any] = {
        "/store": {"post": store, "put": {**store, "operationId": "legacy_store_put"}},
        "/commit_request": {
            "post": op(
                "legacy_commit_request",
                "Write staged data under a transaction id",
                [query("store_id", True), query("txn_id", False)],
            )
        },
        "/commit": {
            "post": op(
                "legacy_commit",
                "Write a transaction's commit marker",
                [query("txn_id", True), query("log_type", True)],
            )
        },
    }
    if owner_directory(ctx) is not None:
        params = [path_param("store_id")]
        paths[STAGING_PATH + "/{store_id}"] = {
            "get": operation(
                "peerStaged",
                "internal: a legacy piece staged on this gateway, as stored",
                params=params,
                ok_media={"application/octet-stream": {"schema": {"type": "string"}}},
            )
        }
        bind_params = [*params, query("txn_id", True)]
        paths[STAGING_PATH + "/{store_id}/claim"] = {
            "post": operation(
                "peerStagedClaim",
                "internal: bind a legacy piece staged here to a transaction id (if unbound)",
                params=bind_params,
            )
        }
        paths[STAGING_PATH + "/{store_id}/release"] = {
            "post": operation(
                "peerStagedRelease",
                "internal: unbind a legacy piece whose transaction id holds other data",
                params=bind_params,
            )
        }
        paths[STAGING_PATH + "/{store_id}/written"] = {
            "post": operation(
                "peerStagedWritten",
                "internal: another gateway wrote this gateway's legacy piece to the log",
                params=params,
            )
        }
    return paths
