"""Ownership claims in ``__<ns>logbroker-owners``: a gateway withdraws only its own.

Real ``OwnerDirectory`` instances (what each gateway runs) on the session's broker, each as a
gateway at its own URL would use it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from log_store.kafka import KafkaSettings
from log_store.kafka.owner_directory import OwnerDirectory
from tests.kafka.conftest import wait_until

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"


class _LaggingView(OwnerDirectory):
    """A gateway whose tail of the claims falls behind while ``lagging`` is set (a busy
    process): what it reads meanwhile is applied once it catches up."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lagging = threading.Event()
        self._backlog: list[tuple[bytes | None, bytes | None]] = []

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if self.lagging.is_set() and threading.current_thread().name == "logbroker-owners":
            self._backlog.append((key, value))
            return
        super()._apply(key, value)

    def catch_up(self) -> None:
        self.lagging.clear()
        backlog, self._backlog = self._backlog, []
        for key, value in backlog:
            super()._apply(key, value)


@contextmanager
def _directory(
    kafka_cluster: Any, namespace: str, url: str, kind: type[OwnerDirectory] = OwnerDirectory
) -> Iterator[Any]:
    directory = kind(KafkaSettings(kafka_cluster.bootstrap, namespace=namespace), self_url=url)
    directory.start()
    try:
        yield directory
    finally:
        directory.stop()


def _settled(directories: list[OwnerDirectory], partition: int, owner: str | None) -> bool:
    return all(d.owner(TOPIC, partition) == owner for d in directories)


def test_a_late_withdrawal_leaves_the_next_owners_claim(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """Before: A withdrew partition 3 after B had claimed it (A's view had not read B's claim
    yet: A was slow to give up the partition of a deleted topic, whose name the topic made
    again and given to B at once shares), the withdrawal erased B's claim, and every gateway
    saw partition 3 without an owner until B's next takeover, which nothing caused."""
    a_url, b_url = "http://gateway-a:1", "http://gateway-b:1"
    with (
        _directory(kafka_cluster, kafka_namespace, a_url, _LaggingView) as a,
        _directory(kafka_cluster, kafka_namespace, b_url) as b,
    ):
        a.announce(TOPIC, 3)
        wait_until(lambda: _settled([a, b], 3, a_url), 10, "both to see A's claim")
        a.lagging.set()
        b.announce(TOPIC, 3)
        with _directory(kafka_cluster, kafka_namespace, "") as observer:
            wait_until(lambda: _settled([observer], 3, b_url), 10, "B's claim to be written")
            assert a.owner(TOPIC, 3) == a_url  # A has not read it
            a.withdraw(TOPIC, 3)
            wait_until(lambda: a._backlog, 10, "A to read its withdrawal")
            a.catch_up()
            wait_until(lambda: _settled([a, b, observer], 3, b_url), 10, "B to own partition 3")
        with _directory(kafka_cluster, kafka_namespace, "") as later:
            assert later.owner(TOPIC, 3) == b_url  # a gateway started later agrees


def test_the_last_standing_claim_owns_and_a_restarted_gateway_withdraws_what_it_left(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    a_url, b_url = "http://gateway-a:1", "http://gateway-b:1"
    with _directory(kafka_cluster, kafka_namespace, a_url) as a:
        a.announce(TOPIC, 0)
        a.announce(TOPIC, 1)
    # A is gone without withdrawing (as after SIGKILL): its claims stand
    with (
        _directory(kafka_cluster, kafka_namespace, b_url) as b,
        _directory(kafka_cluster, kafka_namespace, "") as observer,
    ):
        wait_until(lambda: _settled([b, observer], 0, a_url), 10, "A's claims to be read")
        b.announce(TOPIC, 0)
        wait_until(lambda: _settled([b, observer], 0, b_url), 10, "B's later claim to own")
        assert observer.owner(TOPIC, 1) == a_url
        with _directory(kafka_cluster, kafka_namespace, a_url) as restarted:
            # the process now at A's URL owns nothing yet: what its predecessor left goes
            wait_until(lambda: _settled([observer, restarted], 1, None), 10, "A's leftovers")
            assert _settled([observer, restarted, b], 0, b_url)
            restarted.announce(TOPIC, 0)
            wait_until(lambda: _settled([observer, b], 0, a_url), 10, "A's new claim")
            restarted.withdraw(TOPIC, 0)
            # B's claim still stands: B owns again, for every view
            wait_until(lambda: _settled([observer, b, restarted], 0, b_url), 10, "B again")
