"""Idle sources expire on Kafka as on the embedded store: decided by the partition's owner in
its Kafka transaction, written to the changelog (a new owner rebuilds the table without
them), the source count freed, and a stale owner expires nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, encode_binary
from log_store import LogStore, PartitionState, TopicConfig
from log_store.kafka import KafkaSettings, open_kafka_store
from log_store.kafka.owner_directory import OwnerDirectory
from session_dedup.pinning import (
    decode_count,
    encode_pin,
    pin_deletions_key,
    pin_key,
    stable_partition,
)
from session_dedup.seqno_table import (
    SOURCE_COUNT_KEY,
    decode_seqno,
    encode_seqno,
    encode_source_value,
    seqno_key,
)
from session_dedup.source_expiry import SourceExpiry
from tests.conftest import GatewayProcess
from tests.gateway.conftest import meta
from tests.kafka.conftest import metric, source_seqnos, wait_until
from tests.pin_expiry import check_deleted_pins_are_put_back_by_the_first_write

pytestmark = pytest.mark.kafka

LIMITS = """[limits]
max_sources_per_partition = {limit}
source_idle_expiry_s = {expiry}
"""
LIVE = ("live-a", "live-b", "live-c")


def _write(http: httpx.Client, sections: Sequence[tuple[str, list[int], int | None]]) -> Any:
    """One request with a section per (source, seqnos, prev_seqno); the results."""
    heads = []
    for source, seqnos, prev in sections:
        head: dict[str, Any] = meta(source, "exp")
        if prev is not None:
            head["prev_seqno"] = prev
        heads.append((head, [(s, 0, b"line %d\n" % s) for s in seqnos]))
    response = http.post(
        "/v1/write", content=encode_binary(heads), headers={"content-type": BINARY_MEDIA_TYPE}
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _last_seqno(http: httpx.Client, source: str) -> int:
    response = http.post("/v1/sessions", json=meta(source, "exp"))
    assert response.status_code == 200, response.text
    return int(response.json()["last_seqno"])


def _last_seqnos(http: httpx.Client, sources: list[str]) -> dict[str, int]:
    sessions = [meta(source, "exp") for source in sources]
    response = http.post("/v1/sessions", json={"sessions": sessions})
    assert response.status_code == 200, response.text
    return {s["source_id"]: int(s["last_seqno"]) for s in response.json()["sessions"]}


def test_an_idle_source_expires_and_a_new_owner_rebuilds_the_table_without_it(
    start_kafka_gateway: Callable[..., GatewayProcess], kafka_store: LogStore
) -> None:
    gateway = start_kafka_gateway(
        top="partitions = 1\n",
        tables=LIMITS.format(expiry=5, limit=4),
        kafka={"snapshot_min_entries": 4},  # snapshots, and deltas after them, both replayed
    )
    http = httpx.Client(base_url=gateway.url, timeout=60)
    try:
        first = _write(http, [("idle", [1, 2, 3], None)] + [(s, [1], None) for s in LIVE])
        assert all(a["status"] == "written" for r in first for a in r["acks"]), first
        # the partition holds four sources, its limit
        assert _write(http, [("new", [1], None)])[0]["error"] == "limit_reached"
        # the live sources write on, each chunk after the one before (prev_seqno): had one's
        # state been forgotten in between, its chunk would come back out_of_order
        live = 1
        deadline = time.monotonic() + 60
        while _last_seqno(http, "idle") != 0:
            assert time.monotonic() < deadline, gateway.log()
            results = _write(http, [(s, [live + 1], live) for s in LIVE])
            assert all(r["acks"][0]["status"] == "written" for r in results), results
            live += 1
        assert _write(http, [("new", [1], None)])[0]["acks"][0]["status"] == "written"
        assert {s: _last_seqno(http, s) for s in LIVE} == dict.fromkeys(LIVE, live)
        # the forgotten source is a new one: its next chunk after 3 is out of order...
        resumed = _write(http, [("idle", [4], 3)])[0]
        assert resumed["acks"][0]["status"] == "out_of_order"
        assert resumed["last_seqno"] == 0
        # ...and the partition is full again (three live, new), so it is not even admitted
        assert _write(http, [("idle", [4], None)])[0]["error"] == "limit_reached"
        assert metric(gateway.url, "logbroker_sources_expired_total") == 1
    finally:
        http.close()
        gateway.kill()  # SIGKILL, mid-life: the next owner has only Kafka to go by

    successor = start_kafka_gateway(
        top="partitions = 1\n", tables=LIMITS.format(expiry=86400, limit=4)
    )
    http = httpx.Client(base_url=successor.url, timeout=60)
    try:
        # given the partition first, then its takeover done (fencing, the table rebuilt)
        wait_until(
            lambda: (
                (metric(successor.url, "logbroker_kafka_owned_partitions") or 0) > 0
                and (metric(successor.url, "logbroker_kafka_takeovers") or 0) > 0
            ),
            60,
            "the second gateway to take the partition over",
        )
        assert _last_seqno(http, "idle") == 0
        assert {s: _last_seqno(http, s) for s in [*LIVE, "new"]} == {
            **dict.fromkeys(LIVE, live),
            "new": 1,
        }
        assert _write(http, [("other", [1], None)])[0]["error"] == "limit_reached"
    finally:
        http.close()
        successor.kill()
    # the table as the changelog rebuilds it holds no key of the expired source at all
    assert kafka_store.get_state("dc1.exp", 0, seqno_key("idle")) is None
    assert decode_seqno(kafka_store.get_state("dc1.exp", 0, SOURCE_COUNT_KEY)) == 4
    topic_id = kafka_store.describe_topic("dc1.exp").topic_id
    assert decode_count(kafka_store.get_topic_state("dc1.exp", pin_deletions_key(topic_id))) >= 1
    found = source_seqnos(kafka_store, "dc1.exp")
    assert found["idle"] == ({0}, [1, 2, 3])
    assert {s: found[s][1] for s in LIVE} == {s: list(range(1, live + 1)) for s in LIVE}


def _one_per_partition(prefix: str, partitions: int) -> list[str]:
    """Source ids, one pinned to each partition (new sources are pinned by stable_partition)."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        found.setdefault(stable_partition(f"{prefix}-{i}", partitions), f"{prefix}-{i}")
        i += 1
    return [found[p] for p in range(partitions)]


def test_two_gateways_each_expire_the_sources_of_the_partitions_they_own(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
) -> None:
    """Each gateway expires its own partitions; the pins of its sources may live in the
    other's partitions (deleted there, through it), as may the pin deletion count."""
    # 8 partitions and the group's 4 internal ones: each gateway is given 6, so each owns at
    # least 2 partitions of the topic
    kafka_store.create_topic("dc1.exp", TopicConfig(partitions=8))
    # idle 10 s: a round of writes to the live sources, through both gateways, took more than
    # 5 s at a load average of 40, and a live source expired with the idle ones
    gateways = [start_kafka_gateway(tables=LIMITS.format(expiry=10, limit=100)) for _ in range(2)]
    https = [httpx.Client(base_url=g.url, timeout=60) for g in gateways]
    directory = OwnerDirectory(
        KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace), self_url=""
    )
    directory.start()
    idle = _one_per_partition("idle", 8)
    live_sources = _one_per_partition("live", 8)
    try:

        def topic_owners() -> set[str]:
            return {u for (t, _p), u in directory.snapshot().items() if t == "dc1.exp"}

        wait_until(
            lambda: len(directory.snapshot()) == 12 and len(topic_owners()) == 2,
            60,
            "both gateways to own partitions of the topic",
        )
        owners = directory.snapshot()
        first = _write(https[0], [(s, [1], None) for s in [*idle, *live_sources]])
        assert all(a["status"] == "written" for r in first for a in r["acks"]), first

        def expired() -> float:
            return sum(metric(g.url, "logbroker_sources_expired_total") or 0 for g in gateways)

        live = 1
        deadline = time.monotonic() + 90
        while expired() < len(idle):
            assert time.monotonic() < deadline, [g.log() for g in gateways]
            results = _write(https[live % 2], [(s, [live + 1], live) for s in live_sources])
            assert all(r["acks"][0]["status"] == "written" for r in results), results
            live += 1
        assert expired() == len(idle)
        # at once, in one request per gateway: the live sources expire too once idle 10 s,
        # which the checks below took on a loaded machine (the idle ones are asked last: a
        # session pins its source again)
        for http in https:
            assert _last_seqnos(http, live_sources) == dict.fromkeys(live_sources, live)
        # each gateway forgot those of the partitions it owns (unless a gateway missed the
        # group's 3 s session timeout on this loaded machine and the partitions moved)
        if directory.snapshot() == owners:
            assert all(
                (metric(g.url, "logbroker_sources_expired_total") or 0) > 0 for g in gateways
            )
        topic_id = kafka_store.describe_topic("dc1.exp").topic_id
        pins = kafka_store.get_topic_state_many("dc1.exp", [pin_key(topic_id, s) for s in idle])
        assert set(pins.values()) == {None}
        # (a sweep may also have deleted pins made for the first write before it gave their
        # sources state; that write put them back, see SourceRouter.confirm_pins)
        deletions = kafka_store.get_topic_state("dc1.exp", pin_deletions_key(topic_id))
        assert decode_count(deletions) >= len(idle)
        live_pins = [pin_key(topic_id, s) for s in live_sources]
        assert kafka_store.get_topic_state_many("dc1.exp", live_pins) == {
            key: encode_pin(p) for p, key in enumerate(live_pins)
        }
        for http in https:
            assert _last_seqnos(http, idle) == dict.fromkeys(idle, 0)
    finally:
        directory.stop()
        for http in https:
            http.close()
    found = source_seqnos(kafka_store, "dc1.exp")
    assert all(len(found[s][0]) == 1 for s in live_sources)  # no live source moved


def _put(values: dict[str, bytes]) -> Callable[[PartitionState], Sequence[bytes]]:
    def fn(state: PartitionState) -> Sequence[bytes]:
        for key, value in values.items():
            state.put(key, value)
        return [b"a chunk"]

    return fn


def test_a_fenced_owner_expires_nothing(kafka_cluster: Any, kafka_namespace: str) -> None:
    """The stale owner's table says the source is idle; the new owner wrote it since."""
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=20
    )
    stale = open_kafka_store(settings)
    current = open_kafka_store(settings)
    try:
        stale.create_topic("dc1.exp", TopicConfig(partitions=1))
        hour_ago = int(time.time() * 1000) - 3600_000
        stale.transact(
            "dc1.exp",
            0,
            _put(
                {
                    seqno_key("src"): encode_source_value(5, hour_ago),
                    SOURCE_COUNT_KEY: encode_seqno(1),
                }
            ),
        )
        takeovers = len(stale.takeovers)
        # the new owner takes the partition over (fencing the stale one) and writes the source
        current.transact(
            "dc1.exp",
            0,
            _put({seqno_key("src"): encode_source_value(6, int(time.time() * 1000))}),
        )
        # the stale owner still holds its old table, which says the source is idle
        assert stale.scan_state("dc1.exp", 0, "seq/") == [
            (seqno_key("src"), encode_source_value(5, hour_ago))
        ]
        done = SourceExpiry(stale, idle_s=60).run_once()
        assert done.expired == 0
        # its commit was refused: the transaction ran again after a takeover, on Kafka's table
        assert len(stale.takeovers) > takeovers
    finally:
        stale.close()
        current.close()
    with open_kafka_store(settings) as reader:
        assert decode_seqno(reader.get_state("dc1.exp", 0, seqno_key("src"))) == 6
        assert decode_seqno(reader.get_state("dc1.exp", 0, SOURCE_COUNT_KEY)) == 1


def test_a_pin_deleted_after_a_router_saw_it_is_put_back_by_the_first_write(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """Pins live in their home partitions' state: expiry deletes them there and raises the
    deletion count after; a router that saw the pins before puts them back when a write gives
    their sources state, even on a topic grown since (a new pin would move them)."""
    settings = KafkaSettings(
        kafka_cluster.bootstrap, namespace=kafka_namespace, operation_timeout_s=20
    )
    with open_kafka_store(settings) as store:
        check_deleted_pins_are_put_back_by_the_first_write(store)
