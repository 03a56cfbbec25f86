"""A scenario both backends' expiry tests run: pins deleted under a router that saw them."""

from __future__ import annotations

from log_store import LogStore
from session_dedup.exactly_once import ChunkBatch, ExactlyOnceWriter
from session_dedup.pinning import decode_count, pin_deletions_key, pin_key
from session_dedup.source import SourceMeta
from session_dedup.source_expiry import SourceExpiry


def check_deleted_pins_are_put_back_by_the_first_write(store: LogStore) -> None:
    """Expiry deletes the pins of 20 sessions that never wrote and counts the deletions; the
    writer that saw those pins puts them back when its first writes give the sources state,
    even on a topic grown since (a new pin would move them)."""
    writer = ExactlyOnceWriter(store, dc="dc1", partitions=2)
    metas = [SourceMeta("exp", f"s{i}") for i in range(20)]
    sessions = writer.open_sessions(metas)  # pins them, gives them no state
    topic_id = store.describe_topic("dc1.exp").topic_id
    keys = [pin_key(topic_id, m.source_id) for m in metas]
    pinned = store.get_topic_state_many("dc1.exp", keys)
    assert None not in pinned.values()
    assert store.get_topic_state("dc1.exp", pin_deletions_key(topic_id)) is None
    done = SourceExpiry(store, idle_s=3600).run_once()
    assert done.pins_deleted == 20
    assert set(store.get_topic_state_many("dc1.exp", keys).values()) == {None}
    deletions = store.get_topic_state("dc1.exp", pin_deletions_key(topic_id))
    assert decode_count(deletions) == 20
    store.set_partitions("dc1.exp", 8)  # a new pin would now name another partition
    for meta_, session in zip(metas, sessions, strict=True):
        outcome = writer.write(meta_, ChunkBatch([1], [0], [b"x\n"]))
        assert outcome.new_source and outcome.route.partition == session.partition
    assert store.get_topic_state_many("dc1.exp", keys) == pinned
