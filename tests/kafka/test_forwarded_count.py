"""Who counts a forwarded write for the audit: the owner that commits it, if it says so.

The gateway that forwards an audited write asks the owner to count it (``counted_at_owner``),
and the owner's answer says it did (``"counted": true``).  Only then does the sender leave
the count to the owner (``committed_elsewhere``): an owner of an older version, during an
upgrade, answers without it and counts nothing, so the sender counts.  No broker here: the
owner is a stand-in that answers over the wire format.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

import pytest

from log_store.errors import LogbrokerError
from log_store.interface import AppendResult, PartitionState
from log_store.kafka.remote_transaction import (
    CommitAnswer,
    ForwardedTransaction,
    RemoteTransactions,
    start_future,
)


class _Directory:
    def owner(self, topic: str, partition: int, **_kwargs: Any) -> str | None:
        return "http://owner.example"


class _Owner:
    """A peer link to an owner that commits everything; ``counts``: a version that counts
    what it is asked to."""

    def __init__(self, *, counts: bool) -> None:
        self.counts = counts
        self.asked: list[bool] = []

    def read_state(self, *_args: Any) -> tuple[dict[str, bytes | None], int]:
        raise AssertionError("no state is read")

    def commit_many(
        self, url: str, items: Sequence[ForwardedTransaction]
    ) -> list[CommitAnswer | LogbrokerError]:
        answers: list[CommitAnswer | LogbrokerError] = []
        for item in items:
            prepared = item.prepared
            self.asked.append(prepared.counted_at_owner)
            committed = AppendResult(10, 10 + len(prepared.records) - 1)
            counted = self.counts and prepared.counted_at_owner
            wire = CommitAnswer(committed, counted=counted).to_json()
            answers.append(CommitAnswer.from_json(wire))
        return answers

    def close(self) -> None:
        return None


class _Write:
    """A transaction function writing two records; ``audited`` gives it the audit's hooks."""

    def __init__(self, *, audited: bool) -> None:
        self.elsewhere = 0
        if audited:
            self.committed_late = lambda _topic, _records: None

    def __call__(self, _state: PartitionState) -> list[bytes]:
        return [b"one", b"two"]

    def committed_elsewhere(self) -> None:
        self.elsewhere += 1


def _forward(owner: _Owner, fn: _Write) -> AppendResult:
    remote = RemoteTransactions(_Directory(), owner, timeout_s=5.0)
    try:
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        remote.submit("app", 0, fn, future)
        return future.result(timeout=10)
    finally:
        remote.close()


@pytest.mark.parametrize(
    ("owner_counts", "audited", "left_to_owner"),
    [
        (True, True, True),  # the usual case: the owner counted it, the sender does not
        (False, True, False),  # an older owner: the sender counts it
        (True, False, False),  # not audited: nobody asked the owner
    ],
)
def test_the_sender_leaves_the_count_to_the_owner_only_when_the_owner_says_it_counted(
    owner_counts: bool, audited: bool, left_to_owner: bool
) -> None:
    owner = _Owner(counts=owner_counts)
    fn = _Write(audited=audited)
    assert _forward(owner, fn) == AppendResult(10, 11)
    assert owner.asked == [audited]
    assert fn.elsewhere == (1 if left_to_owner else 0)


def test_an_answer_says_counted_only_when_it_committed_and_counted() -> None:
    committed = AppendResult(3, 4)
    assert CommitAnswer(committed, counted=True).to_json()["counted"] is True
    assert "counted" not in CommitAnswer(committed).to_json()  # as an older owner answers
    assert CommitAnswer.from_json(CommitAnswer(committed).to_json()).counted is False
    assert CommitAnswer.from_json(CommitAnswer(committed, counted=True).to_json()).counted


def test_a_transaction_an_owner_began_before_it_lost_the_partition_is_forwarded() -> None:
    """Fenced or moved after its first owner began it, a transaction is passed on with its
    future running already: it is forwarded all the same (it used to fail to start there,
    and its caller waited for ever)."""
    owner = _Owner(counts=True)
    remote = RemoteTransactions(_Directory(), owner, timeout_s=5.0)
    try:
        future: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        assert future.set_running_or_notify_cancel()  # its first owner began it
        remote.submit("app", 0, _Write(audited=False), future)
        assert future.result(timeout=10) == AppendResult(10, 11)
        answered: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        answered.set_result(AppendResult(1, 1))
        assert not start_future(answered)
        cancelled: concurrent.futures.Future[AppendResult] = concurrent.futures.Future()
        cancelled.cancel()
        assert not start_future(cancelled)
    finally:
        remote.close()
