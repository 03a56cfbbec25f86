"""The store's watch of Kafka (``log_store.kafka.outage``) with a stand-in look at the
cluster and librdkafka's lines and errors fed as librdkafka hands them over; the real
gateway through a cut connection is ``test_kafka_away.py``."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from log_store.errors import StoreUnavailable
from log_store.kafka.outage import ClientLines, KafkaOutage, failure_reason

_REFUSED = (
    "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused "
    "(after 0ms in state CONNECT)"
)


class _Look:
    """``TopicAdmin.reachable``: answered while ``answers``, else no broker answered."""

    def __init__(self) -> None:
        self.answers = True
        self.asks = 0

    def __call__(self, timeout_s: float) -> str:
        self.asks += 1
        if not self.answers:
            raise StoreUnavailable(
                "Kafka unavailable (asking ...): Local: Broker transport failure"
            )
        return "cluster"


def test_the_lines_go_to_the_debug_log_and_keep_the_last_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = ClientLines()
    with caplog.at_level(logging.DEBUG, logger="log_store.kafka.librdkafka"):
        lines.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", _REFUSED)
        lines.error(KafkaError(KafkaError._TRANSPORT, _REFUSED))
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.DEBUG]
    assert lines.last_failure == "Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
    assert lines.failures == 2
    assert lines.all_down_at == float("-inf")
    lines.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert lines.all_down_at > float("-inf")
    assert failure_reason(_REFUSED) == lines.last_failure


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_every_broker_lost_and_an_unanswered_look_make_kafka_away_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, look = _Clock(), _Look()
    lines = ClientLines(clock)
    outage = KafkaOutage(look, lines=lines, clock=clock)
    outage.tick()
    assert look.asks == 0  # nothing said that Kafka is away: no look
    look.answers = False
    with caplog.at_level(logging.WARNING, logger="log_store.kafka.outage"):
        lines.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", _REFUSED)
        outage.tick()
        assert outage.away() is None, "a failed connection alone (a broker of three) is none"
        clock.now += 1.0
        lines.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        outage.tick()
        away = outage.away()
        assert away is not None and "Connection refused" in away, away
        for _ in range(20):  # asked again and again; said once in 10 s
            clock.now += 0.5
            lines.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", _REFUSED)
            outage.tick()
        look.answers = True
        outage.tick()
        assert outage.away() is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("Kafka is unreachable from this gateway: Connect to")
    assert said[1].startswith("Kafka answers this gateway again, after 10.0 s")


def test_failures_while_kafka_answers_are_said_once_they_last(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One broker of three away: its connections fail, the cluster answers; said after 5 s
    of failures, then once per 30 s; a short burst is not said."""
    clock, look = _Clock(), _Look()
    lines = ClientLines(clock)
    outage = KafkaOutage(look, lines=lines, clock=clock)
    with caplog.at_level(logging.WARNING, logger="log_store.kafka.outage"):
        lines.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", _REFUSED)
        for _ in range(20):  # 10 s without another failure: a burst, over
            clock.now += 0.5
            outage.tick()
        assert not caplog.records
        for _ in range(80):  # 40 s of failures
            clock.now += 0.5
            lines.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", _REFUSED)
            outage.tick()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("librdkafka reports failures while Kafka answers this gateway")
    assert outage.away() is None and look.asks == 0


def test_a_client_losing_every_broker_while_kafka_answers_the_look_is_no_outage() -> None:
    """A client that knows only a broker that died (one bootstrap address) loses "every"
    broker; the look at the cluster, answered by the others, says Kafka is there."""
    lines, look = ClientLines(), _Look()
    outage = KafkaOutage(look, lines=lines)
    lines.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    outage.tick()
    assert look.asks == 1
    assert outage.away() is None
    assert not outage.all_down_since_answer()
