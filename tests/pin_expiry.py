"""A scenario both backends' expiry tests run: pins deleted under a router that saw them."""

from __future__ import annotations

from log_store import LogStore
from session_dedup.exactly_once import ChunkBatch, ExactlyOnceWriter
from session_dedup.pinning import decode_count, encode_pin, pin_deletions_key, pin_key
from session_dedup.source import SourceMeta
from session_dedup.source_expiry import SourceExpiry


def check_deleted_pins_are_put_back_by_the_first_write(store: LogStore) -> None:
    """Expiry deletes the pins of 20 sessions that never wrote and counts the deletions.  The
    writer that saw those pins routes the first write by the pin it saw and puts that pin back,
    even on a topic grown since (a new pin would move it).  Having learnt of the deletions, it
    drops the other pins it saw (another process may have pinned those sources elsewhere
    meanwhile): they are pinned anew where their first write goes.  Either way every source
    ends up pinned where its state is."""
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
    where: dict[str, bytes] = {}
    for meta_, key in zip(metas, keys, strict=True):
        outcome = writer.write(meta_, ChunkBatch([1], [0], [b"x\n"]))
        assert outcome.new_source
        where[key] = encode_pin(outcome.route.partition)
    assert where[keys[0]] == encode_pin(sessions[0].partition), "the pin seen was not used"
    assert store.get_topic_state_many("dc1.exp", keys) == where
