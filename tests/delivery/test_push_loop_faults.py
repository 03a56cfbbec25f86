"""A push delivery loop says a retried store fault in one line, and traces only the unexpected.

Kafka away, or a partition's owner gateway killed, make a delivery loop fail for a few
seconds (``StoreUnavailable``, ``PartitionUnavailable``); it tries again, as documented.  Each
such failure used to be logged with a 40-60-line traceback.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import delivery.push as push_module
from delivery.append_watch import AppendWatch
from delivery.internal_state import InternalState
from delivery.partition_reader import PartitionReader
from delivery.push import PushDelivery, PushSubscription, _Delivery
from log_store import open_store
from log_store.errors import PartitionUnavailable, StoreUnavailable


def test_retried_store_faults_are_one_line_each_and_unexpected_errors_keep_their_trace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(push_module, "_LOOP_RETRY_S", 0.01, raising=False)
    store = open_store(tmp_path / "data")
    push = PushDelivery(store, InternalState(store), AppendWatch(store), PartitionReader(store))
    sub = PushSubscription("chaos", "http://127.0.0.1:9/", prefix="dc1.")
    delivery = _Delivery(push, sub)
    faults: list[Exception] = [
        StoreUnavailable("Kafka unavailable (describing dc1.app): _TRANSPORT"),
        PartitionUnavailable(
            "the owner of logbroker-internal.delivery/3 cannot be reached", "x", 3
        ),
        RuntimeError("a bug"),
    ]

    async def refresh() -> None:
        if not faults:
            delivery.stopping = True
            raise StoreUnavailable("the last one")
        raise faults.pop(0)

    delivery._refresh_positions = refresh  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="delivery.push"):
            asyncio.run(delivery.run())
    finally:
        store.close()
    lines = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines == [
        (
            "WARNING",
            "push chaos: Kafka unavailable (describing dc1.app): _TRANSPORT; retrying",
            False,
        ),
        (
            "WARNING",
            "push chaos: the owner of logbroker-internal.delivery/3 cannot be reached; retrying",
            False,
        ),
        ("ERROR", "push chaos: delivery loop failed; retrying", True),
        ("WARNING", "push chaos: the last one; retrying", False),
    ]
