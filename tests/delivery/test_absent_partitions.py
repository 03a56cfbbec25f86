"""Long-polls waiting for topics not made yet share their looks: a worker asks its store
about a missing topic once per interval, however many long-polls wait for it (before, each
long-poll read each of its positions again every half second: 50 long-polls of 1,000
missing topics were 100,000 reads a second)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ingest_api.waiting_reads import AbsentPartitions
from log_store import TopicConfig, open_store


class _CountedLooks:
    """A real store whose ``end_offset`` calls are counted."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.looks: list[tuple[str, int]] = []

    def end_offset(self, topic: str, partition: int) -> int:
        self.looks.append((topic, partition))
        end: int = self.store.end_offset(topic, partition)
        return end


def test_missing_topics_are_looked_at_once_per_interval_for_every_long_poll(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    counted = _CountedLooks(store)
    absent = AbsentPartitions(counted, interval_s=0.5)  # type: ignore[arg-type]
    missing = [(f"dc1.later{n}", p) for n in range(200) for p in range(3)]
    waited = [*missing, ("dc1.app", 5)]  # a partition the topic does not have

    async def long_polls() -> list[set[tuple[str, int]]]:
        return await asyncio.gather(*(absent.still_absent(waited) for _ in range(50)))

    async def scenario() -> None:
        answers = await long_polls()
        assert all(answer == set(waited) for answer in answers)
        # one look per missing topic (not per partition, nor per long-poll) and one for the
        # partition of a topic that is there
        firsts = [(f"dc1.later{n}", 0) for n in range(200)]
        assert sorted(counted.looks) == sorted([*firsts, ("dc1.app", 5)])

        # within the interval the answers are reused; after it, asked again (once)
        assert await absent.still_absent(waited) == set(waited)
        assert len(counted.looks) == 201
        store.create_topic("dc1.later7", TopicConfig(partitions=3))
        await asyncio.sleep(0.6)
        made = {("dc1.later7", p) for p in range(3)}
        assert all(answer == set(waited) - made for answer in await long_polls())
        assert len(counted.looks) == 2 * 201 + 2  # the made topic's three partitions each

    try:
        asyncio.run(scenario())
    finally:
        store.close()
