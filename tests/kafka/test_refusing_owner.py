"""An owner whose address refuses connections is given up after about a second; a slow one
is waited for as before, and an owner announced meanwhile gets the call.

No broker and no gateway: the owners' directory and the peer link are stand-ins (the real
ones, with a SIGKILLed owner, are in ``test_owner_killed.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from log_store.errors import PartitionUnavailable
from log_store.kafka.remote_transaction import (
    CommitAnswer,
    ForwardedTransaction,
    PeerRefused,
    PeerUnreachable,
    RemoteTransactions,
)

DEAD = "http://dead:1"
SLOW = "http://slow:1"
NEW = "http://new:1"


class _Directory:
    def __init__(self, url: str) -> None:
        self.url = url
        self._cond = threading.Condition()

    def announce(self, url: str) -> None:
        with self._cond:
            self.url = url
            self._cond.notify_all()

    def owner(
        self, topic: str, partition: int, *, not_url: str | None = None, wait_s: float = 0.0
    ) -> str | None:
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self.url == not_url:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self.url


class _Link:
    def __init__(self) -> None:
        self.refusing = {DEAD}
        self.calls: list[str] = []

    def read_state(
        self, url: str, topic: str, partition: int, keys: Sequence[str]
    ) -> tuple[dict[str, bytes | None], int]:
        self.calls.append(url)
        if url in self.refusing:
            raise PeerRefused(f"{url}: ConnectError: [Errno 111] Connection refused")
        if url == SLOW:
            time.sleep(0.1)
            raise PeerUnreachable(f"{url}: ConnectTimeout")
        return {}, 7

    def commit_many(
        self, url: str, items: Sequence[ForwardedTransaction]
    ) -> list[CommitAnswer | Exception]:
        raise AssertionError("not used")

    def close(self) -> None:
        """The stand-in holds no connection to close."""


def _remote(owner: str, timeout_s: float = 4.0) -> tuple[RemoteTransactions, _Directory, _Link]:
    directory, link = _Directory(owner), _Link()
    remote = RemoteTransactions(directory, link, timeout_s=timeout_s)  # type: ignore[arg-type]
    return remote, directory, link


def test_an_owner_refusing_every_connection_is_given_up_after_about_a_second() -> None:
    remote, _directory, link = _remote(DEAD)
    started = time.monotonic()
    with pytest.raises(PartitionUnavailable, match="refused every connection") as refused:
        remote.read_state("dc1.app", 2, ["k"])
    took = time.monotonic() - started
    assert 1.0 <= took < 2.0, took
    assert (refused.value.topic, refused.value.partition) == ("dc1.app", 2)
    assert len(link.calls) >= 3
    # Known dead now: the next call gives up after its own first refusal.
    started = time.monotonic()
    with pytest.raises(PartitionUnavailable):
        remote.read_state("dc1.app", 3, ["k"])
    assert time.monotonic() - started < 0.5
    remote.close()


def test_an_owner_announced_while_the_old_one_refuses_gets_the_call() -> None:
    remote, directory, link = _remote(DEAD)
    threading.Timer(0.5, directory.announce, args=(NEW,)).start()
    assert remote.read_state("dc1.app", 2, ["k"]) == {}
    assert link.calls[-1] == NEW
    remote.close()


def test_an_owner_that_does_not_answer_without_refusing_is_waited_for_until_the_timeout() -> None:
    remote, _directory, _link = _remote(SLOW, timeout_s=2.5)
    started = time.monotonic()
    with pytest.raises(PartitionUnavailable, match="cannot be reached"):
        remote.read_state("dc1.app", 2, ["k"])
    assert time.monotonic() - started >= 2.5
    remote.close()


def test_an_address_that_answers_again_is_not_taken_for_dead_by_its_old_refusals() -> None:
    remote, _directory, link = _remote(DEAD)
    with pytest.raises(PartitionUnavailable):
        remote.read_state("dc1.app", 2, ["k"])
    link.refusing.clear()  # a gateway listens there again
    assert remote.read_state("dc1.app", 2, ["k"]) == {}
    link.refusing.add(DEAD)  # and is gone again: a second of refusals before giving up
    started = time.monotonic()
    with pytest.raises(PartitionUnavailable):
        remote.read_state("dc1.app", 2, ["k"])
    assert time.monotonic() - started >= 1.0
    remote.close()
