"""A client that stays broken after a broker outage is replaced, not kept for ever.

After a broker outage of ~30 s, one gateway's AdminClient failed every call for minutes
("Failed while waiting for controller: Local: Timed out" from DescribeCluster, "Failed to
get metadata: Local: Broker transport failure" from a metadata request) while the gateway's
other clients talked to the same broker again: ``/readyz`` stayed 503 and every takeover of
the partitions the group had given it failed, so those partitions had no writer until the
gateway was restarted.

The stuck clients are stand-ins that answer as that one did (librdkafka's own errors, no
broker asked): the admin client, and the consumer every takeover reads the snapshot position
with.  The broker is the session's, which a new client reaches.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from log_store.errors import StoreUnavailable
from log_store.kafka import topic_admin
from log_store.kafka.partition_owner import OwnerContext
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.topic_admin import TopicAdmin

pytestmark = [pytest.mark.kafka]

_RENEW_AFTER_S = 1.0


class _StuckAdminClient:
    """Answers every call as the stuck client did: no usable broker (its DescribeCluster, no
    controller, is asked no more: see ``bootstrap.cluster_answer``)."""

    def __init__(self) -> None:
        self.calls = 0

    def list_topics(self, *_args: Any, **_kwargs: Any) -> Any:
        self.calls += 1
        raise KafkaException(
            KafkaError(
                KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"
            )
        )


class _StuckConsumer:
    def __init__(self) -> None:
        self.calls = 0

    def committed(self, *_args: Any, **_kwargs: Any) -> Any:
        self.calls += 1
        raise KafkaException(
            KafkaError(
                KafkaError._TRANSPORT, "Failed to get coordinator: Local: Broker transport failure"
            )
        )

    def close(self) -> None:
        """Nothing to let go: no librdkafka client behind it."""


@pytest.fixture
def quick_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    # raising=False: the test also runs (and fails) on code without the renewal
    monkeypatch.setattr(topic_admin, "RENEW_AFTER_S", _RENEW_AFTER_S, raising=False)


def _ready_within(admin: TopicAdmin, seconds: float) -> float | None:
    """Seconds until ``reachable`` and ``names`` succeed, asked as ``/readyz`` and a takeover
    ask (every 0.2 s); None if they did not within ``seconds``."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            admin.reachable(1.0)
            admin.names()
            return time.monotonic() - started
        except StoreUnavailable:
            time.sleep(0.2)
    return None


def test_an_admin_client_that_stays_unanswered_while_kafka_answers_is_replaced(
    kafka_cluster: Any, kafka_namespace: str, quick_renewal: None
) -> None:
    admin = TopicAdmin(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=2.0)
    )
    admin.reachable(10.0)
    stuck = _StuckAdminClient()
    admin.client = stuck  # type: ignore[assignment]
    with pytest.raises(StoreUnavailable, match="Broker transport failure"):
        admin.reachable(1.0)
    took = _ready_within(admin, 15.0)
    assert took is not None, (
        f"the admin client was kept through {stuck.calls} failed calls in 15 s while Kafka "
        "answers a new client"
    )
    assert admin.client is not stuck
    # the bound, a new client's first answer, and the 0.2 s between the asks
    assert took < _RENEW_AFTER_S + 4.0, f"replaced only after {took:.1f} s"


def test_an_admin_client_is_kept_while_kafka_answers_no_new_client_either(
    quick_renewal: None,
) -> None:
    """Kafka away for every client: nothing to gain from a new one; the old one reconnects
    as usual once Kafka is back."""
    admin = TopicAdmin(KafkaSettings("127.0.0.1:9", operation_timeout_s=1.0))
    stuck = _StuckAdminClient()
    admin.client = stuck  # type: ignore[assignment]
    assert _ready_within(admin, _RENEW_AFTER_S + 4.0) is None
    assert admin.client is stuck
    assert getattr(admin, "renewals", 0) == 0


def test_a_snapshot_consumer_that_stays_unanswered_is_replaced(
    kafka_cluster: Any, kafka_namespace: str, quick_renewal: None
) -> None:
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=2.0
    )
    ctx = OwnerContext(settings, None, None, None, retry=lambda *_: None)  # type: ignore[arg-type]
    stuck = _StuckConsumer()
    ctx._snapshot_consumer = stuck  # type: ignore[assignment]
    started = time.monotonic()
    try:
        while True:
            try:
                assert ctx.committed_snapshot(f"{kafka_namespace}state", 0) is None
                break
            except StoreUnavailable:
                assert time.monotonic() - started < 15.0, (
                    f"every takeover would still fail: {stuck.calls} asks of the stuck consumer"
                )
                time.sleep(0.2)
        assert ctx._snapshot_consumer is not stuck
    finally:
        ctx.close()


class _StuckWatermarksConsumer:
    """Answers as the watermarks consumer did for two minutes after a broker restart."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def get_watermark_offsets(self, *_args: Any, **_kwargs: Any) -> Any:
        self.calls += 1
        raise KafkaException(
            KafkaError(
                KafkaError._ALL_BROKERS_DOWN,
                "Failed to get watermark offsets: Local: All broker connections are down",
            )
        )

    def list_topics(self, *_args: Any, **_kwargs: Any) -> Any:
        raise KafkaException(
            KafkaError(
                KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"
            )
        )

    def close(self) -> None:
        self.closed = True


def test_a_watermarks_consumer_that_stays_unanswered_is_replaced(
    kafka_cluster: Any, kafka_namespace: str, quick_renewal: None
) -> None:
    from log_store.kafka.fetcher import Watermarks

    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=1.0
    )
    admin = TopicAdmin(settings)
    admin.client.create_topics([NewTopic(f"{kafka_namespace}marks", 1, 1)])[
        f"{kafka_namespace}marks"
    ].result(30)
    watermarks = Watermarks(settings)
    stuck = _StuckWatermarksConsumer()
    watermarks._consumer = stuck  # type: ignore[assignment]
    started = time.monotonic()
    try:
        while True:
            try:
                assert watermarks.get(f"{kafka_namespace}marks", 0) == (0, 0)
                break
            except StoreUnavailable:
                assert time.monotonic() - started < 20.0, (
                    f"every takeover would still fail: {stuck.calls} asks of the stuck consumer"
                )
                time.sleep(0.2)
        assert watermarks._consumer is not stuck
        assert watermarks.renewals == 1
    finally:
        watermarks.close()
