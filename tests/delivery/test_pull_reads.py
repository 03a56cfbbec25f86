"""Pull reads over HTTP from a real gateway: long-poll, framings, filters, prefixes, bad input."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from delivery.framing import BINARY_MEDIA_TYPE, decode_binary
from delivery.pull_client import PullClient
from session_dedup.envelope import decode
from tests.delivery.conftest import line_for, wait_until
from tests.metrics_text import sample


def _messages(url: str, topic: str, partition: int, offset: int = 0, **params: Any) -> Any:
    response = httpx.get(
        f"{url}/v1/topics/{topic}/partitions/{partition}/messages",
        params={"offset": offset, **params},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_waiting_reader_is_woken_by_the_append_not_by_its_timeout(
    gateway: Any, writer_for: Any
) -> None:
    writer = writer_for(gateway.url)
    ack = writer.write("src0", [1])[0]
    partition = None
    # the source is pinned to one partition; find it from the ack
    for p in range(4):
        if _messages(gateway.url, "dc1.app", p)["messages"]:
            partition = p
    assert partition is not None
    reader = httpx.Client(base_url=gateway.url, timeout=30)
    latencies = []
    offset = ack["offset"] + 1
    for seqno in range(2, 8):
        got: dict[str, Any] = {}

        def wait(at: int = offset, box: dict[str, Any] = got) -> None:
            response = reader.get(
                f"/v1/topics/dc1.app/partitions/{partition}/messages",
                params={"offset": at, "wait_ms": 10_000},
            )
            box["at"] = time.perf_counter()
            box["body"] = response.json()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # the reader is parked in its long-poll
        assert "at" not in got
        started = time.perf_counter()
        writer.write("src0", [seqno])
        waiter.join(10)
        assert got["body"]["messages"][0]["seqno"] == seqno
        latencies.append(got["at"] - started)
        offset += 1
    reader.close()
    # From the start of the write request (its fsync included) to the answer of a long-poll
    # that would otherwise have waited 10 s: woken by the append.  How fast that is on a
    # quiet machine is the e2e benchmark's latency figure (p99 at 5,000 lines/s), not a test.
    assert max(latencies) < 5.0, latencies


def test_long_poll_with_nothing_new_returns_empty_after_the_wait(
    gateway: Any, writer_for: Any
) -> None:
    writer_for(gateway.url).write("src0", [1])
    started = time.monotonic()
    body = _messages(gateway.url, "dc1.app", 0, offset=0, wait_ms=300, source_id="nobody")
    assert body["messages"] == []
    assert 0.25 < time.monotonic() - started < 3


def test_binary_and_json_framings_carry_the_same_messages(gateway: Any, writer_for: Any) -> None:
    writer = writer_for(gateway.url)
    for s in range(8):
        writer.write(f"src{s}", [1, 2, 3])
    for p in range(4):
        as_json = _messages(gateway.url, "dc1.app", p)
        response = httpx.get(
            f"{gateway.url}/v1/topics/dc1.app/partitions/{p}/messages",
            params={"offset": 0},
            headers={"Accept": BINARY_MEDIA_TYPE},
        )
        assert response.headers["content-type"] == BINARY_MEDIA_TYPE
        (section,) = decode_binary(response.content)
        assert section.meta["next_offset"] == as_json["next_offset"]
        from_binary = [(o, decode(v)) for o, v in section.records]
        assert [(o, e.source_id, e.seqno, e.data.decode()) for o, e in from_binary] == [
            (m["offset"], m["source_id"], m["seqno"], m["data"]) for m in as_json["messages"]
        ]


def test_filters_select_by_server_and_file_and_hash_splits_sources_among_readers(
    gateway: Any, writer_for: Any
) -> None:
    writer = writer_for(gateway.url)
    for s in range(10):
        writer.write(f"src{s}", [1, 2], server=f"host{s % 2}", file=f"/var/log/f{s % 3}.log")
    client = PullClient(gateway.url)
    everything = [(t, p, 0) for t, p in [("dc1.app", p) for p in range(4)]]
    from delivery.filters import parse_filter

    def read(**params: list[str]) -> list[tuple[str, int]]:
        parts = client.fetch(everything, message_filter=parse_filter(params))
        return sorted((m.envelope.source_id, m.envelope.seqno) for p in parts for m in p.messages)

    assert read(server=["host1"]) == sorted(
        (f"src{s}", n) for s in range(10) if s % 2 == 1 for n in (1, 2)
    )
    assert read(file=["/var/log/f2*"], server=["host0"]) == sorted(
        (f"src{s}", n) for s in range(10) if s % 3 == 2 and s % 2 == 0 for n in (1, 2)
    )
    split = [read(hash_mod=["3"], hash_rem=[str(r)]) for r in range(3)]
    assert sorted(k for part in split for k in part) == read()
    assert all(part for part in split)
    for part in split:
        for other in split:
            if part is not other:
                assert not {s for s, _ in part} & {s for s, _ in other}
    client.close()


def test_filtered_read_moves_past_what_it_skipped(gateway: Any, writer_for: Any) -> None:
    writer = writer_for(gateway.url)
    writer.write("src0", list(range(1, 30)))
    part = next(p for p in range(4) if _messages(gateway.url, "dc1.app", p)["messages"])
    body = _messages(gateway.url, "dc1.app", part, source_id="src-other")
    assert body["messages"] == []
    assert body["next_offset"] == body["end_offset"] == 29


def test_reading_by_prefix_lists_only_that_dcs_topics(
    gateway: Any, writer_for: Any, tmp_path: Any
) -> None:
    from log_store import open_store
    from session_dedup.envelope import Envelope, encode

    writer_for(gateway.url).write("src0", [1], log_type="app")
    # a topic mirrored from another DC lives beside this DC's own
    store = open_store(gateway.data_dir)
    store.create_topic("dc2.app", exist_ok=True)
    store.append("dc2.app", 0, [encode(Envelope("x", "h", "f", "app", "raw", 1, 0, 0, b"dc2\n"))])
    store.close()
    names = [t["name"] for t in httpx.get(f"{gateway.url}/v1/topics").json()["topics"]]
    assert names == ["dc1.app", "dc2.app"]
    only = httpx.get(f"{gateway.url}/v1/topics", params={"prefix": "dc1."}).json()["topics"]
    assert [t["name"] for t in only] == ["dc1.app"]
    # a misspelt prefix is not a list of everything
    typo = httpx.get(f"{gateway.url}/v1/topics", params={"prefx": "dc1."})
    assert typo.status_code == 400, typo.text
    assert "prefx" in typo.json()["reason"]
    flag = httpx.get(f"{gateway.url}/v1/topics", params={"include_audit": "yes"})
    assert flag.status_code == 400, flag.text


def test_jsonl_reader_prints_fields_and_undoes_gzip_and_zstd(
    gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    writer = writer_for(gateway.url)
    writer.write("plain", [1], codec="raw")
    writer.write("gz", [1], codec="gzip")
    writer.write("zs", [1], codec="zstd")
    reader = start_reader(
        "--server",
        gateway.url,
        "--topic",
        "dc1.*",
        "--from-beginning",
        "--format",
        "jsonl",
        "--idle-exit",
        "1",
    )
    assert reader.wait(20) == 0, reader.stderr()
    records = {r["source_id"]: r for r in reader.records()}
    assert set(records) == {"plain", "gz", "zs"}
    for source, record in records.items():
        assert record["data"] == line_for(source, 1).rstrip("\n")
        assert record["line"] == 0
        for name in ("topic", "partition", "offset", "seqno", "server", "file", "log_type"):
            assert name in record
        assert record["topic"] == "dc1.app"
    lines = start_reader(
        "--server",
        gateway.url,
        "--topic",
        "dc1.app",
        "--from-beginning",
        "--idle-exit",
        "1",
        "--where",
        "source_id=gz",
    )
    assert lines.wait(20) == 0
    assert lines.out_path.read_text() == line_for("gz", 1)


def test_jsonl_prints_one_object_per_line_and_jsonl_chunks_one_per_message(
    gateway: Any, start_reader: Any
) -> None:
    chunk = {"log_type": "app", "source_id": "multi", "seqno": 30, "server": "h", "file": "/f"}
    body = json.dumps({**chunk, "data": "first\nsecond\nthird\n"}) + "\n"
    body += json.dumps({**chunk, "seqno": 31, "data": "caf\u00e9\n"})
    response = httpx.post(
        gateway.url + "/v1/write",
        content=body.encode(),
        headers={"content-type": "application/x-ndjson"},
    )
    assert response.status_code == 200, response.text
    common = ["--server", gateway.url, "--topic", "dc1.app", "--from-beginning"]
    per_line = start_reader(*common, "--format", "jsonl", "--idle-exit", "1")
    per_chunk = start_reader(*common, "--format", "jsonl-chunks", "--idle-exit", "1")
    assert per_line.wait(30) == 0, per_line.stderr()
    assert per_chunk.wait(30) == 0, per_chunk.stderr()
    lines = per_line.records()
    assert [(r["seqno"], r["line"], r["data"]) for r in lines] == [
        (30, 0, "first"),
        (30, 1, "second"),
        (30, 2, "third"),
        (31, 0, "caf\u00e9"),
    ]
    assert {r["offset"] for r in lines[:3]} == {lines[0]["offset"]}
    assert all(r["source_id"] == "multi" and r["file"] == "/f" for r in lines)
    chunks = per_chunk.records()
    assert [(r["seqno"], r["data"]) for r in chunks] == [
        (30, "first\nsecond\nthird\n"),
        (31, "caf\u00e9\n"),
    ]


def test_reader_started_before_its_topic_waits_and_reads_it_from_the_start(
    gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    reader = start_reader("--server", gateway.url, "--topic", "dc1.late", "--format", "jsonl")
    wait_until(lambda: "waiting for topic 'dc1.late'" in reader.stderr(), 30, "the notice")
    assert gateway.url in reader.stderr()
    writer_for(gateway.url).write("src", [1, 2, 3], log_type="late")
    wait_until(lambda: len(reader.records()) == 3, 30, "the new topic's lines")
    assert [r["seqno"] for r in reader.records()] == [1, 2, 3]
    assert reader.stderr().count("waiting for topic") == 1
    assert reader.terminate() == 0


def test_glob_reader_picks_up_a_topic_created_after_it_started(
    gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    writer = writer_for(gateway.url)
    writer.write("a", [1], log_type="first")
    reader = start_reader("--server", gateway.url, "--topic", "dc1.*", "--format", "jsonl")
    # The reader is running (it saw a line written after it started) before the new topic.
    deadline = time.monotonic() + 30
    seqno = 2
    while not reader.records():
        assert time.monotonic() < deadline, reader.stderr()
        writer.write("a", [seqno], log_type="first")
        seqno += 1
        time.sleep(0.2)
    writer.write("b", [1, 2], log_type="second")
    wait_until(
        lambda: [r["seqno"] for r in reader.records() if r["topic"] == "dc1.second"] == [1, 2],
        30,
        "the later topic's lines",
    )
    assert all(r["seqno"] > 1 for r in reader.records() if r["topic"] == "dc1.first")
    assert reader.terminate() == 0


def test_idle_exit_counts_from_the_start_when_the_topic_never_appears(
    gateway: Any, start_reader: Any
) -> None:
    started = time.monotonic()
    reader = start_reader("--server", gateway.url, "--topic", "dc1.never", "--idle-exit", "2")
    assert reader.wait(30) == 0, reader.stderr()
    assert 2 <= time.monotonic() - started < 20
    assert "topic 'dc1.never' did not appear within 2 s" in reader.stderr()


def test_a_log_type_given_as_topic_names_the_topics_that_exist(
    gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    writer_for(gateway.url).write("src", [1])
    reader = start_reader("--server", gateway.url, "--topic", "app")
    assert reader.wait(30) == 2
    err = reader.stderr()
    assert "no topic 'app'" in err
    assert "<dc>.<log_type>" in err
    assert "did you mean dc1.app?" in err


def test_reader_started_before_the_gateway_waits_for_it(
    tmp_path: Any, start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    from tests.conftest import GatewayProcess

    gw = GatewayProcess(tmp_path / "data", [], tmp_path / "late-gateway.log")
    reader = start_reader(
        "--server", gw.url, "--topic", "dc1.app", "--format", "jsonl", "--from-beginning"
    )
    wait_until(lambda: "retrying" in reader.stderr(), 30, "the reader to say it retries")
    gw.start()
    try:
        writer_for(gw.url).write("src", [1, 2])
        wait_until(lambda: len(reader.records()) == 2, 30, "the lines")
        assert reader.terminate() == 0
    finally:
        gw.kill()


def test_reader_stops_on_sigterm_commits_and_the_next_one_continues(
    gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    writer = writer_for(gateway.url)
    writer.write("src0", [1, 2, 3])
    args = [
        "--server",
        gateway.url,
        "--topic",
        "dc1.app",
        "--group",
        "term",
        "--from-beginning",
        "--format",
        "jsonl",
    ]
    first = start_reader(*args)
    deadline = time.monotonic() + 20
    while len(first.records()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.terminate() == 0, first.stderr()
    writer.write("src0", [4, 5])
    second = start_reader(*args, "--idle-exit", "1")
    assert second.wait(20) == 0, second.stderr()
    assert [r["seqno"] for r in first.records()] == [1, 2, 3]
    assert [r["seqno"] for r in second.records()] == [4, 5]


# -- bad input ----------------------------------------------------------------------------------


@pytest.fixture
def filled(gateway: Any, writer_for: Any) -> Any:
    writer_for(gateway.url).write("src0", [1, 2, 3])
    return gateway


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["error"] == code
    assert body["reason"]
    return body


def test_unknown_topic_and_partition_are_404(filled: Any) -> None:
    url = filled.url
    _error(
        httpx.get(f"{url}/v1/topics/dc1.nope/partitions/0/messages?offset=0"), 404, "unknown_topic"
    )
    _error(
        httpx.get(f"{url}/v1/topics/dc1.app/partitions/9/messages?offset=0"),
        404,
        "unknown_partition",
    )
    _error(httpx.get(f"{url}/v1/topics/logbroker-internal.delivery"), 404, "unknown_topic")


def test_offset_past_the_end_is_416_with_the_valid_range(filled: Any) -> None:
    part = next(p for p in range(4) if _messages(filled.url, "dc1.app", p)["messages"])
    response = httpx.get(f"{filled.url}/v1/topics/dc1.app/partitions/{part}/messages?offset=99")
    body = _error(response, 416, "offset_out_of_range")
    assert (body["start_offset"], body["end_offset"]) == (0, 3)
    _error(
        httpx.get(f"{filled.url}/v1/topics/dc1.app/partitions/0/messages?offset=-1"),
        400,
        "bad_request",
    )


def test_huge_or_zero_max_bytes_and_huge_wait_are_refused(filled: Any) -> None:
    base = f"{filled.url}/v1/topics/dc1.app/partitions/0/messages?offset=0"
    _error(httpx.get(base + "&max_bytes=99999999999"), 400, "max_bytes_out_of_range")
    _error(httpx.get(base + "&max_bytes=0"), 400, "max_bytes_out_of_range")
    _error(httpx.get(base + "&wait_ms=99999999"), 400, "bad_request")
    _error(httpx.get(base + "&format=xml"), 400, "bad_request")


def test_a_max_bytes_past_64_bits_is_refused_as_out_of_range(filled: Any) -> None:
    base = f"{filled.url}/v1/topics/dc1.app/partitions/0/messages?offset=0"
    body = _error(httpx.get(base + "&max_bytes=" + "9" * 30), 400, "max_bytes_out_of_range")
    assert "1..67108864" in body["reason"]


def test_a_misspelt_or_unknown_read_option_is_refused_not_ignored(filled: Any) -> None:
    """A typo in a filter's name must not turn a filtered read into a read of everything."""
    base = f"{filled.url}/v1/topics/dc1.app/partitions/0/messages?offset=0"
    body = _error(httpx.get(base + "&servr=host9"), 400, "bad_request")
    assert "servr" in body["reason"]
    _error(httpx.get(base + "&raw=yes"), 400, "bad_request")
    twice = _error(httpx.get(base + "&offset=5"), 400, "bad_request")  # which one is meant?
    assert "offset" in twice["reason"]
    fetch = f"{filled.url}/v1/fetch"
    position = {"topic": "dc1.app", "partition": 0, "offset": 0}
    body = _error(
        httpx.post(fetch, json={"partitions": [position], "fliter": {}}), 400, "bad_request"
    )
    assert "fliter" in body["reason"]
    extra = {**position, "ofset": 3}
    _error(httpx.post(fetch, json={"partitions": [extra]}), 400, "bad_request")
    _error(httpx.post(fetch, json={"partitions": [position], "raw": "true"}), 400, "bad_request")
    # what the docs name is still accepted
    ok = httpx.get(base + "&raw=1&format=json&wait_ms=0&txn_window_ms=1000&max_bytes=100")
    assert ok.status_code == 200, ok.text
    ok = httpx.get(base + "&raw=false&server=host1&file=/var/*&hash_mod=2&hash_rem=0&hash_key=file")
    assert ok.status_code == 200, ok.text
    answer = httpx.post(
        fetch,
        json={
            "partitions": [position],
            "max_bytes": 100,
            "wait_ms": 0,
            "format": "json",
            "filter": {"server": ["host1"]},
            "raw": False,
            "txn_window_ms": 1000,
        },
    )
    assert answer.status_code == 200, answer.text


def test_a_json_route_given_another_content_type_is_415_and_changes_nothing(filled: Any) -> None:
    """As the write routes: ``curl -d`` sends a form, not JSON."""
    url = filled.url
    form = {"content-type": "application/x-www-form-urlencoded"}
    join = b'{"topics": ["dc1.app"]}'
    for path, body in (
        ("/v1/fetch", b'{"partitions": [{"topic": "dc1.app", "partition": 0, "offset": 0}]}'),
        ("/v1/groups/ct/members", join),
        ("/v1/groups/ct/members/abc/heartbeat", b"{}"),
        ("/v1/groups/ct/offsets", b'{"offsets": []}'),
        ("/v1/subscriptions", b'{"name": "ct", "endpoint": "http://127.0.0.1:9/", "topics": []}'),
    ):
        body_of = _error(
            httpx.post(url + path, content=body, headers=form), 415, "unsupported_media_type"
        )
        assert "application/json" in body_of["reason"]
    assert httpx.get(f"{url}/v1/groups/ct").status_code == 404
    assert httpx.get(f"{url}/v1/subscriptions").json() == {"subscriptions": []}
    # JSON with a charset, and a body-less heartbeat without any type, are fine
    typed = {"content-type": "application/json; charset=utf-8"}
    assert httpx.post(f"{url}/v1/groups/ct/members", content=join, headers=typed).status_code == 200


def test_bad_filters_are_refused_with_the_reason(filled: Any) -> None:
    base = f"{filled.url}/v1/topics/dc1.app/partitions/0/messages?offset=0"
    _error(httpx.get(base + "&hash_mod=0&hash_rem=0"), 400, "bad_filter")
    _error(httpx.get(base + "&hash_mod=4&hash_rem=4"), 400, "bad_filter")
    _error(httpx.get(base + "&hash_mod=4"), 400, "bad_filter")
    _error(httpx.get(base + "&hash_mod=x&hash_rem=0"), 400, "bad_filter")
    _error(httpx.get(base + "&hash_mod=4&hash_rem=1&hash_key=color"), 400, "bad_filter")
    fetch = httpx.post(
        f"{filled.url}/v1/fetch",
        json={
            "partitions": [{"topic": "dc1.app", "partition": 0, "offset": 0}],
            "filter": {"colour": "red"},
        },
    )
    _error(fetch, 400, "bad_filter")


def test_unknown_group_member_and_bad_group_requests(filled: Any) -> None:
    url = filled.url
    _error(httpx.get(f"{url}/v1/groups/nobody"), 404, "unknown_group")
    _error(
        httpx.post(f"{url}/v1/groups/nobody/members/abc/heartbeat", json={}), 404, "unknown_group"
    )
    joined = httpx.post(f"{url}/v1/groups/g/members", json={"topics": ["dc1.app"]})
    assert joined.status_code == 200
    _error(httpx.post(f"{url}/v1/groups/g/members/abc/heartbeat", json={}), 404, "unknown_member")
    # A group may name a topic that does not exist yet: it waits for it.
    waiting = httpx.post(f"{url}/v1/groups/w/members", json={"topics": ["dc1.nope"]})
    assert waiting.status_code == 200, waiting.text
    assert waiting.json()["assignment"] == []
    assert waiting.json()["missing_topics"] == ["dc1.nope"]
    _error(
        httpx.post(f"{url}/v1/groups/g/members", json={"prefix": "dc1."}),
        409,
        "subscription_conflict",
    )
    _error(httpx.post(f"{url}/v1/groups/g/members", content=b"{not json"), 400, "bad_json")
    _error(
        httpx.post(f"{url}/v1/groups/bad%20name/members", json={"topics": ["dc1.app"]}),
        400,
        "bad_request",
    )
    member = joined.json()["member_id"]
    commit = httpx.post(
        f"{url}/v1/groups/g/offsets",
        json={
            "member_id": member,
            "offsets": [{"topic": "dc1.app", "partition": 0, "offset": 10**6}],
        },
    )
    body = _error(commit, 416, "offset_out_of_range")
    assert "valid offsets" in body["reason"]


def test_read_command_with_a_topic_that_never_comes_or_a_bad_filter(
    filled: Any, start_reader: Any
) -> None:
    unknown = start_reader("--server", filled.url, "--topic", "dc1.nope", "--idle-exit", "1")
    assert unknown.wait(20) == 0  # it waited for the topic, then gave up
    assert "topic 'dc1.nope' did not appear within 1 s" in unknown.stderr()
    bad = start_reader("--server", filled.url, "--topic", "dc1.app", "--hash", "source_id:0:0")
    assert bad.wait(20) == 2
    assert "hash_mod" in bad.stderr()


def test_tokens_limit_reads_groups_and_push_to_their_topics(
    start_gateway: Any, tmp_path: Any
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[tokens.writer]\nwrite = ["*"]\n\n[tokens.web-reader]\nread = ["dc1.web-*"]\n\n'
        '[tokens.dc-reader]\nread = ["dc1.*"]\n'
    )
    gw = start_gateway(tmp_path / "data", "--config", str(config))
    writer = httpx.Client(base_url=gw.url, headers={"Authorization": "Bearer writer"})
    for log_type in ("app", "web-access"):
        line = {"log_type": log_type, "source_id": "s", "seqno": 1, "data": "x\n"}
        response = writer.post(
            "/v1/write",
            content=json.dumps(line).encode(),
            headers={"content-type": "application/x-ndjson"},
        )
        assert response.status_code == 200, response.text

    def as_(token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=gw.url, headers=headers)

    web, dc, nobody = as_("web-reader"), as_("dc-reader"), as_(None)
    read_app = "/v1/topics/dc1.app/partitions/0/messages?offset=0"
    assert nobody.get(read_app).status_code == 401
    assert web.get(read_app).status_code == 403
    assert web.get("/v1/topics/dc1.web-access/partitions/0/messages?offset=0").status_code == 200
    assert dc.get(read_app).status_code == 200
    assert [t["name"] for t in web.get("/v1/topics").json()["topics"]] == ["dc1.web-access"]
    assert web.post("/v1/groups/g/members", json={"prefix": "dc1."}).status_code == 403
    assert dc.post("/v1/groups/g/members", json={"prefix": "dc1."}).status_code == 200
    hook = {"name": "s", "endpoint": "http://127.0.0.1:9/x", "prefix": "dc1."}
    assert web.post("/v1/subscriptions", json=hook).status_code == 403
    for client in (writer, web, dc, nobody):
        client.close()


def test_topics_lists_and_describes_through_a_gateway(gateway: Any, writer_for: Any) -> None:
    import subprocess

    from tests.conftest import REPO, logbroker_cmd

    writer_for(gateway.url).write("src", [1, 2])

    def topics(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = logbroker_cmd("topics", "--server", gateway.url, *args)
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)

    listed = topics("list", "--json")
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout.splitlines()[0])
    assert doc["name"] == "dc1.app"
    assert sum(p["end_offset"] for p in doc["partitions"]) == 2
    assert topics("describe", "dc1.nope").returncode == 2
    refused = topics("delete-segments", "dc1.app", "--partition", "0", "--before-offset", "1")
    assert refused.returncode == 2
    assert "needs --data-dir" in refused.stderr


def _read_ahead_answers(url: str) -> float:
    return sample(httpx.get(f"{url}/metrics").text, "logbroker_pull_read_ahead_answers_total") or 0


def test_a_reader_catching_up_gets_its_next_answer_read_while_it_handled_the_last(
    gateway: Any, writer_for: Any
) -> None:
    writer = writer_for(gateway.url)
    writer.write("src0", list(range(1, 41)))
    client = PullClient(gateway.url)
    try:
        (part,) = [p for p in client.fetch([("dc1.app", p, 0) for p in range(4)]) if p.messages]
        everything = [(m.offset, m.text_data()) for m in part.messages]
        assert len(everything) == 40
        position = ("dc1.app", part.partition, 0)
        got = []
        fetches = 0
        before = _read_ahead_answers(gateway.url)
        while position[2] < 40:
            (answer,) = client.fetch([position], max_bytes=100)  # a few messages each
            fetches += 1
            got.extend((m.offset, m.text_data()) for m in answer.messages)
            position = ("dc1.app", part.partition, answer.next_offset)
        assert got == everything
        assert fetches > 5
        assert _read_ahead_answers(gateway.url) - before == fetches - 1  # all but the first
        # an answer for other parameters (another max_bytes) is read when asked for
        (first,) = client.fetch([("dc1.app", part.partition, 0)], max_bytes=100)
        counted = _read_ahead_answers(gateway.url)
        (other,) = client.fetch([("dc1.app", part.partition, first.next_offset)], max_bytes=300)
        assert _read_ahead_answers(gateway.url) == counted
        assert other.messages[0].offset == first.next_offset
        # an answer that reaches the end starts no read ahead
        client.fetch([("dc1.app", part.partition, 0)], max_bytes=10**6)
        (end,) = client.fetch([("dc1.app", part.partition, 40)], max_bytes=10**6)
        assert end.messages == [] and _read_ahead_answers(gateway.url) == counted
    finally:
        client.close()


def test_idle_exit_against_a_gateway_that_never_answers_exits_1(
    tmp_path: Any, start_reader: Any
) -> None:
    """Nothing read because nothing answers is a failure, not an empty topic."""
    from tests.conftest import GatewayProcess

    nobody = GatewayProcess(tmp_path / "data", [], tmp_path / "never-started.log")
    reader = start_reader("--server", nobody.url, "--topic", "dc1.app", "--idle-exit", "1")
    assert reader.wait(30) == 1
    said = reader.stderr()
    assert f"{nobody.url} listed no topics within 1 s (--idle-exit); last: " in said, said
    assert "Connect" in said.splitlines()[-1], said


def test_idle_exit_against_a_gateway_answering_503_names_its_reason(
    tmp_path: Any, start_reader: Any
) -> None:
    """A gateway whose Kafka is away answers 503 with the reason: the reader's last line says
    it, not that the gateway "did not answer"."""
    from http.server import BaseHTTPRequestHandler

    from tests.scripted_http import LoopbackServer, running, send_json

    reason = "Kafka unavailable (listing topics): Local: Broker transport failure"

    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, answer = (
                (200, {"status": "ok", "dc": "dc1", "instance": "i1", "installation": "a1"})
                if self.path == "/healthz"
                else (503, {"error": "store_unavailable", "reason": reason})
            )
            send_json(self, status, json.dumps(answer).encode())

        def log_message(self, *args: object) -> None:
            """Quiet."""

    with running(LoopbackServer(Refusing)) as gateway:
        reader = start_reader("--server", gateway.url, "--topic", "dc1.app", "--idle-exit", "1")
        assert reader.wait(30) == 1
    last = reader.stderr().strip().splitlines()[-1]
    assert "did not answer" not in last and "503" in last and reason in last, last


def test_idle_exit_after_the_gateway_went_away_exits_1(
    tmp_path: Any, start_gateway: Any, writer_for: Any, start_reader: Any
) -> None:
    gateway = start_gateway(tmp_path / "data")
    writer_for(gateway.url).write("src", [1, 2])
    reader = start_reader(
        "--server",
        gateway.url,
        "--topic",
        "dc1.app",
        "--format",
        "jsonl",
        "--from-beginning",
        "--idle-exit",
        "8",
    )
    wait_until(lambda: len(reader.records()) == 2, 30, "the lines")
    gateway.kill()
    assert reader.wait(60) == 1
    assert "was still unavailable after 8 s without new data" in reader.stderr()


@pytest.mark.parametrize("server", ["not-a-url", "ftp://127.0.0.1:1", "http://"])
def test_read_with_a_server_that_is_no_http_url_exits_2(server: str, start_reader: Any) -> None:
    reader = start_reader("--server", server, "--topic", "dc1.app", "--idle-exit", "1")
    assert reader.wait(30) == 2
    assert "is not an http:// or https:// URL" in reader.stderr()


@pytest.mark.parametrize("max_bytes", ["0", "-3", str(64 * 1024 * 1024 + 1)])
def test_read_with_a_max_bytes_out_of_range_exits_2_before_it_waits_for_the_topic(
    gateway: Any, max_bytes: str, start_reader: Any
) -> None:
    """Before, the gateway's answer to the first read said it: a topic that was not there yet
    kept the reader waiting for it, for ever without ``--idle-exit``."""
    reader = start_reader("--server", gateway.url, "--topic", "dc1.later", "--max-bytes", max_bytes)
    assert reader.wait(30) == 2
    assert "--max-bytes must be in 1..67108864" in reader.stderr()


@pytest.mark.parametrize("topic", ["../../etc/passwd", "dc1.a/b", "dc1..app", "../*", "DC1.App"])
def test_read_of_a_path_like_topic_exits_2_naming_the_rule(
    gateway: Any, topic: str, start_reader: Any
) -> None:
    reader = start_reader("--server", gateway.url, "--topic", topic, "--idle-exit", "1")
    assert reader.wait(30) == 2
    assert "invalid topic name" in reader.stderr()


def test_sigterm_stops_a_reader_whose_gateway_hangs_within_the_grace(start_reader: Any) -> None:
    """A gateway that takes the connection and never answers holds a request for its whole
    timeout (30 s); a stop is honoured within the reader's grace (5 s) all the same."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    accepting = threading.Thread(
        target=lambda: held.extend(listener.accept()[0] for _ in range(4)), daemon=True
    )
    accepting.start()
    try:
        reader = start_reader("--server", f"http://127.0.0.1:{port}", "--topic", "dc1.app")
        wait_until(lambda: bool(held), 30, "the reader's request to hang")
        time.sleep(0.5)
        stopped = time.monotonic()
        assert reader.terminate(timeout_s=30) == 0
        assert time.monotonic() - stopped < 12
        assert "did not let go within 5 s of the stop" in reader.stderr()
    finally:
        listener.close()
        for conn in held:
            conn.close()
