"""``logbroker mirror`` between two real installations, killed and raced, exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.delivery.conftest import Writer, wait_until


def _raw_partitions(url: str, topic: str) -> dict[int, list[tuple[str, int, str]]]:
    """(source_id, seqno, kind) of every record per partition, as stored."""
    info = httpx.get(f"{url}/v1/topics/{topic}")
    if info.status_code == 404:
        return {}
    out: dict[int, list[tuple[str, int, str]]] = {}
    for p in info.json()["partitions"]:
        records: list[tuple[str, int, str]] = []
        offset = p["start_offset"]
        while offset < p["end_offset"]:
            body = httpx.get(
                f"{url}/v1/topics/{topic}/partitions/{p['partition']}/messages",
                params={"offset": offset, "raw": 1},
            ).json()
            records += [
                (m["source_id"], m["seqno"], m.get("kind", "chunk")) for m in body["messages"]
            ]
            offset = body["next_offset"]
        out[p["partition"]] = records
    return out


def _mirror(src: str, dst: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        logbroker_cmd("mirror", "--from", src, "--to", dst, "--prefix", "dc1.", *extra),
        cwd=REPO,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
@pytest.mark.fault
def test_mirror_killed_and_raced_copies_every_partition_exactly_once(
    start_gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    writer_for(dc2.url).write("local", [1, 2])  # dc2's own topic is not copied back
    writer = writer_for(dc1.url)
    for s in range(8):
        writer.write(f"src{s}", list(range(1, 51)))

    def keep_writing() -> None:
        w = writer_for(dc1.url)
        for n in range(51, 111):
            for s in range(8):
                w.write(f"src{s}", [n])

    stream = threading.Thread(target=keep_writing)
    stream.start()
    first = _mirror(dc1.url, dc2.url, "--max-bytes", "2000")
    wait_until(
        lambda: sum(map(len, _raw_partitions(dc2.url, "dc1.app").values())) > 100,
        20,
        "the mirror to copy something",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    # two mirrors at once (an operator's mistake) still copy each message once
    second = _mirror(dc1.url, dc2.url, "--max-bytes", "3000", "--idle-exit", "2")
    third = _mirror(dc1.url, dc2.url, "--idle-exit", "2", "--state-dir", str(tmp_path / "st"))
    stream.join()
    assert second.wait(60) == 0, second.stderr.read() if second.stderr else ""
    assert third.wait(60) == 0, third.stderr.read() if third.stderr else ""
    source = _raw_partitions(dc1.url, "dc1.app")
    assert sum(map(len, source.values())) == 8 * 110
    assert _raw_partitions(dc2.url, "dc1.app") == source
    assert [t["name"] for t in httpx.get(f"{dc1.url}/v1/topics").json()["topics"]] == ["dc1.app"]
    assert (tmp_path / "st" / "mirror-status.json").exists()


def test_mirrored_legacy_transactions_resolve_in_the_other_dc(
    start_gateway: Any, tmp_path: Any
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    from delivery.mirror import encode_replica_body
    from session_dedup.envelope import Envelope, encode

    http = httpx.Client(base_url=dc2.url)
    # Records already in dc2's partitions shift every mirrored offset by 3, so a commit marker
    # resolves only if the mirror rewrote the data offset it names.
    filler = encode(Envelope("f", "h", "f", "app", "raw", 1, 0, 0, b"filler\n"))
    for p in range(4):
        response = http.post(
            f"/v1/replica/dc1.app/partitions/{p}",
            params={"source": "an-older-copy", "partitions": 4, "start": 0},
            content=encode_replica_body([(0, filler), (1, filler), (2, filler)]),
        )
        assert response.status_code == 200, response.text
    src = httpx.Client(base_url=dc1.url)
    sids = [
        src.post("/store", params={"log_type": "app"}, content=f"t{i}\n".encode()).json()[
            "store_id"
        ]
        for i in range(4)
    ]
    txns = [src.post("/commit_request", params={"store_id": s}).json()["txn_id"] for s in sids]
    for txn in txns[:3]:
        assert src.post("/commit", params={"txn_id": txn, "log_type": "app"}).status_code == 200
    mirror = _mirror(dc1.url, dc2.url, "--idle-exit", "1")
    assert mirror.wait(30) == 0
    delivered = []
    for p in range(4):
        body = http.get(f"/v1/topics/dc1.app/partitions/{p}/messages", params={"offset": 0})
        delivered += [m["data"] for m in body.json()["messages"]]
    assert sorted(delivered) == ["filler\n"] * 12 + ["t0\n", "t1\n", "t2\n"]
    http.close()
    src.close()


def test_replica_append_refuses_a_gap_with_the_expected_offset(gateway: Any) -> None:
    from delivery.mirror import encode_replica_body
    from session_dedup.envelope import Envelope, encode

    value = encode(Envelope("s", "h", "f", "app", "raw", 1, 0, 0, b"x\n"))
    # dc9: a mirror copies another DC's topics (the gateway's own dc1.* are refused)
    url = f"{gateway.url}/v1/replica/dc9.app/partitions/0"
    params: dict[str, str | int] = {"source": "topic-id-1", "partitions": 2, "start": 5}
    # The first copy of a source must begin at the source's start offset.
    middle = httpx.post(url, params=params, content=encode_replica_body([(6, value)]))
    assert middle.status_code == 409
    assert middle.json()["expected_source_offset"] == 5
    first = httpx.post(url, params=params, content=encode_replica_body([(5, value), (6, value)]))
    assert first.status_code == 200, first.text
    assert first.json()["next_source_offset"] == 7
    again = httpx.post(url, params=params, content=encode_replica_body([(5, value)]))
    assert again.status_code == 409
    assert again.json()["expected_source_offset"] == 7
    assert httpx.get(url, params={"source": "topic-id-1"}).json()["next_source_offset"] == 7
    bad = httpx.post(url, params=params, content=b"junk")
    assert bad.status_code == 400
    described = httpx.get(f"{gateway.url}/v1/topics/dc9.app").json()
    assert described["partitions"][0]["end_offset"] == 2


def test_a_replica_source_that_is_too_long_or_has_control_characters_is_refused_by_name(
    gateway: Any,
) -> None:
    url = f"{gateway.url}/v1/replica/dc1.app/partitions/0"
    for source in ("a" * 201, "a\x00b", "a\nb"):
        for call in (
            httpx.get(url, params={"source": source}),
            httpx.post(url + "/dropped", params={"source": source, "partitions": 1, "to": 3}),
        ):
            assert call.status_code == 400, call.text
            assert call.json()["error"] == "bad_request"
            assert "1-200" in call.json()["reason"]
    assert httpx.get(f"{gateway.url}/v1/topics").json()["topics"] == []


_PAST_9999 = 253_402_214_400_001
"""A create time one millisecond after the last a gateway takes (9999-12-31 UTC)."""


def test_a_message_created_before_1970_is_mirrored_and_does_not_stop_the_mirror(
    start_gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    """The write protocol took any signed ``create_time``; the mirror's audit counted such a
    message in a window before 1970, which the destination refused (400): the mirror exited
    and every later run stopped at the same message.  Gateways refuse such times now (and
    times after 9999), and control characters in ``server`` and ``file``; records stored
    before are still copied as they are, neither refused (the mirror would stop for good) nor
    clamped (the copy would differ from the source's record)."""
    from log_store import open_store
    from session_dedup.envelope import Envelope, encode

    with open_store(tmp_path / "dc1") as store:  # as a gateway of an earlier release wrote them
        store.create_topic("dc1.app", exist_ok=True)
        store.append(
            "dc1.app",
            0,
            [
                encode(Envelope("old", "h\r\n\x1b[31m", "/f\n", "app", "raw", n, t, 1, b"%d\n" % n))
                for n, t in ((1, -1), (2, -86_400_000), (3, 1_700_000_000_000), (4, _PAST_9999))
            ],
        )
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    mirror = _mirror(dc1.url, dc2.url, "--idle-exit", "2")
    assert mirror.wait(60) == 0, mirror.stderr.read() if mirror.stderr else ""
    assert _raw_partitions(dc2.url, "dc1.app") == _raw_partitions(dc1.url, "dc1.app")
    assert sorted(seqno for _, seqno, _ in _raw_flat(dc2.url)) == [1, 2, 3, 4]
    copied = httpx.get(
        f"{dc2.url}/v1/topics/dc1.app/partitions/0/messages", params={"offset": 0, "raw": 1}
    ).json()["messages"]
    assert [(m["server"], m["file"], m["create_time"]) for m in copied] == [
        ("h\r\n\x1b[31m", "/f\n", t) for t in (-1, -86_400_000, 1_700_000_000_000, _PAST_9999)
    ]


def _raw_flat(url: str) -> list[tuple[str, int, str]]:
    return [r for records in _raw_partitions(url, "dc1.app").values() for r in records]


def _topics(data_dir: Any, *args: str) -> None:
    done = subprocess.run(
        logbroker_cmd("topics", "--data-dir", str(data_dir), *args),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def _seqnos(url: str, topic: str) -> list[int]:
    return [seqno for records in _raw_partitions(url, topic).values() for _, seqno, _ in records]


@pytest.mark.fault
def test_mirror_skips_what_source_retention_dropped_and_reports_the_gap(
    start_gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    # One partition whose segments roll at every write, so whole writes can be dropped.
    _topics(dc1.data_dir, "create", "dc1.app", "--partitions", "1", "--segment-bytes", "4096")
    writer = writer_for(dc1.url)
    writer.write("src", list(range(1, 61)))
    first = _mirror(dc1.url, dc2.url, "--idle-exit", "1")
    assert first.wait(30) == 0
    assert _seqnos(dc2.url, "dc1.app") == list(range(1, 61))

    writer.write("src", list(range(61, 121)))
    writer.write("src", list(range(121, 181)))
    # Forced deletion drops offsets 60..119 before the mirror saw them.
    _topics(
        dc1.data_dir, "delete-segments", "dc1.app", "--partition", "0", "--before-offset", "120"
    )
    source = httpx.get(f"{dc1.url}/v1/topics/dc1.app").json()
    assert source["partitions"][0]["start_offset"] == 120

    second = _mirror(dc1.url, dc2.url, "--idle-exit", "2", "--state-dir", str(tmp_path / "st"))
    assert second.wait(60) == 0
    assert _seqnos(dc2.url, "dc1.app") == [*range(1, 61), *range(121, 181)]
    stderr = second.stderr.read().decode() if second.stderr else ""
    assert "dropped by the source's retention" in stderr
    position = httpx.get(
        f"{dc2.url}/v1/replica/dc1.app/partitions/0", params={"source": source["topic_id"]}
    ).json()
    assert position["next_source_offset"] == 180
    assert position["dropped_offsets"] == 60
    assert position["gaps"] == [[60, 120]]
    assert "logbroker_mirror_dropped_offsets_total 60" in httpx.get(f"{dc2.url}/metrics").text
    status = json.loads((tmp_path / "st" / "mirror-status.json").read_text())
    assert status["dropped_offsets"] == 60


@pytest.mark.slow
@pytest.mark.fault
def test_running_mirror_copies_a_recreated_source_topic_from_its_start(
    start_gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    _topics(dc1.data_dir, "create", "dc1.app", "--partitions", "1")
    writer = writer_for(dc1.url)
    writer.write("old", list(range(1, 11)))
    mirror = _mirror(dc1.url, dc2.url)
    try:
        wait_until(lambda: len(_seqnos(dc2.url, "dc1.app")) == 10, 20, "the first copy")
        # The topic is deleted and created again: its offsets start over at 0, below the
        # mirror's position in the old topic.
        _topics(dc1.data_dir, "delete", "dc1.app")
        _topics(dc1.data_dir, "create", "dc1.app", "--partitions", "1")
        writer.write("new", list(range(1, 16)))
        expected = [("old", n) for n in range(1, 11)] + [("new", n) for n in range(1, 16)]

        def copied() -> list[tuple[str, int]]:
            records = _raw_partitions(dc2.url, "dc1.app").get(0, [])
            return [(source, seqno) for source, seqno, _ in records]

        wait_until(lambda: copied() == expected, 30, "the new topic to be copied whole")
        time.sleep(1.0)  # nothing more comes: no record of the new topic is copied twice
        assert copied() == expected
    finally:
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(30) == 0


def test_mirror_stops_when_the_destination_expects_more_than_the_source_has(
    start_gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    from delivery.mirror import encode_replica_body
    from session_dedup.envelope import Envelope, encode

    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    _topics(dc1.data_dir, "create", "dc1.app", "--partitions", "1")
    writer_for(dc1.url).write("src", [1, 2, 3])
    source_id = httpx.get(f"{dc1.url}/v1/topics/dc1.app").json()["topic_id"]
    # A copy under this source's id that the source never had (restored from elsewhere).
    value = encode(Envelope("x", "h", "f", "app", "raw", 1, 0, 0, b"x\n"))
    response = httpx.post(
        f"{dc2.url}/v1/replica/dc1.app/partitions/0",
        params={"source": source_id, "partitions": 1, "start": 0},
        content=encode_replica_body([(i, value) for i in range(10)]),
    )
    assert response.status_code == 200, response.text
    mirror = _mirror(dc1.url, dc2.url, "--idle-exit", "5")
    assert mirror.wait(30) == 1
    stderr = mirror.stderr.read().decode() if mirror.stderr else ""
    assert "expects source offset 10, past the source's end 3" in stderr
    assert httpx.get(f"{dc2.url}/v1/topics/dc1.app").json()["partitions"][0]["end_offset"] == 10


def test_a_mirror_needs_the_replicate_permission_and_copies_only_gateway_records(
    start_gateway: Any, tmp_path: Any
) -> None:
    from delivery.mirror import encode_replica_body
    from session_dedup.envelope import Envelope, encode

    config = tmp_path / "gateway.toml"
    config.write_text(
        '[tokens.mirror-secret]\nread = ["dc1.*"]\nreplicate = ["dc1.*"]\n'
        '[tokens.writer-secret]\nwrite = ["app"]\nread = ["dc1.app"]\n'
    )
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1", "--config", str(config))
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2", "--config", str(config))
    writer = Writer(dc1.url, token="writer-secret")
    writer.write("s", [1, 2, 3])
    writer.close()
    token_file = tmp_path / "mirror.token"
    token_file.write_text("mirror-secret\n")
    token_file.chmod(0o600)
    done = subprocess.run(
        logbroker_cmd(
            "mirror", "--from", dc1.url, "--to", dc2.url, "--prefix", "dc1.",
            "--token-file", str(token_file), "--idle-exit", "2",
        ),
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    mirror = {"Authorization": "Bearer mirror-secret"}
    copied = httpx.get(f"{dc2.url}/v1/topics/dc1.app", headers=mirror).json()
    assert sum(p["end_offset"] for p in copied["partitions"]) == 3
    # Writing log type app does not let a token append raw records to any DC's app topic.
    url = f"{dc2.url}/v1/replica/dc7.app/partitions/0"
    params: dict[str, str | int] = {"source": "topic-id-7", "partitions": 1, "start": 0}
    good = encode(Envelope("s", "h", "f", "app", "raw", 1, 0, 0, b"x\n"))
    writer_auth = {"Authorization": "Bearer writer-secret"}
    body = encode_replica_body([(0, good)])
    assert httpx.post(url, params=params, content=body, headers=writer_auth).status_code == 403
    # Records are checked like written ones: anything a gateway would not write is refused.
    dc1_url = f"{dc2.url}/v1/replica/dc1.app/partitions/0"
    wrong_type = encode(Envelope("s", "h", "f", "db", "raw", 1, 0, 0, b"x\n"))
    bad_source = encode(Envelope("s\x01", "h", "f", "app", "raw", 1, 0, 0, b"x\n"))
    for records in ([(0, wrong_type)], [(0, bad_source)], [(0, b"not an envelope")]):
        refused = httpx.post(
            dc1_url, params=params, content=encode_replica_body(records), headers=mirror
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "bad_replica_record"
    again = httpx.get(f"{dc2.url}/v1/topics/dc1.app", headers=mirror).json()
    assert again == copied
