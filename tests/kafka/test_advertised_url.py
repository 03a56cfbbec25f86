"""A gateway on Kafka whose ``advertised_url`` does not reach it refuses to start, and a live
owner's claims survive whatever other processes do.

Real ``logbroker serve --store kafka`` processes on the session's broker; an
``OwnerDirectory`` of the test's own reads the claims as every gateway does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from log_store import LogStore, TopicConfig
from log_store.kafka import KafkaSettings
from log_store.kafka.gateway_group import MEND_CLAIMS_S
from log_store.kafka.owner_directory import OwnerDirectory
from tests.conftest import GatewayProcess, free_port
from tests.kafka.conftest import wait_until

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"


@pytest.fixture
def observer(kafka_cluster: Any, kafka_namespace: str) -> Iterator[OwnerDirectory]:
    directory = OwnerDirectory(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace), self_url=""
    )
    directory.start()
    yield directory
    directory.stop()


def _owners(observer: OwnerDirectory) -> dict[int, str]:
    return {p: url for (t, p), url in observer.snapshot().items() if t == TOPIC}


def test_a_gateway_started_with_a_live_gateways_url_exits_2_and_the_live_one_keeps_its_claims(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    observer: OwnerDirectory,
) -> None:
    """Before: the second gateway started silently, joined the group, withdrew the first
    one's claims (at its start and at its stop) and announced the partitions it was given
    under the first one's URL; writes forwarded to either failed.  Also: a claim of a live
    owner that disappears (here withdrawn from outside) is made again, in bounded time."""
    first = start_kafka_gateway()
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=2))
    wait_until(lambda: _owners(observer) == {0: first.url, 1: first.url}, 30, "first's claims")

    with pytest.raises(RuntimeError, match="exited with 2") as refused:
        start_kafka_gateway("--advertised-url", first.url)
    assert "another gateway (instance " in str(refused.value)
    assert f"answers at {first.url}: two gateways cannot share an advertised_url" in str(
        refused.value
    )
    assert _owners(observer) == {0: first.url, 1: first.url}

    # a claim gone for any reason (a process of an older release at this URL withdrew it)
    (claimant,) = observer._claims[(TOPIC, 0)]
    observer._publish(TOPIC, 0, None, claimant=claimant)
    wait_until(lambda: _owners(observer) == {1: first.url}, 10, "the claim to be withdrawn")
    wait_until(
        lambda: _owners(observer) == {0: first.url, 1: first.url},
        MEND_CLAIMS_S + 5,
        "the owner to claim partition 0 again",
    )


def test_a_gateway_whose_advertised_url_reaches_nothing_exits_2(
    start_kafka_gateway: Callable[..., GatewayProcess], observer: OwnerDirectory
) -> None:
    """Before: it started, took partitions, and every write of them sent by another
    gateway failed "cannot be reached" for as long as it ran."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match="exited with 2") as refused:
        start_kafka_gateway("--advertised-url", nowhere, "--advertised-url-check", "1")
    assert f"{nowhere} does not reach this gateway: check --advertised-url" in str(refused.value)
    assert "ConnectError" in str(refused.value)
    assert _owners(observer) == {}
