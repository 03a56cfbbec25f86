"""What librdkafka's errors mean to logbroker's callers.

A writer that was fenced, a topic that is gone, and a cluster that cannot be reached are the
three outcomes a caller acts on differently: take over again (or go to the new owner), look
the topic up again, or answer 503 and keep the data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from log_store.errors import (
    LogbrokerError,
    RecordTooLarge,
    StoreUnavailable,
    UnknownPartition,
    UnknownTopic,
)

_T = TypeVar("_T")


class WriterFenced(LogbrokerError):
    """A newer writer of the partition called ``init_transactions``: this one may not commit.

    Internal to the backend: the store takes the partition over again or sends the
    transaction to the partition's owner; callers never see it.
    """


class OwnerGone(LogbrokerError):
    """The partition owner stopped (revoked, fenced, closed) before running a transaction.

    Internal to the backend: the store submits the transaction again wherever the partition
    is owned now.
    """


class PartitionGone(UnknownPartition, UnknownTopic):
    """A write (or a routing read) for a partition the topic does not have (or no longer).

    Partitions never shrink, so a writer that routed a source there routed it in a topic
    that was deleted and made again with fewer partitions: an ``UnknownTopic`` too, which
    makes it look the topic up again and route afresh (as an ``UnknownPartition`` alone, its
    cached route answered 404 for ever).  To a caller that named a partition out of range
    it is the ``UnknownPartition`` it always was.
    """


_FENCED = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}
_GONE = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.UNKNOWN_TOPIC_ID,
}


_TOO_LARGE = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
}
"""What a record (or a batch of records) over the topic's or the producer's limit gets,
from librdkafka at ``produce`` or from the broker: the same on every attempt."""


_UNAVAILABLE = {
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._RESOLVE,
    KafkaError._DESTROY,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.NOT_COORDINATOR,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.KAFKA_STORAGE_ERROR,
}
_METADATA_LAG = {
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
}


_COORDINATOR_MOVING = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def is_coordinator_moving(error: KafkaError | None) -> bool:
    """A group's coordinator being chosen or loaded (a group's first use, a broker restarted)."""
    return error is not None and error.code() in _COORDINATOR_MOVING


def is_unavailable(error: KafkaError | None) -> bool:
    """The cluster (or the way to it) is away: nothing to do but wait and try again."""
    return error is not None and error.code() in _UNAVAILABLE


def is_metadata_lag(error: KafkaError | None) -> bool:
    """What a partition just created, grown or moved answers for a moment."""
    return error is not None and error.code() in _METADATA_LAG


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The librdkafka error behind ``exc``, also when it is the cause of another exception
    (a delivery callback run while ``produce`` raises shows up as a ``SystemError``)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if (
            isinstance(current, KafkaException)
            and current.args
            and isinstance(current.args[0], KafkaError)
        ):
            return current.args[0]
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def known_offset(offset: int, what: str) -> int:
    """``offset`` as Kafka answered it for ``what``; an unknown one raises as a leader not
    available, so it is asked again like one.

    While a broker shuts down, librdkafka's ListOffsets can answer -1001 (``OFFSET_INVALID``)
    without an error.  Taken as a partition's end, it made the partition look empty.
    """
    if offset < 0:
        raise KafkaException(
            KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"Kafka answered no offset for {what}")
        )
    return offset


def is_too_large(error: KafkaError | None) -> bool:
    return error is not None and error.code() in _TOO_LARGE


def is_fenced(error: KafkaError | None) -> bool:
    return error is not None and error.code() in _FENCED


def is_topic_gone(error: KafkaError | None) -> bool:
    return error is not None and error.code() in _GONE


def as_store_error(exc: BaseException, what: str) -> LogbrokerError:
    """The logbroker error a librdkafka failure of ``what`` means."""
    if isinstance(exc, LogbrokerError):
        return exc
    error = kafka_error(exc)
    if is_fenced(error):
        return WriterFenced(f"{what}: {error}")
    if is_topic_gone(error):
        return UnknownTopic(f"{what}: the topic is gone ({error})")
    return StoreUnavailable(f"Kafka unavailable ({what}): {error or exc}")


def as_commit_error(exc: BaseException, what: str) -> LogbrokerError:
    """What a failed transaction of a partition owner means.

    A cluster out of reach is ``StoreUnavailable`` (answer 503 now); a record too large is
    ``RecordTooLarge`` (it would be refused again: taken for a takeover, it dropped the
    partition's owner and was retried ten times, each after a takeover); anything
    else the cluster said about the transaction is taken as "this writer lost the
    partition": the transaction runs again after a fresh takeover, which settles what the
    failed one left.
    """
    if isinstance(exc, LogbrokerError):
        return exc
    error = kafka_error(exc)
    if is_too_large(error):
        return RecordTooLarge(f"{what}: a record is larger than the topic takes ({error})")
    if error is None or is_topic_gone(error) or is_unavailable(error):
        return as_store_error(exc, what)
    return WriterFenced(f"{what}: {error}")


def without_tracebacks(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions it was raised from (their types
    and messages stay).

    A traceback holds the frames it passed, with their locals: a failed commit's records and
    state changes, in a reference cycle when the frame also holds the exception.  Kept on a
    caller's future, or until the garbage collector's next full pass, they outlive the
    request by long."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        current.__traceback__ = None
        current = current.__cause__ or current.__context__
        seen += 1


def ask_again(
    ask: Callable[[float], _T],
    *,
    timeout_s: float,
    retried_for: Callable[[Exception], float | None],
    pause_s: float,
    refresh: Callable[[], None] | None = None,
) -> _T:
    """``ask``'s answer, asked again while it fails with an error that may pass.

    ``ask`` is given what is left of ``timeout_s`` (counted from the first attempt, so it
    may be negative), for its own timeout.  ``retried_for(exc)`` says for how many seconds
    from the first attempt an error like ``exc`` is asked again (``None``: not at all).
    Between attempts ``refresh`` runs (to bring librdkafka's metadata up to date), then a
    pause of ``pause_s``.  The error that ends the attempts is raised as it is: the caller
    says what it means.
    """
    started = time.monotonic()
    while True:
        try:
            return ask(started + timeout_s - time.monotonic())
        except Exception as exc:
            retried_s = retried_for(exc)
            if retried_s is None or time.monotonic() > started + retried_s:
                raise
        if refresh is not None:
            refresh()
        time.sleep(pause_s)
