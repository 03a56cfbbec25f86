"""One creator's share of the topics, counted from the store: every process over one store
(the workers of a gateway, the gateways over one Kafka cluster) counts the same topics."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store import open_store
from log_store.errors import LimitReached
from log_store.interface import TopicConfig
from log_store.topic_quota import CREATOR_KEY, TopicLimits, TopicQuota

LIMITS = TopicLimits(max_topics=100, max_topics_per_creator=2)


def test_another_process_counts_the_topics_a_creator_made_elsewhere(tmp_path: Path) -> None:
    here, there = open_store(tmp_path), open_store(tmp_path)
    try:
        TopicQuota(here, LIMITS).create_all(["dc1.a", "dc1.b"], 1, "tenant")
        elsewhere = TopicQuota(there, LIMITS)
        assert elsewhere.created_by("tenant") == 2
        with pytest.raises(LimitReached, match="has created 2 of the store's topics") as refused:
            elsewhere.create("dc1.c", 1, "tenant")
        assert (refused.value.limit, refused.value.maximum) == ("max_topics_per_token", 2)
        elsewhere.create("dc1.c", 1, "another")  # the others' share is untouched
        elsewhere.create("dc1.d", 1)  # and a creation of nobody's counts against max_topics only
        assert elsewhere.created_counts() == {"tenant": 2, "another": 1}
        assert {t.name for t in here.list_topics()} == {"dc1.a", "dc1.b", "dc1.c", "dc1.d"}
    finally:
        here.close()
        there.close()


def test_a_young_topic_whose_creator_comes_later_is_counted_once_it_is_recorded(
    tmp_path: Path,
) -> None:
    """Another process records a topic's creator right after creating it: a count in between
    sees the topic without one, and looks again at the next count."""
    store = open_store(tmp_path)
    try:
        quota = TopicQuota(store, LIMITS, count_ttl_s=0.0)
        store.create_topic("dc1.a", TopicConfig(partitions=1))
        assert quota.created_by("tenant") == 0
        store.put_topic_state_if_absent("dc1.a", CREATOR_KEY, b"tenant")
        assert quota.created_by("tenant") == 1
    finally:
        store.close()
