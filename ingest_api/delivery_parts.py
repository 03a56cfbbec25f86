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
from ingest_api.auth import Authorizer
from ingest_api.context import GatewayContext

_KEY = "ingest_api.delivery_parts"


@dataclass
class DeliveryParts:
    state: InternalState
    reader: PartitionReader
    watch: AppendWatch
    groups: GroupCoordinator
    push: PushDelivery


class TokenGrants:
    """A subscription owner's read grant, as the gateway's configured tokens say now.

    With no tokens every subscription delivers.  With tokens, a subscription made while auth
    was off belongs to no token whose grant could be checked, so it delivers nothing until
    auth is off again (or an admin deletes it and a client makes it again with a token).
    """

    def __init__(self, auth: Authorizer) -> None:
        self._auth = auth

    def refusal(self, owner: str | None, topic: str) -> str | None:
        auth = self._auth
        if not auth.enabled:
            return None
        if owner is None:
            return "made while auth was off, it belongs to no token; an admin deletes it"
        grant = auth.grant_of(owner)
        if grant is None:
            return f"no configured token is named {owner!r} any more"
        if not auth.may_read(grant, topic):
            return f"the tokens named {owner!r} may not read topic {topic!r} any more"
        return None


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
            grants=TokenGrants(ctx.auth),
        )
        groups = GroupCoordinator(
            store, state, max_per_owner=ctx.settings.limits.max_groups_per_token
        )
        parts = DeliveryParts(state, reader, watch, groups, push)
        ctx.extensions[_KEY] = parts
    assert isinstance(parts, DeliveryParts)
    return parts
