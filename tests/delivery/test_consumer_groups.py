"""Consumer groups of real ``logbroker read`` processes against a real gateway."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import wait_until

SOURCES = 12
PRE_WRITTEN = 40  # seqnos per source before the readers start
WRITTEN_WHILE_READING = 60  # more per source while they read


def _reader_args(url: str, group: str) -> list[str]:
    # A session timeout well above a stall of this loaded machine: a live member presumed dead
    # would (rightly, at least once) repeat its batch, which is not what these tests look at.
    flags = {
        "--server": url,
        "--topic": "dc1.app",
        "--group": group,
        "--format": "jsonl",
        "--session-timeout-ms": "4000",
        "--max-bytes": "600",
    }
    return [*(x for kv in flags.items() for x in kv), "--from-beginning"]


def _write_stream(writer: Any, first: int, count: int, pause_s: float) -> None:
    for seqno in range(first, first + count):
        for s in range(SOURCES):
            writer.write(f"src{s}", [seqno])
        time.sleep(pause_s)


def _expected() -> set[tuple[str, int]]:
    total = PRE_WRITTEN + WRITTEN_WHILE_READING
    return {(f"src{s}", n) for s in range(SOURCES) for n in range(1, total + 1)}


def _keys(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["source_id"], r["seqno"]) for r in records]


@pytest.mark.slow
@pytest.mark.fault
def test_group_of_three_with_one_killed_delivers_everything_and_repeats_only_its_uncommitted_tail(
    start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    gw = start_gateway(None, "--partitions", "6")
    writer = writer_for(gw.url)
    _write_stream(writer, 1, PRE_WRITTEN, 0)
    readers = [start_reader(*_reader_args(gw.url, "g3")) for _ in range(3)]
    stream = threading.Thread(
        target=_write_stream,
        args=(writer_for(gw.url), PRE_WRITTEN + 1, WRITTEN_WHILE_READING, 0.03),
    )
    stream.start()
    wait_until(lambda: len(readers[0].records()) > 20, 20, "the first reader to get messages")
    readers[0].kill()
    stream.join()

    expected = _expected()

    def delivered() -> set[tuple[str, int]]:
        return {k for r in readers for k in _keys(r.records())}

    wait_until(lambda: delivered() >= expected, 30, "every message to be delivered")
    for r in readers[1:]:
        assert r.terminate() == 0, r.stderr()

    killed = readers[0].records()
    survivors = [rec for r in readers[1:] for rec in r.records()]
    assert set(_keys(killed + survivors)) == expected
    # The survivors never repeat each other: ownership moved only on release or death.
    position_counts = Counter((r["topic"], r["partition"], r["offset"]) for r in survivors)
    assert max(position_counts.values()) == 1
    # What the killed reader had committed is not delivered again: repeats are only the tail
    # of what it printed in each partition after its last commit.
    killed_by_partition: dict[int, list[int]] = defaultdict(list)
    for r in killed:
        killed_by_partition[r["partition"]].append(r["offset"])
    repeated = [
        (r["partition"], r["offset"])
        for r in killed
        if position_counts[(r["topic"], r["partition"], r["offset"])]
    ]
    for partition, offset in repeated:
        later = [o for o in killed_by_partition[partition] if o > offset]
        assert all(position_counts[("dc1.app", partition, o)] for o in later), (
            f"partition {partition}: offset {offset} was repeated but a later one was not"
        )


@pytest.mark.slow
def test_member_stopped_cleanly_hands_over_without_any_repeat(
    start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    gw = start_gateway(None, "--partitions", "6")
    writer = writer_for(gw.url)
    _write_stream(writer, 1, PRE_WRITTEN, 0)
    readers = [start_reader(*_reader_args(gw.url, "g2")) for _ in range(2)]
    stream = threading.Thread(
        target=_write_stream,
        args=(writer_for(gw.url), PRE_WRITTEN + 1, WRITTEN_WHILE_READING, 0.03),
    )
    stream.start()
    wait_until(lambda: len(readers[0].records()) > 20, 20, "the first reader to get messages")
    assert readers[0].terminate() == 0, readers[0].stderr()
    stream.join()
    expected = _expected()
    wait_until(
        lambda: {k for r in readers for k in _keys(r.records())} >= expected,
        30,
        "every message to be delivered",
    )
    assert readers[1].terminate() == 0, readers[1].stderr()
    everything = [k for r in readers for k in _keys(r.records())]
    assert Counter(everything).most_common(1)[0][1] == 1
    assert set(everything) == expected


def test_group_state_is_shared_by_two_gateways_over_one_data_dir(
    start_gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    """Behind a load balancer a member's requests land on any gateway: nothing breaks."""
    data_dir = tmp_path / "shared"
    gw_a = start_gateway(data_dir)
    gw_b = start_gateway(data_dir)
    writer_for(gw_a.url).write("src0", [1, 2, 3])
    a, b = httpx.Client(base_url=gw_a.url), httpx.Client(base_url=gw_b.url)
    joined = a.post("/v1/groups/lb/members", json={"topics": ["dc1.app"], "reset": "earliest"})
    assert joined.status_code == 200, joined.text
    member = joined.json()["member_id"]
    owned = joined.json()["assignment"]
    assert len(owned) == 4
    beat = b.post(f"/v1/groups/lb/members/{member}/heartbeat", json={})
    assert beat.status_code == 200, beat.text
    assert beat.json()["assignment"] == owned
    first = owned[0]
    commit = b.post(
        "/v1/groups/lb/offsets",
        json={"member_id": member, "offsets": [{**first, "offset": 0}]},
    )
    assert commit.status_code == 200, commit.text
    described = a.get("/v1/groups/lb").json()
    assert [m["member_id"] for m in described["members"]] == [member]
    assert a.delete(f"/v1/groups/lb/members/{member}").status_code == 200
    assert b.post(f"/v1/groups/lb/members/{member}/heartbeat", json={}).status_code == 404
    a.close()
    b.close()


def test_commit_from_a_member_that_does_not_own_the_partition_is_refused(
    gateway: Any, writer_for: Any
) -> None:
    writer_for(gateway.url).write("src0", [1, 2])
    http = httpx.Client(base_url=gateway.url)
    one = http.post("/v1/groups/own/members", json={"topics": ["dc1.app"]}).json()
    two = http.post("/v1/groups/own/members", json={"topics": ["dc1.app"]}).json()
    assert two["assignment"] == []  # the first member owns all until it releases some
    target = one["assignment"][0]
    refused = http.post(
        "/v1/groups/own/offsets",
        json={"member_id": two["member_id"], "offsets": [{**target, "offset": 0}]},
    )
    assert refused.status_code == 409
    assert refused.json()["error"] == "not_owner"
    # After the first member releases what it is asked to, the second one gets its share.
    beat = http.post(f"/v1/groups/own/members/{one['member_id']}/heartbeat", json={}).json()
    assert len(beat["revoke"]) == 2
    http.post(
        f"/v1/groups/own/members/{one['member_id']}/heartbeat",
        json={"release": beat["revoke"]},
    )
    beat2 = http.post(f"/v1/groups/own/members/{two['member_id']}/heartbeat", json={}).json()
    assert sorted(a["partition"] for a in beat2["assignment"]) == sorted(
        r["partition"] for r in beat["revoke"]
    )
    http.close()


@pytest.mark.slow
@pytest.mark.fault
def test_group_reader_rides_out_a_gateway_kill_without_loss_or_repeat(
    start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    gw = start_gateway()
    writer_for(gw.url).write("src0", list(range(1, 21)))
    reader = start_reader(
        "--server",
        gw.url,
        "--topic",
        "dc1.app",
        "--group",
        "ride",
        "--from-beginning",
        "--format",
        "jsonl",
        "--session-timeout-ms",
        "1500",
    )
    wait_until(lambda: len(reader.records()) == 20, 20, "the first 20 messages")
    # Let the commit that follows the print land: a kill between the two would (rightly)
    # deliver the batch again, which the other tests cover.
    time.sleep(0.5)
    gw.kill()
    time.sleep(2.0)  # longer than the session timeout: the member must join again
    gw.start()
    writer_for(gw.url).write("src0", list(range(21, 41)))
    wait_until(lambda: len(reader.records()) >= 40, 30, "the messages written after restart")
    assert reader.terminate() == 0, reader.stderr()
    assert [r["seqno"] for r in reader.records()] == list(range(1, 41))


def _topics(data_dir: Any, *args: str) -> None:
    done = subprocess.run(
        logbroker_cmd("topics", "--data-dir", str(data_dir), *args),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.fault
def test_group_reads_a_topic_created_again_from_its_start(
    gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    writer = writer_for(gateway.url)
    writer.write("old", [1, 2, 3, 4, 5])
    reader = start_reader(*_reader_args(gateway.url, "again"))
    wait_until(lambda: len(reader.records()) == 5, 20, "the old topic's messages")
    wait_until(lambda: _committed(gateway.url, "again") == [5], 10, "the group to commit offset 5")
    _topics(gateway.data_dir, "delete", "dc1.app")
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    # Shorter than the committed offset 5 first (a reader there stalls), then longer (a
    # reader there skips what is below it).
    writer.write("new", [1, 2, 3])
    wait_until(lambda: len(reader.records()) >= 8, 20, "the new topic's first messages")
    writer.write("new", [4, 5, 6, 7, 8])
    wait_until(lambda: len(reader.records()) >= 13, 20, "the new topic's later messages")
    time.sleep(0.5)
    expected = [("old", n) for n in range(1, 6)] + [("new", n) for n in range(1, 9)]
    assert _keys(reader.records()) == expected
    wait_until(lambda: _committed(gateway.url, "again") == [8], 10, "the group to commit offset 8")
    # the reader says so on stderr, naming itself as every line it writes there does
    assert "logbroker read: dc1.app was created again" in reader.stderr(), reader.stderr()


def _committed(url: str, group: str) -> list[int | None]:
    described = httpx.get(f"{url}/v1/groups/{group}").json()
    return [p["committed"] for p in described.get("partitions", [])]


def test_commit_for_an_older_topic_of_the_same_name_is_refused(
    gateway: Any, writer_for: Any
) -> None:
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    writer_for(gateway.url).write("old", [1, 2, 3])
    old_id = httpx.get(f"{gateway.url}/v1/topics/dc1.app").json()["topic_id"]
    _topics(gateway.data_dir, "delete", "dc1.app")
    _topics(gateway.data_dir, "create", "dc1.app", "--partitions", "1")
    writer_for(gateway.url).write("new", [1, 2, 3])
    item = {"topic": "dc1.app", "partition": 0, "offset": 2}
    stale = httpx.post(
        f"{gateway.url}/v1/groups/manual/offsets",
        json={"offsets": [{**item, "topic_id": old_id}]},
    )
    assert stale.status_code == 409
    assert stale.json()["error"] == "topic_recreated"
    assert httpx.get(f"{gateway.url}/v1/groups/manual").status_code == 404
    fresh = httpx.post(f"{gateway.url}/v1/groups/manual/offsets", json={"offsets": [item]})
    assert fresh.status_code == 200, fresh.text
    assert _committed(gateway.url, "manual") == [2]


def test_a_misspelt_field_of_a_join_heartbeat_or_commit_is_refused_and_changes_nothing(
    gateway: Any, writer_for: Any
) -> None:
    """A typo must not quietly change what a group does (``rest`` for ``reset`` would start a
    new group at the end and skip everything written before)."""
    writer_for(gateway.url).write("src0", [1, 2])
    http = httpx.Client(base_url=gateway.url)
    typo = http.post("/v1/groups/typo/members", json={"topics": ["dc1.app"], "rest": "earliest"})
    assert typo.status_code == 400, typo.text
    assert typo.json()["error"] == "bad_request"
    assert "rest" in typo.json()["reason"]
    assert http.get("/v1/groups/typo").status_code == 404  # no group was made
    member = http.post(
        "/v1/groups/typo/members", json={"topics": ["dc1.app"], "reset": "earliest"}
    ).json()
    beat = f"/v1/groups/typo/members/{member['member_id']}/heartbeat"
    refused = http.post(beat, json={"relase": [{"topic": "dc1.app", "partition": 0}]})
    assert refused.status_code == 400, refused.text
    no_topic = http.post(beat, json={"release": [{"partition": 0}]})
    assert no_topic.status_code == 400, no_topic.text
    target = member["assignment"][0]
    commit = http.post(
        "/v1/groups/typo/offsets",
        json={"memberid": member["member_id"], "offsets": [{**target, "offset": 0}]},
    )
    assert commit.status_code == 400, commit.text
    assert "memberid" in commit.json()["reason"]
    commit = http.post(
        "/v1/groups/typo/offsets",
        json={"member_id": member["member_id"], "offsets": [{**target, "ofset": 1}]},
    )
    assert commit.status_code == 400, commit.text
    described = http.get("/v1/groups/typo").json()
    assert {p["committed"] for p in described["partitions"]} == {0}
    assert described["generation"] == member["generation"]
    http.close()


def test_a_join_naming_a_topic_twice_or_too_many_topics_is_refused(gateway: Any) -> None:
    http = httpx.Client(base_url=gateway.url)
    twice = http.post("/v1/groups/dup/members", json={"topics": ["dc1.app"] * 3})
    assert twice.status_code == 400, twice.text
    assert "dc1.app" in twice.json()["reason"]
    many = [f"dc1.t{i}" for i in range(1001)]
    too_many = http.post("/v1/groups/dup/members", json={"topics": many})
    assert too_many.status_code == 400, too_many.text
    assert http.get("/v1/groups/dup").status_code == 404
    joined = http.post("/v1/groups/dup/members", json={"topics": many[:1000]})
    assert joined.status_code == 200, joined.text
    assert len(joined.json()["missing_topics"]) == 1000
    http.close()
