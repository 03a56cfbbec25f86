"""The delivery library on a real embedded store, without HTTP: envelopes, filters, framing,
group assignment with a controlled clock."""

from __future__ import annotations

import asyncio
import os
import stat
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delivery.append_watch import AppendWatch
from delivery.consumer_group import (
    GroupCoordinator,
    NotPartitionOwner,
    Subscription,
    UnknownMember,
)
from delivery.envelope_view import NotAnEnvelope, kind_of, view
from delivery.filters import BadFilter, MessageFilter, filter_from_json, parse_filter
from delivery.framing import BadFraming, decode_binary, encode_binary
from delivery.internal_state import INTERNAL_TOPIC, InternalState
from delivery.legacy_txn import LegacyStaging
from delivery.partition_reader import PartitionBatch, PartitionReader
from delivery.push import PushDelivery
from log_store import TopicConfig, open_store
from session_dedup.envelope import KINDS, Envelope, decode, encode

texts = st.text(max_size=40)
envelopes = st.builds(
    Envelope,
    source_id=texts,
    server=texts,
    file=texts,
    log_type=texts,
    codec=st.sampled_from(["raw", "gzip", "zstd"]),
    seqno=st.integers(0, 2**63 - 1),
    create_time=st.integers(-(2**63), 2**63 - 1),
    write_time=st.integers(-(2**63), 2**63 - 1),
    data=st.binary(max_size=300),
    kind=st.sampled_from(KINDS),
    txn_id=st.none() | texts,
)


@given(envelopes)
def test_envelope_view_reads_every_field_as_the_avro_decoder_does(env: Envelope) -> None:
    value = encode(env)
    assert view(value).to_envelope() == decode(value) == env
    assert kind_of(value) == env.kind


@given(st.binary(max_size=60))
def test_envelope_view_refuses_what_is_not_an_envelope(junk: bytes) -> None:
    try:
        decoded = decode(junk)
    except Exception:
        with pytest.raises(NotAnEnvelope):
            view(junk)
    else:
        assert view(junk).to_envelope() == decoded


def test_filter_round_trips_through_query_parameters() -> None:
    filt = parse_filter(
        {
            "server": ["a", "b"],
            "file": ["/x*"],
            "hash_mod": ["4"],
            "hash_rem": ["3"],
            "hash_key": ["server"],
        }
    )
    assert parse_filter(filt.to_params()) == filt
    assert (
        filter_from_json(
            {
                "server": ["a", "b"],
                "file": "/x*",
                "hash_mod": 4,
                "hash_rem": 3,
                "hash_key": "server",
            }
        )
        == filt
    )
    assert parse_filter({}) == MessageFilter()
    for bad in (
        {"hash_mod": ["4"]},
        {"hash_rem": ["1"]},
        {"server": [""]},
        {"hash_mod": ["4"], "hash_rem": ["-1"]},
    ):
        with pytest.raises(BadFilter):
            parse_filter(bad)


def test_binary_framing_round_trips_and_refuses_truncation(tmp_path: Path) -> None:
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app")
    values = [encode(Envelope("s", "h", "f", "app", "raw", i, 0, 0, b"x" * i)) for i in range(9)]
    store.append("dc1.app", 1, values)
    batch = PartitionReader(store).read("dc1.app", 1, 0)
    body = encode_binary([batch, PartitionBatch("dc1.app", 2, 0, 0, 0)])
    sections = decode_binary(body)
    assert [r for r in sections[0].records] == list(enumerate(values))
    assert sections[1].meta["partition"] == 2 and sections[1].records == []
    with pytest.raises(BadFraming):
        decode_binary(body[:-3])
    with pytest.raises(BadFraming):
        decode_binary(b"XXXX")
    store.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def groups(tmp_path: Path) -> Any:
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=6))
    clock = Clock()
    coordinator = GroupCoordinator(store, InternalState(store), clock)
    yield coordinator, clock
    store.close()


def _owned(state: Any) -> set[int]:
    return {a.partition for a in state.assignment}


def test_partitions_spread_over_members_and_a_dead_members_move_after_its_timeout(
    groups: Any,
) -> None:
    coordinator, clock = groups
    sub = Subscription(("dc1.app",))
    members = [coordinator.join("g", sub, session_timeout_ms=1000) for _ in range(3)]
    # the first member owns everything until it releases what the others should have
    first = coordinator.heartbeat("g", members[0].member_id)
    assert len(first.revoke) == 4
    coordinator.heartbeat("g", members[0].member_id, release=first.revoke)
    states = [coordinator.heartbeat("g", m.member_id) for m in members]
    assert [len(_owned(s)) for s in states] == [2, 2, 2]
    assert set().union(*map(_owned, states)) == set(range(6))
    # member 2 goes silent; before its timeout nothing moves
    clock.now += 0.9
    for m in members[:2]:
        coordinator.heartbeat("g", m.member_id)
    assert len(_owned(coordinator.heartbeat("g", members[0].member_id))) == 2
    clock.now += 0.5
    survivors = [coordinator.heartbeat("g", m.member_id) for m in members[:2]]
    assert sorted(len(_owned(s)) for s in survivors) == [3, 3]
    assert set().union(*map(_owned, survivors)) == set(range(6))
    with pytest.raises(UnknownMember):
        coordinator.commit("g", members[2].member_id, [("dc1.app", 0, 0)])


def test_a_member_whose_heartbeats_failed_while_the_store_was_away_keeps_its_partitions(
    tmp_path: Path,
) -> None:
    """Heartbeats that the store could not record (Kafka away for longer than the session
    timeout) do not count as missed: the member keeps its partitions and its commit is
    taken.  A member that really went silent is still expired after its timeout."""
    from log_store.errors import StoreUnavailable

    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    clock = Clock()
    state = InternalState(store)
    coordinator = GroupCoordinator(store, state, clock)
    sub = Subscription(("dc1.app",))
    reader = coordinator.join("g", sub, session_timeout_ms=1000, reset="earliest")
    silent = coordinator.join("h", sub, session_timeout_ms=1000, reset="earliest")
    assert _owned(coordinator.heartbeat("g", reader.member_id)) == {0, 1}

    real_update = state.update

    def away(*_args: Any, **_kwargs: Any) -> Any:
        raise StoreUnavailable("Kafka unavailable")

    state.update = away  # type: ignore[method-assign]
    for _ in range(8):  # 4 s of heartbeats every 0.5 s, each refused
        clock.now += 0.5
        with pytest.raises(StoreUnavailable):
            coordinator.heartbeat("g", reader.member_id)
    state.update = real_update  # type: ignore[method-assign]
    clock.now += 0.3
    back = coordinator.heartbeat("g", reader.member_id)
    assert _owned(back) == {0, 1}
    coordinator.commit("g", reader.member_id, [("dc1.app", 0, 0)])
    # the other group's member sent nothing, not even a failed heartbeat: the outage does
    # not save it once its own timeout has passed outside the outage
    clock.now += 1.5
    with pytest.raises(UnknownMember):
        coordinator.heartbeat("h", silent.member_id)
    store.close()


def test_commits_are_fenced_to_the_owner_and_kept_for_the_next_owner(groups: Any) -> None:
    coordinator, _ = groups
    sub = Subscription(("dc1.app",))
    a = coordinator.join("g", sub, session_timeout_ms=1000, reset="earliest")
    b = coordinator.join("g", sub, session_timeout_ms=1000)
    with pytest.raises(NotPartitionOwner):
        coordinator.commit("g", b.member_id, [("dc1.app", 0, 0)])
    coordinator.commit("g", a.member_id, [("dc1.app", 0, 0)])
    coordinator.leave("g", a.member_id)
    taken = coordinator.heartbeat("g", b.member_id)
    assert _owned(taken) == set(range(6))
    assert {x.partition: x.offset for x in taken.assignment}[0] == 0


def test_legacy_store_fsyncs_the_staging_directory_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode)))
        real_fsync(fd)

    staging = LegacyStaging(tmp_path / "staging")
    monkeypatch.setattr(os, "fsync", recording_fsync)
    store_id = staging.put(log_type="app", server="h", file="f", data=b"payload")
    # the file's data first, then the directory holding its new name
    assert synced[-1] == (str(tmp_path / "staging"), True)
    assert any(path.endswith(".tmp") and not is_dir for path, is_dir in synced)
    assert staging.get(store_id).data == b"payload"


def test_internal_state_finds_a_key_in_every_process_after_its_topic_grew(
    start_gateway: Any, tmp_path: Path
) -> None:
    # A group whose key hashes differently over 4 and over 8 partitions.
    group = next(
        g for g in (f"g{i}" for i in range(100)) if zlib.crc32(f"group/{g}".encode()) % 8 >= 4
    )
    first = start_gateway(tmp_path / "data")
    item = {"topic": "dc1.app", "partition": 0, "offset": 0}
    with open_store(tmp_path / "data") as store:
        store.create_topic("dc1.app", TopicConfig(partitions=1))
    committed = httpx.post(f"{first.url}/v1/groups/{group}/offsets", json={"offsets": [item]})
    assert committed.status_code == 200, committed.text
    with open_store(tmp_path / "data") as store:
        store.set_partitions(INTERNAL_TOPIC, 8)
    # A gateway started after the growth, next to the one started before it.
    second = start_gateway(tmp_path / "data")
    for gw in (first, second):
        described = httpx.get(f"{gw.url}/v1/groups/{group}")
        assert described.status_code == 200, described.text
        assert [p["committed"] for p in described.json()["partitions"]] == [0]


def test_a_group_made_by_a_commit_follows_the_joins_reset_for_its_other_partitions(
    tmp_path: Path,
) -> None:
    """A group whose first act was a commit (no member yet) resumes the committed partition
    there; a first join asking for ``latest`` starts the others at their end, not at 0."""
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.app", TopicConfig(partitions=2))
    for partition in (0, 1):
        store.append("dc1.app", partition, [b"old"] * 5)
    coordinator = GroupCoordinator(store, InternalState(store), Clock())
    coordinator.commit("g", None, [("dc1.app", 0, 2)])
    member = coordinator.join("g", Subscription(("dc1.app",)), session_timeout_ms=1000)
    assert {a.partition: a.offset for a in member.assignment} == {0: 2, 1: 5}
    # a group of an earlier version, which did not say "placed", keeps reading from the start
    # of partitions it finds after its first placement
    coordinator.commit("h", None, [("dc1.app", 0, 2)])
    coordinator._state.update(
        "group/h", lambda doc: ({k: v for k, v in doc.items() if k != "placed"}, None)
    )
    old = coordinator.join("h", Subscription(("dc1.app",)), session_timeout_ms=1000)
    assert {a.partition: a.offset for a in old.assignment} == {0: 2, 1: 0}
    store.close()


def _stops_in_time(
    tmp_path: Path,
    *,
    prepare: Callable[[PushDelivery], None] = lambda _push: None,
    before_stop: Callable[[PushDelivery], None] = lambda _push: None,
) -> None:
    """Push delivery on a store at ``tmp_path``: ``prepare`` it, start it, let its supervisor
    run 50 ms, call ``before_stop`` and stop it; the stop must end within 5 s."""
    store = open_store(tmp_path)
    push = PushDelivery(store, InternalState(store), AppendWatch(store), PartitionReader(store))
    prepare(push)

    async def scenario() -> None:
        await push.start()
        await asyncio.sleep(0.05)
        before_stop(push)
        started = time.monotonic()
        await asyncio.wait_for(push.stop(), 10)
        assert time.monotonic() - started < 5, "the stop waited for a supervisor that went on"

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_push_delivery_stops_when_a_poke_lands_in_the_same_loop_turn_as_the_stop(
    tmp_path: Path,
) -> None:
    """A subscription created or deleted as the gateway stops pokes the supervisor (waiting
    for a wake by then) in the same turn of the loop as the stop's cancel.  Python 3.11's
    ``asyncio.wait_for``, seeing its wake-up done when the cancel arrived, returned it and
    dropped the cancel: the supervisor went on for ever and so did the gateway's shutdown."""
    _stops_in_time(tmp_path, before_stop=PushDelivery.poke)


def test_push_delivery_stops_even_if_a_cancel_is_swallowed_on_its_way(tmp_path: Path) -> None:
    """Whatever swallows the stop's cancel (here a reconcile that catches it, as a delivery's
    own stop did when the cancel came while it waited), the supervisor ends."""
    swallowed: list[int] = []

    async def reconcile_swallowing_a_cancel() -> None:
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            swallowed.append(1)

    def swallowing(push: PushDelivery) -> None:
        push._reconcile = reconcile_swallowing_a_cancel  # type: ignore[method-assign]

    _stops_in_time(tmp_path, prepare=swallowing)  # in that reconcile when stopped
    assert swallowed, "the cancel did reach the reconcile"
