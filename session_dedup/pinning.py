"""Source-to-partition pinning: chosen once by a stable hash, then remembered per topic identity.

The pin is stored with ``put_topic_state_if_absent`` under a key that holds the topic's
``topic_id``: the first writer's choice wins in every process, adding partitions never moves a
pinned source (the hash is only consulted for a source never seen), and a topic deleted and
created again (a new ``topic_id``) pins its sources afresh.

Idle source expiry deletes pins and counts the deletions under :func:`pin_deletions_key` in
the same catalog transaction, which tells a router whether a pin it saw may have gone since
(``SourceRouter.confirm_pins``).
"""

from __future__ import annotations

import hashlib

_PIN_BYTES = 4


def stable_partition(source_id: str, partitions: int) -> int:
    """The partition a new source is pinned to: the same in every process and every release."""
    if partitions == 1:
        return 0
    digest = hashlib.blake2b(source_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def pin_key(topic_id: str, source_id: str) -> str:
    """The topic-state key of a source's pin, bound to the topic's identity."""
    return f"pin/{topic_id}/{source_id}"


def pin_deletions_key(topic_id: str) -> str:
    """The topic-state key of how many pins of the topic were deleted (8 bytes; absent: 0)."""
    return f"pin-deletions/{topic_id}"


def decode_count(value: bytes | None) -> int:
    return 0 if value is None else int.from_bytes(value, "big")


def encode_pin(partition: int) -> bytes:
    return partition.to_bytes(_PIN_BYTES, "big")


def decode_pin(value: bytes) -> int:
    if len(value) != _PIN_BYTES:
        raise ValueError(f"a pin is {_PIN_BYTES} bytes, got {len(value)}")
    return int.from_bytes(value, "big")
