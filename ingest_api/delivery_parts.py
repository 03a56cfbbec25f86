"""The delivery objects the read, group and subscription endpoints share in one worker.

One :class:`DeliveryParts` per gateway context (per worker process): the internal state
(groups, offsets, subscriptions), the partition reader, the append watch that wakes
long-polls, the group coordinator and push delivery.  Nothing here keeps per-consumer state:
positions travel with the requests and group state lives in the store, so any worker or
gateway can serve any request.
"""

from __future__ import annotations

from dataclasses import dataclass

from delivery.append_watch import AppendWatch
from delivery.consumer_group import GroupCoordinator
from delivery.internal_state import InternalState
from delivery.partition_reader import PartitionReader
from delivery.push import PushDelivery
from delivery.push_targets import PushTargetPolicy
from ingest_api.context import GatewayContext

_KEY = "ingest_api.delivery_parts"


@dataclass
class DeliveryParts:
    state: InternalState
    reader: PartitionReader
    watch: AppendWatch
    groups: GroupCoordinator
    push: PushDelivery


def delivery_parts(ctx: GatewayContext) -> DeliveryParts:
    """The context's delivery parts, made on first use."""
    parts = ctx.extensions.get(_KEY)
    if parts is None:
        store = ctx.store
        state = InternalState(store)
        reader = PartitionReader(store)
        watch = AppendWatch(store)
        push = PushDelivery(
            store,
            state,
            watch,
            reader,
            targets=PushTargetPolicy.from_config(ctx.settings.push_allow),
            max_per_owner=ctx.settings.limits.max_subscriptions_per_token,
        )
        groups = GroupCoordinator(
            store, state, max_per_owner=ctx.settings.limits.max_groups_per_token
        )
        parts = DeliveryParts(state, reader, watch, groups, push)
        ctx.extensions[_KEY] = parts
    assert isinstance(parts, DeliveryParts)
    return parts
