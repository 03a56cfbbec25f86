"""``/readyz`` on Kafka says "not ready" when the cluster cannot take writes, not whenever one
look at it goes unanswered.

One broker of three SIGKILLed (replication factor 3, ``min.insync.replicas`` 2) made every
live gateway answer 503 for 2-7 s at once, while writes went on: readiness was one metadata
request with a 1 s timeout, which librdkafka may send to the broker that has just died.  The
look at Kafka here is a stand-in failing as those did (``_TIMED_OUT``); the store's other
parts are real and never reach a broker.  That a real outage still makes a gateway not ready
(503 with ``Retry-After``) is tested with real brokers in ``test_kafka_faults.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException

from log_store.errors import StoreUnavailable
from log_store.kafka import readiness
from log_store.kafka.settings import KafkaSettings
from log_store.kafka.store import KafkaLogStore
from log_store.kafka.topic_admin import TopicAdmin

_GRACE_S = 1.0


class _Looks:
    """``TopicAdmin.reachable`` as a broker's death makes it: the next ``failures`` asks (all,
    if None) time out."""

    def __init__(self) -> None:
        self.failures: int | None = 0
        self.asks: list[float] = []

    def __call__(self, timeout_s: float) -> str | None:
        self.asks.append(timeout_s)
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            error = KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out")
            raise StoreUnavailable(
                f"Kafka unavailable (asking Kafka for the cluster's metadata): {error}"
            ) from KafkaException(error)
        return "cluster"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KafkaLogStore, _Looks]]:
    # raising=False: the test also runs (and fails) on code without it
    monkeypatch.setattr(readiness, "GRACE_S", _GRACE_S, raising=False)
    opened = KafkaLogStore(KafkaSettings("127.0.0.1:9", librdkafka_log="debug"))
    looks = _Looks()
    monkeypatch.setattr(TopicAdmin, "reachable", lambda _admin, timeout_s: looks(timeout_s))
    opened.readiness()
    yield opened, looks
    opened.close()


def test_a_look_unanswered_once_is_asked_again_within_the_same_probe(
    store: tuple[KafkaLogStore, _Looks],
) -> None:
    kafka, looks = store
    looks.failures, looks.asks = 1, []
    started = time.monotonic()
    assert kafka.readiness() is None
    assert len(looks.asks) == 2
    assert time.monotonic() - started < 2.0  # /readyz waits 2 s for the store


def test_looks_unanswered_for_a_moment_after_kafka_answered_leave_the_gateway_ready(
    store: tuple[KafkaLogStore, _Looks],
) -> None:
    kafka, looks = store
    looks.failures = None
    assert kafka.readiness() is None  # Kafka answered a moment ago: a broker may just have died
    assert kafka.readiness() is None
    time.sleep(_GRACE_S)
    reason = kafka.readiness()
    assert reason is not None and reason.startswith("Kafka does not answer: "), reason
    assert "Timed out" in reason
    looks.failures = 0
    assert kafka.readiness() is None


def test_a_commit_counts_as_kafka_answering(store: tuple[KafkaLogStore, _Looks]) -> None:
    kafka, looks = store
    looks.failures = None
    time.sleep(_GRACE_S * 0.7)
    kafka.commits.add(1, 1)
    time.sleep(_GRACE_S * 0.7)  # the last look answered longer ago than the grace
    assert kafka.readiness() is None


def test_a_write_refused_since_kafka_last_answered_makes_an_unanswered_look_not_ready(
    store: tuple[KafkaLogStore, _Looks],
) -> None:
    kafka, looks = store
    kafka.commits.refused(StoreUnavailable("Kafka unavailable (commit): Local: Timed out"))
    looks.failures = None
    assert (kafka.readiness() or "").startswith("Kafka does not answer: ")
