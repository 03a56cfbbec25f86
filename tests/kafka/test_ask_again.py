"""``ask_again``: the one loop behind the Kafka backend's "ask again while it may pass"."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from log_store.kafka.failures import ask_again, is_coordinator_moving, kafka_error


class FailingAsk:
    """Fails with ``error`` ``failures`` times (forever if ``None``), then answers 42."""

    def __init__(self, error: Exception, failures: int | None) -> None:
        self.error = error
        self.failures = failures
        self.remaining: list[float] = []

    def __call__(self, remaining_s: float) -> int:
        self.remaining.append(remaining_s)
        if self.failures is None or len(self.remaining) <= self.failures:
            raise self.error
        return 42


def coordinator_moving(exc: Exception) -> float | None:
    return 5.0 if is_coordinator_moving(kafka_error(exc)) else None


def test_an_error_that_passes_is_asked_again_with_a_refresh_between_attempts() -> None:
    ask = FailingAsk(KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)), failures=3)
    refreshes: list[int] = []
    answer = ask_again(
        ask,
        timeout_s=5.0,
        retried_for=coordinator_moving,
        pause_s=0.01,
        refresh=lambda: refreshes.append(len(ask.remaining)),
    )
    assert answer == 42
    assert len(ask.remaining) == 4
    assert refreshes == [1, 2, 3]  # after each failure, before the next attempt
    # each attempt is given what is left of the timeout counted from the first one
    assert 4.5 < ask.remaining[0] <= 5.0
    assert ask.remaining == sorted(ask.remaining, reverse=True)
    assert ask.remaining[-1] <= ask.remaining[0] - 3 * 0.01


def test_an_error_that_does_not_pass_is_raised_when_its_time_is_up() -> None:
    error = KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    ask = FailingAsk(error, failures=None)
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        # the error class's own time (0.3 s), shorter than the operation's timeout
        ask_again(ask, timeout_s=5.0, retried_for=lambda exc: 0.3, pause_s=0.02)
    took = time.monotonic() - started
    assert raised.value is error
    assert 0.3 <= took < 1.5
    assert len(ask.remaining) > 3
    assert ask.remaining[-1] < 5.0 - 0.3 + 0.05


def test_an_error_not_retried_is_raised_at_once_without_a_refresh() -> None:
    error = KafkaException(KafkaError(KafkaError.INVALID_CONFIG))
    ask = FailingAsk(error, failures=1)
    refreshes: list[None] = []
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        ask_again(
            ask,
            timeout_s=5.0,
            retried_for=coordinator_moving,
            pause_s=1.0,
            refresh=lambda: refreshes.append(None),
        )
    assert raised.value is error
    assert len(ask.remaining) == 1 and refreshes == []
    assert time.monotonic() - started < 0.5  # no pause either


def test_each_error_class_is_asked_again_for_its_own_time() -> None:
    """A topic just created is excused for less time than a leader moving."""
    errors = [KeyError("new"), ValueError("moving"), KeyError("new")]
    asked = 0

    def ask(remaining_s: float) -> str:
        nonlocal asked
        asked += 1
        if asked > len(errors):
            return "answer"
        error = errors[asked - 1]
        if isinstance(error, ValueError):
            time.sleep(0.6)  # a slow failure, within its own 5 s
        raise error

    def retried_for(exc: Exception) -> float | None:
        return 0.3 if isinstance(exc, KeyError) else 5.0

    with pytest.raises(KeyError):  # "new" again, but now 0.6 s after the first attempt
        ask_again(ask, timeout_s=5.0, retried_for=retried_for, pause_s=0.0)
    assert asked == 3
