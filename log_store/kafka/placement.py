"""Where a partition's transactions run: here, or at the partition's owner elsewhere.

A process that opens the Kafka store by itself (a test, ``logbroker topics``, a library user)
uses :class:`OnDemand`: it becomes the writer of any partition it writes to, fencing whoever
wrote it before.  Gateways use :class:`~log_store.kafka.gateway_group.GatewayGroup`: the
partitions are shared out among them by a Kafka consumer group, each writes only those it was
given, and sends the transactions of the others to their owners
(:mod:`log_store.kafka.remote_transaction`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Protocol

from log_store.interface import AppendResult, TransactionFn


class RemoteOwners(Protocol):
    """Runs transactions and state reads at the owner of a partition in another process."""

    def submit(
        self,
        topic: str,
        partition: int,
        fn: TransactionFn,
        future: concurrent.futures.Future[AppendResult],
    ) -> None:
        """Run ``fn`` at the owner; resolve ``future`` after the owner's commit."""
        ...

    def submit_many(
        self,
        items: Sequence[tuple[str, int, TransactionFn, concurrent.futures.Future[AppendResult]]],
    ) -> None:
        """Like ``submit`` for several transactions: one request per owner for all of them."""
        ...

    def read_state(
        self, topic: str, partition: int, keys: Sequence[str]
    ) -> dict[str, bytes | None]: ...

    def close(self) -> None: ...


class Placement(Protocol):
    """Which partitions this process writes, and how it reaches the owners of the others."""

    def owns(self, topic: str, partition: int) -> bool:
        """True if this process is (or may become) the partition's writer."""
        ...

    def remote(self) -> RemoteOwners | None:
        """How to reach the owners of partitions this process does not own; None: no way."""
        ...

    def topics_changed(self) -> None:
        """This process created a topic or added partitions: share them out soon."""
        ...


class OnDemand:
    """Every partition may be written here; writing one takes it over."""

    def owns(self, topic: str, partition: int) -> bool:
        return True

    def remote(self) -> RemoteOwners | None:
        return None

    def topics_changed(self) -> None:
        return None
