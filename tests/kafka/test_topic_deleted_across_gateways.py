"""A topic deleted while two gateways write it, each owning some of its partitions.

Writers send through both gateways at once; the topic is deleted through the gateway that
does not own every partition (``DELETE /v1/topics/{topic}``), or by another process
(``logbroker topics delete``).  Then: no write answered after the deletion's answer is in the
deleted topic (each is in the topic made again, once), neither gateway is left answering
503 or hanging, both give the deleted topic's partitions up and own the new topic's, and a
reader sees the new topic id (a group member's commit naming the old one is refused).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from log_store import LogStore, TopicConfig, UnknownPartition, UnknownTopic
from log_store.kafka import KafkaSettings, open_kafka_store
from log_store.kafka.store import home_partition
from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.gateway.conftest import Client
from tests.kafka.conftest import envelopes, wait_until

pytestmark = pytest.mark.kafka

TOPIC = "dc1.app"
PARTITIONS = 8
"""The deleted topic's partitions; the gateways make it again with their 4 (writes routed to
partitions 4..7 of the deleted topic must route again, not answer 404 for ever)."""
REMADE_PARTITIONS = 4
SOURCES = 12  # over 8 partitions: each gateway's partitions get some
LOAD_AFTER_S = 5.0
"""How long the writers go on after the deletion was answered."""
SLOW_S = 25.0
"""A request answered later than this hung (the gateways' operation timeout is 10 s)."""


@dataclass
class _Answer:
    source: str
    seqno: int
    status: str
    """``written``/``duplicate``, else the HTTP status or the error that ended the request."""
    answered_at: float
    took_s: float
    reason: str = ""


def _owners(url: str) -> dict[int, str | None]:
    response = httpx.get(f"{url}/v1/topics/{TOPIC}/owners", timeout=10)
    if response.status_code != 200:
        return {}
    return {p["partition"]: p["owner"] for p in response.json()["partitions"]}


def _split_between(
    gateways: list[GatewayProcess], partitions: int, seen: list[object] | None = None
) -> bool:
    """Every partition of the topic has an owner, and each gateway owns some (what the first
    gateway answered is kept in ``seen``, for the failure's message)."""
    owners = _owners(gateways[0].url)
    if seen is not None:
        seen[:] = [owners]
    urls = {g.url.rstrip("/") for g in gateways}
    named = {(u or "").rstrip("/") for u in owners.values()}
    return len(owners) == partitions and named == urls


def _write_until(
    stop: threading.Event, client: Client, source: str, answers: list[_Answer]
) -> None:
    seqno = 0
    while not stop.is_set():
        seqno += 1
        started = time.monotonic()
        try:
            response = client.write(source, [seqno])
            reason = "" if response.status_code == 200 else response.text[:200]
            if response.status_code == 200:
                (ack,) = response.json()["results"][0]["acks"]
                status = str(ack["status"])
            else:
                status = str(response.status_code)
        except httpx.HTTPError as exc:
            status, reason = type(exc).__name__, str(exc)
        now = time.monotonic()
        answers.append(_Answer(source, seqno, status, now, now - started, reason))
        if not status.isalpha():
            time.sleep(0.05)  # a refused write is retried with the next seqno


def _join_group(url: str) -> dict[str, Any]:
    joined = httpx.post(
        f"{url}/v1/groups/g1/members",
        json={"topics": [TOPIC], "reset": "earliest", "session_timeout_ms": 60000},
        timeout=30,
    )
    assert joined.status_code == 200, joined.text
    member: dict[str, Any] = joined.json()
    return member


def _heartbeat(url: str, member_id: str) -> dict[str, Any]:
    beat = httpx.post(f"{url}/v1/groups/g1/members/{member_id}/heartbeat", json={}, timeout=30)
    assert beat.status_code == 200, beat.text
    answer: dict[str, Any] = beat.json()
    return answer


@pytest.mark.parametrize("deleter", ["the route of a gateway", "logbroker topics delete"])
def test_a_topic_deleted_under_two_writing_gateways_keeps_every_later_ack_in_the_new_topic(
    start_kafka_gateway: Callable[..., GatewayProcess],
    kafka_store: LogStore,
    kafka_cluster: Any,
    kafka_namespace: str,
    deleter: str,
) -> None:
    """Before: writes answered written after the deletion whose records were in the deleted
    topic (an owner that took a partition over as the deletion fenced it committed there,
    and its acknowledger, asking the end of the new topic of that name, acked after its
    10 s timeout); takeovers replaying a deleted state topic hung a minute (requests with
    them, and the gateway's group callbacks); sources routed to partitions the new topic does
    not have answered 404 ``unknown_partition`` for ever."""
    kafka_store.create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
    gateways = [start_kafka_gateway(), start_kafka_gateway()]
    wait_until(lambda: _split_between(gateways, PARTITIONS), 60, "both gateways to own some")
    old_id = kafka_store.describe_topic(TOPIC).topic_id
    member = _join_group(gateways[1].url)
    answers: list[_Answer] = []
    stop = threading.Event()
    clients = [Client(g.url, timeout_s=60) for g in gateways]
    threads = [
        threading.Thread(
            target=_write_until, args=(stop, clients[n % 2], f"src-{n}", answers), daemon=True
        )
        for n in range(SOURCES)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(
            lambda: len({a.source for a in answers if a.status == "written"}) == SOURCES,
            30,
            "every source to be written before the deletion",
        )
        # the deleter does not own every partition: some are the other gateway's
        owners = _owners(gateways[0].url)
        assert any(u and u.rstrip("/") != gateways[0].url.rstrip("/") for u in owners.values())
        if deleter == "logbroker topics delete":
            deleted = subprocess.run(
                logbroker_cmd(
                    "topics", "--kafka-bootstrap", kafka_cluster.bootstrap,
                    "--kafka-namespace", kafka_namespace, "delete", TOPIC,
                ),
                capture_output=True, text=True, cwd=REPO, timeout=60,
            )  # fmt: skip
            assert deleted.returncode == 0, deleted.stderr
        else:
            response = httpx.delete(f"{gateways[0].url}/v1/topics/{TOPIC}", timeout=60)
            assert response.status_code == 200, response.text
            assert response.json()["topic_id"] == old_id
        deleted_at = time.monotonic()
        time.sleep(LOAD_AFTER_S)
    finally:
        stop.set()
        for thread in threads:
            thread.join(SLOW_S + 35)
    assert not any(t.is_alive() for t in threads), "a write never came back"
    try:
        # neither gateway is left stuck: a write of every source through each is answered
        # (refused, 503, only while the new topic's partitions find their owners: within the
        # 15 s the check of the writers' answers below allows too)
        for client in clients:
            for n in range(SOURCES):
                seqno = 10**6 + n + (10**5 if client is clients[1] else 0)
                while True:
                    started = time.monotonic()
                    response = client.write(f"src-{n}", [seqno])
                    if response.status_code != 503 or started > deleted_at + 15:
                        break
                    time.sleep(0.2)
                assert response.status_code == 200, response.text
                assert time.monotonic() - started < 10, "a write waited for the deleted topic"
                (ack,) = response.json()["results"][0]["acks"]
                answers.append(_Answer(f"src-{n}", seqno, ack["status"], time.monotonic(), 0))
    finally:
        for client in clients:
            client.close()
    slow = [a for a in answers if a.took_s > SLOW_S]
    assert not slow, f"requests hung: {slow[:5]}"
    refused = [a for a in answers if a.answered_at > deleted_at + 15 and not a.status.isalpha()]
    assert not refused, f"still refused 15 s after the deletion: {refused[:5]}"

    new_id = kafka_store.describe_topic(TOPIC).topic_id
    assert new_id != old_id
    in_new: dict[tuple[str, int], int] = {}
    partitions_of: dict[str, set[int]] = {}
    for partition, records in envelopes(kafka_store, TOPIC).items():
        last: dict[str, int] = {}
        for _offset, env in records:
            key = (env.source_id, env.seqno)
            in_new[key] = in_new.get(key, 0) + 1
            assert env.seqno > last.get(env.source_id, 0), f"out of order: {key}"
            last[env.source_id] = env.seqno
            partitions_of.setdefault(env.source_id, set()).add(partition)
    assert len(partitions_of) == SOURCES
    split = {s: p for s, p in partitions_of.items() if len(p) > 1}
    assert not split, f"sources in more than one partition of the new topic: {split}"
    twice = [k for k, count in in_new.items() if count > 1]
    assert not twice, f"written twice in the new topic: {twice[:5]}"
    # Acknowledged after the deletion's answer: in the new topic.  Half a second of margin for
    # an answer still on its way when the deletion was answered (acked before it).
    acked_later = [
        a
        for a in answers
        if a.answered_at > deleted_at + 0.5 and a.status in ("written", "duplicate")
    ]
    lost = [a for a in acked_later if (a.source, a.seqno) not in in_new]
    assert not lost, (
        f"{len(lost)} of {len(acked_later)} writes acknowledged after the deletion's answer "
        f"are not in the new topic: {lost[:5]}"
    )

    # both gateways own the new topic's partitions (they gave the old ones up)
    seen: list[object] = []
    try:
        wait_until(lambda: _split_between(gateways, REMADE_PARTITIONS, seen), 30, "the new topic")
    except AssertionError:
        urls = [g.url for g in gateways]
        raise AssertionError(f"both gateways {urls} do not own the new topic: {seen}") from None
    # a reader sees the new identity; a group member is given it, its commit naming the old
    # one is refused
    described = httpx.get(f"{gateways[0].url}/v1/topics/{TOPIC}", timeout=30).json()
    assert described["topic_id"] == new_id
    beat = wait_until(
        lambda: (
            (b := _heartbeat(gateways[1].url, member["member_id"]))["assignment"]
            and all(p["topic_id"] == new_id for p in b["assignment"])
            and b
        ),
        30,
        "the group member to be given the new topic",
    )
    stale = httpx.post(
        f"{gateways[1].url}/v1/groups/g1/offsets",
        json={
            "member_id": member["member_id"],
            "offsets": [
                {"topic": TOPIC, "partition": p["partition"], "offset": 0, "topic_id": old_id}
                for p in beat["assignment"][:1]
            ],
        },
        timeout=30,
    )
    assert stale.status_code == 409, stale.text
    assert stale.json()["error"] == "topic_recreated"
    for gateway in gateways:
        text = gateway.log_path.read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]


def test_a_write_to_a_partition_the_topic_made_again_lacks_is_an_unknown_topic(
    kafka_cluster: Any, kafka_namespace: str
) -> None:
    """Partitions never shrink: a write for partition 6 of a topic that has 4 was routed in a
    topic deleted since, and is ``UnknownTopic`` (the writer routes again) as well as the
    ``UnknownPartition`` it always was.  Before, only the latter: a gateway's cached route
    answered 404 ``unknown_partition`` for ever."""
    settings = KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace)
    writer, deleter = open_kafka_store(settings), open_kafka_store(settings)
    try:
        writer.create_topic("dc1.t", TopicConfig(partitions=8))
        writer.append("dc1.t", 6, [b"before"])
        deleter.delete_topic("dc1.t")
        deleter.create_topic("dc1.t", TopicConfig(partitions=4))
        for _ in range(2):  # the deleted topic's writer, then a new one
            with pytest.raises(UnknownTopic) as caught:
                writer.append("dc1.t", 6, [b"after"])
        assert isinstance(caught.value, UnknownPartition)
        assert writer.append("dc1.t", 2, [b"after"]).count == 1
    finally:
        writer.close()
        deleter.close()


def test_a_pin_read_of_a_topic_made_again_smaller_is_an_unknown_topic(
    kafka_cluster: Any, kafka_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway reads pins in the homes of the topic as it cached it; when another of its
    threads has looked the topic up again meanwhile (deleted, made again with 4 partitions),
    a home of the old shape is missing: ``UnknownTopic`` (the router looks the topic up again
    and routes afresh), not the 404 ``unknown_partition`` seen before on a write."""
    settings = KafkaSettings(kafka_cluster.bootstrap, namespace=kafka_namespace)
    reader, deleter = open_kafka_store(settings), open_kafka_store(settings)
    try:
        reader.create_topic("dc1.t", TopicConfig(partitions=8))
        key = next(k for k in (f"pin-{n}" for n in range(100)) if home_partition(k, 8) >= 4)
        reader.put_topic_state_if_absent("dc1.t", key, b"pinned")
        looked = reader._topic
        cached = looked("dc1.t", fresh=True)
        deleter.delete_topic("dc1.t")
        deleter.create_topic("dc1.t", TopicConfig(partitions=4))
        calls: list[bool] = []

        def topic(name: str, *, fresh: bool = False) -> Any:
            calls.append(fresh)  # first the cached (deleted) topic, then the new one
            return cached if len(calls) == 1 else looked(name, fresh=True)

        monkeypatch.setattr(reader, "_topic", topic)
        with pytest.raises(UnknownTopic):
            reader.get_topic_state("dc1.t", key)
    finally:
        reader.close()
        deleter.close()
