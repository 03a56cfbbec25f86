"""The gateway's topic quota on the embedded store: what a creation at the limit does."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store
from log_store.errors import LimitReached
from log_store.interface import TopicConfig
from log_store.topic_quota import TopicLimits, TopicQuota


def test_a_writer_that_lost_the_creation_race_at_the_limit_gets_the_topic(
    tmp_path: Path,
) -> None:
    """Two writers of a new log type, one below ``max_topics``: both found no topic, and the
    other writer's creation is what reached the limit.  The topic is there, so the slower
    writer gets it instead of a 429; a topic that does not exist is still refused."""
    store = open_store(tmp_path)
    try:
        store.create_topic("dc1.a", TopicConfig(partitions=1))
        quota = TopicQuota(store, TopicLimits(max_topics=2), count_ttl_s=0.0)
        store.create_topic("dc1.new", TopicConfig(partitions=2))  # the faster writer's

        info = quota.create("dc1.new", 2)

        assert info.name == "dc1.new"
        assert len(info.partitions) == 2
        with pytest.raises(LimitReached, match="its limit"):
            quota.create("dc1.other", 1)
        assert sorted(t.name for t in store.list_topics()) == ["dc1.a", "dc1.new"]
    finally:
        store.close()
