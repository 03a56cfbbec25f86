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


def test_the_last_standing_claim_owns_and_the_next_owner_withdraws_what_a_dead_one_left(
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
        with _directory(kafka_cluster, kafka_namespace, a_url) as restarted:
            # the process now at A's URL cannot tell its dead predecessor from a live gateway
            # sharing the URL by mistake: it withdraws nothing of it
            assert _settled([observer, restarted], 1, a_url)
            # B took partition 0 over (fencing every earlier writer): A's claim there is stale
            b.announce(TOPIC, 0)
            wait_until(lambda: _settled([b, observer], 0, b_url), 10, "B's later claim to own")
            b.withdraw(TOPIC, 0)
            wait_until(lambda: _settled([observer, b, restarted], 0, None), 10, "no claim")
            assert observer.owner(TOPIC, 1) == a_url
            restarted.announce(TOPIC, 1)
            restarted.withdraw(TOPIC, 1)
            wait_until(lambda: _settled([observer, b, restarted], 1, None), 10, "no claim on 1")


def test_a_second_process_at_the_same_url_never_withdraws_the_first_ones_claims(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """Before: a gateway started by mistake with a live gateway's URL withdrew that
    gateway's claims at its start ("what an earlier process at its URL left") and again at
    its stop: the partitions had no owner for every other gateway for as long as both ran,
    and after."""
    url = "http://gateway-a:1"
    with (
        _directory(kafka_cluster, kafka_namespace, url) as live,
        _directory(kafka_cluster, kafka_namespace, "") as observer,
    ):
        live.announce(TOPIC, 3)
        wait_until(lambda: _settled([observer], 3, url), 10, "the live claim to be read")
        with _directory(kafka_cluster, kafka_namespace, url) as duplicate:
            assert duplicate.instance != live.instance
            duplicate.announce(TOPIC, 1)
            wait_until(lambda: _settled([observer], 1, url), 10, "the duplicate's claim")
            duplicate.withdraw(TOPIC, 3)  # not its claim: nothing is written
        wait_until(lambda: _settled([observer], 1, url), 10, "a claim its stop left")
        # its stop withdrew nothing; its own claim of 1 stays as after a crash (the next
        # owner of 1 withdraws it); the live gateway's claim of 3 stands throughout
        with _directory(kafka_cluster, kafka_namespace, "") as later:
            assert later.owner(TOPIC, 3) == url
        assert observer.owner(TOPIC, 3) == url
        assert live.own_claims() == {(TOPIC, 3)}
