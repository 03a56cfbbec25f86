"""A fenced partition writer's librdkafka lines go to Python logging, at INFO when expected.

Every partition move fences the old owner's producer (the design's way a writer learns it
lost its partition), and librdkafka said so on stderr at its highest level: ``%0|...|FATAL|
... This instance has been fenced by a newer instance``, with ``TXNERR`` and ``ADDPARTS ...
old epoch`` before it, paging an operator who alerts on FATAL at every rebalance.  Here the
writer is fenced as a new owner fences it: another producer calls ``init_transactions`` with
the partition's transactional id, and the writer then commits.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import Producer

from log_store import LogStore, TopicConfig
from log_store.kafka import naming
from log_store.kafka.settings import KafkaSettings

pytestmark = [pytest.mark.kafka]

TOPIC = "dc1.app"
_LOGGER = "log_store.kafka.librdkafka"


def _fence(kafka_cluster: Any, namespace: str, partition: int) -> None:
    """Take the partition's transactional id over, as its next owner would."""
    settings = KafkaSettings(kafka_cluster.bootstrap, namespace=namespace)
    txn_id = naming.transactional_id(namespace, TOPIC, partition)
    producer = Producer(settings.producer_config(txn_id))
    producer.init_transactions(20)


def _fenced_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == _LOGGER and "fenced" in r.getMessage().lower()]


def test_a_writer_fenced_by_the_next_owner_logs_it_at_info_not_as_fatal(
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG, logger=_LOGGER)
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=1))
    kafka_store.append(TOPIC, 0, [b"before"])
    _fence(kafka_cluster, kafka_namespace, 0)
    # the writer finds itself fenced, gives the partition up and (writing on demand) takes
    # it over again: the write goes through
    kafka_store.append(TOPIC, 0, [b"after"])
    fenced = _fenced_lines(caplog)
    assert fenced, "no librdkafka line about the fencing reached the logger"
    # one line at INFO (librdkafka says it three times: ADDPARTS, TXNERR, FATAL), the rest
    # at DEBUG
    shown = [r for r in fenced if r.levelno > logging.DEBUG]
    assert [r.levelno for r in shown] == [logging.INFO], [
        (r.levelname, r.getMessage()) for r in fenced
    ]
    assert f"{TOPIC}/0: its writer here was fenced" in shown[0].getMessage()
    assert "fatal" not in shown[0].getMessage().lower()
    assert "FATAL" not in capfd.readouterr().err


def test_a_writer_fenced_while_the_group_gives_it_the_partition_warns(
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another writer took over a partition this gateway still holds: worth a WARNING (a
    gateway that had not heard of a move), never librdkafka's FATAL."""
    caplog.set_level(logging.DEBUG, logger=_LOGGER)
    kafka_store._ctx.assigned = lambda *_: True  # type: ignore[attr-defined]
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=1))
    kafka_store.append(TOPIC, 0, [b"before"])
    _fence(kafka_cluster, kafka_namespace, 0)
    kafka_store.append(TOPIC, 0, [b"after"])
    fenced = _fenced_lines(caplog)
    shown = [r.levelno for r in fenced if r.levelno > logging.DEBUG]
    assert shown == [logging.WARNING], [(r.levelname, r.getMessage()) for r in fenced]
