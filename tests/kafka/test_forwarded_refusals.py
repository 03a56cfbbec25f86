"""An owner's refusal of a forwarded write reaches the client as the refusal it is.

A gateway that does not own a partition forwards the write to its owner; the owner may refuse
it as the client's fault (a record larger than Kafka's topics take, a limit), which it would
answer 413 or 429 had the write come to it directly.  The peer batch protocol used to name
only ``not_owner`` and ``unknown_topic``: everything else came back as ``unavailable``, and
the client got 503 and retried for ever.  No broker here: the owner is the real peer API over
a stand-in store, called through the real HTTP peer link (in this process); the last test
has two gateways on the session's Kafka.
"""

from __future__ import annotations

import concurrent.futures
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

with warnings.catch_warnings():
    # Starlette would have its test client on httpx2; on httpx it works as it always did.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

from ingest_api.context import GatewayContext
from ingest_api.errors import exception_handlers
from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from ingest_api.peer_api import PeerApi
from ingest_api.peer_link import BATCH_PATH, HttpPeerLink, partition_path
from ingest_api.settings import load_settings
from log_store import LogStore, TopicConfig, open_store
from log_store.errors import (
    BadRequest,
    LimitReached,
    LogbrokerError,
    RecordTooLarge,
    StoreUnavailable,
    UnknownPartition,
    UnknownTopic,
)
from log_store.interface import AppendResult, PartitionState, TransactionFn
from log_store.kafka.remote_transaction import (
    CommitAnswer,
    NotOwner,
    RemoteTransactions,
    decode_outcomes,
    encode_outcomes,
)
from session_dedup.pinning import stable_partition
from tests.conftest import GatewayProcess
from tests.gateway.conftest import meta
from tests.kafka.conftest import wait_until

OWNER = "http://owner.test"
TOO_LARGE = (
    "a record of 17825792 bytes for dc1.big/0; at most 16776192 bytes go in one record (the "
    "topics' max.message.bytes is 16777216); nothing of it was written"
)


class _RefusingOwner:
    """The owner's store: every transaction it is given fails with ``refusal``."""

    def __init__(self, refusal: LogbrokerError) -> None:
        self.refusal = refusal
        self.submitted = 0

    def read_local_state(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]:
        return dict.fromkeys(keys), 0

    def submit_local(
        self, topic: str, partition: int, fn: TransactionFn
    ) -> concurrent.futures.Future[AppendResult]:
        self.submitted += 1
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        future.set_exception(self.refusal)
        return future


class _Directory:
    def owner(self, topic: str, partition: int, **_kwargs: Any) -> str | None:
        return OWNER


def _write(state: PartitionState) -> list[bytes]:
    state.put("seq/host-a", b"\x00" * 8)
    return [b"one line\n"]


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[GatewayContext]:
    settings = load_settings(flags={"data_dir": str(tmp_path / "data"), "partitions": 1})
    store = open_store(tmp_path / "data")
    try:
        yield GatewayContext(store=store, settings=settings)
    finally:
        store.close()


def _forward(ctx: GatewayContext, owner: _RefusingOwner) -> BaseException | None:
    """A write forwarded to ``owner`` (the real peer API in front of it); what it failed with."""
    api = PeerApi(ctx, owner)  # type: ignore[arg-type]  # a stand-in store
    app = Starlette(
        routes=[
            Route(BATCH_PATH, api.commit_batch, methods=["POST"]),
            Route(partition_path("{topic}", 0) + "/state", api.read_state, methods=["POST"]),
        ],
        exception_handlers=exception_handlers(),
    )
    link = HttpPeerLink(None, timeout_s=5.0)
    link._client.close()
    link._client = TestClient(app, base_url=OWNER)
    remote = RemoteTransactions(_Directory(), link, timeout_s=5.0)
    try:
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        remote.submit("dc1.big", 0, _write, future)
        return future.exception(timeout=20)
    finally:
        remote.close()


def test_a_record_too_large_at_the_owner_fails_the_forwarded_write_as_too_large_once(
    ctx: GatewayContext,
) -> None:
    """Before: ``StoreUnavailable`` (a 503 to the client, retried for ever)."""
    owner = _RefusingOwner(RecordTooLarge(TOO_LARGE))
    failure = _forward(ctx, owner)
    assert isinstance(failure, RecordTooLarge), repr(failure)
    assert str(failure) == TOO_LARGE
    assert owner.submitted == 1, "the forwarder tried the refused write again"


def test_a_limit_reached_at_the_owner_keeps_its_limit_and_maximum(ctx: GatewayContext) -> None:
    owner = _RefusingOwner(LimitReached("the partition is full", "max_sources_per_partition", 7))
    failure = _forward(ctx, owner)
    assert isinstance(failure, LimitReached), repr(failure)
    assert (str(failure), failure.limit, failure.maximum) == (
        "the partition is full",
        "max_sources_per_partition",
        7,
    )
    assert owner.submitted == 1


@pytest.mark.parametrize(
    ("refusal", "kind"),
    [
        (RecordTooLarge(TOO_LARGE), RecordTooLarge),
        (LimitReached("full", "max_sources_per_partition", 3), LimitReached),
        (UnknownPartition("topic 'dc1.a' has partitions 0..1, not 2"), UnknownPartition),
        (BadRequest("the owner refused it"), BadRequest),
        (UnknownTopic("topic 'dc1.a' was deleted"), UnknownTopic),
        (NotOwner("dc1.a/0 is not owned here"), NotOwner),
        (StoreUnavailable("Kafka unavailable"), StoreUnavailable),
    ],
)
def test_each_refusal_crosses_the_batch_answer_as_itself(
    refusal: LogbrokerError, kind: type[LogbrokerError]
) -> None:
    wire = orjson.loads(orjson.dumps(encode_outcomes([refusal, CommitAnswer(AppendResult(4, 4))])))
    crossed, committed = decode_outcomes(wire, 2)
    assert type(crossed) is kind, wire
    assert str(crossed) == str(refusal)
    assert isinstance(committed, CommitAnswer) and committed.committed == AppendResult(4, 4)


def test_gateways_of_different_versions_answer_503_as_before() -> None:
    """During an upgrade: an owner of the earlier version names every refusal
    ``unavailable``, and an earlier sender takes any name it does not know for that; a
    refusal named by a later version is taken so here too.  Each is a 503, as it was."""
    earlier_owner = {"answers": [{"status": "error", "error": "unavailable", "reason": "big"}]}
    later_owner = {"answers": [{"status": "error", "error": "not_yet_named", "reason": "x"}]}
    for wire in (earlier_owner, later_owner):
        (crossed,) = decode_outcomes(wire, 1)
        assert type(crossed) is StoreUnavailable
    # what an earlier sender reads: an error answer with the fields it knows
    (answer,) = encode_outcomes([RecordTooLarge(TOO_LARGE)])["answers"]
    assert answer["status"] == "error" and answer["reason"] == TOO_LARGE
    assert answer["error"] not in ("not_owner", "unknown_topic")
    # a limit named without its fields cannot be stated as one: 503 as before
    (crossed,) = decode_outcomes(
        {"answers": [{"status": "error", "error": "limit_reached", "reason": "r"}]}, 1
    )
    assert type(crossed) is StoreUnavailable


def _owners(url: str, topic: str) -> dict[int, str]:
    answer = httpx.get(f"{url}/v1/topics/{topic}/owners", timeout=10)
    if answer.status_code != 200:
        return {}
    return {p["partition"]: (p["owner"] or "").rstrip("/") for p in answer.json()["partitions"]}


@pytest.mark.kafka
def test_a_chunk_too_large_for_kafka_is_answered_413_alike_by_its_owner_and_through_another(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two gateways on the session's Kafka; a chunk larger than Kafka's records may be (an
    operator raised ``max_chunk_bytes`` past them), of a source on a partition the second
    owns.  Written through the first, it used to be answered 503 (retried for ever); now the
    answer is the owner's own, word for word: 413 ``record_too_large``."""
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_CHUNK_BYTES", str(32 * 1024 * 1024))
    monkeypatch.setenv("LOGBROKER_LIMITS_MAX_BODY_BYTES", str(64 * 1024 * 1024))
    topic = "dc1.big"
    kafka_store.create_topic(topic, TopicConfig(partitions=4))
    first = start_kafka_gateway()
    second = start_kafka_gateway()
    wait_until(
        lambda: set(_owners(first.url, topic).values()) == {first.url, second.url},
        60,
        "both gateways to own partitions of the topic",
    )
    owners = _owners(first.url, topic)
    source = next(
        s for s in (f"big-{i}" for i in range(200)) if owners[stable_partition(s, 4)] == second.url
    )
    line = b"x" * 199 + b"\n"
    too_large = line * (17 * 1024 * 1024 // len(line))

    def write(gateway: GatewayProcess, seqno: int, data: bytes) -> httpx.Response:
        body = encode_binary([(meta(source, log_type="big"), [(seqno, 0, data)])])
        return httpx.post(
            gateway.url + "/v1/write",
            content=body,
            headers={"Content-Type": BINARY_MEDIA_TYPE},
            timeout=120,
        )

    assert write(first, 1, line).status_code == 200
    forwarded = write(first, 2, too_large)
    direct = write(second, 2, too_large)
    assert direct.status_code == 413, direct.text
    assert forwarded.status_code == 413, forwarded.text
    assert forwarded.json() == direct.json()
    assert forwarded.json()["error"] == "record_too_large"
    assert "retry-after" not in forwarded.headers
    taken = write(first, 2, line)
    assert taken.status_code == 200, taken.text
    assert taken.json()["results"][0]["acks"][0]["status"] == "written"
