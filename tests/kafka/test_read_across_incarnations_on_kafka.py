"""Readers of a topic deleted and made again on Kafka: each read names the topic's identity
(Kafka's topic id), so a reader at an offset of the old topic starts the new one from its
start instead of reading it from that offset (see tests/delivery/incarnations.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import GatewayProcess
from tests.delivery import incarnations

pytestmark = pytest.mark.kafka

ONE_PARTITION = "partitions = 1\n"


@pytest.mark.parametrize("group", [None, "g1"])
def test_a_reader_goes_on_in_the_new_topic_from_its_start(
    start_kafka_gateway: Callable[..., GatewayProcess],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    group: str | None,
) -> None:
    gateway = start_kafka_gateway(top=ONE_PARTITION)
    incarnations.a_reader_goes_on_in_the_new_topic_from_its_start(
        gateway.url, monkeypatch, caplog, group
    )


def test_a_group_starts_a_topic_made_again_from_its_start(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    gateway = start_kafka_gateway(top=ONE_PARTITION)
    incarnations.a_group_starts_a_topic_made_again_from_its_start(gateway.url)


def test_a_pull_client_is_told_of_the_new_topic(
    start_kafka_gateway: Callable[..., GatewayProcess],
) -> None:
    gateway = start_kafka_gateway(top=ONE_PARTITION)
    incarnations.a_pull_client_is_told_of_the_new_topic(gateway.url)
