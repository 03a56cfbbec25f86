"""The rt write protocol against a real gateway: sessions, acks, duplicates, gaps, envelopes."""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import orjson

from ingest_api.framing import encode_binary
from tests.conftest import logbroker_cmd
from tests.gateway.conftest import chunk_data, meta, source_seqnos, topic_envelopes
from tests.metrics_text import sample


def test_new_source_session_answers_topic_partition_and_zero(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    session = client.session("h1:/var/log/a.log")
    assert session["topic"] == "dc1.app"
    assert 0 <= session["partition"] < 4
    assert session["last_seqno"] == 0


def test_written_chunks_are_acked_with_consecutive_offsets_and_enveloped(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    acks = client.acks("src-a", [10, 20, 30])
    assert [a["status"] for a in acks] == ["written"] * 3
    assert [a["offset"] for a in acks] == [0, 1, 2]
    assert client.session("src-a")["last_seqno"] == 30
    partition = client.session("src-a")["partition"]
    records = topic_envelopes(gateway.data_dir, "dc1.app")[partition]
    envelopes = [env for _, env in records]
    assert [e.seqno for e in envelopes] == [10, 20, 30]
    assert envelopes[0].data == chunk_data(10)
    assert (envelopes[0].source_id, envelopes[0].server, envelopes[0].file) == (
        "src-a",
        "host1",
        "/f",
    )
    assert envelopes[0].log_type == "app" and envelopes[0].codec == "raw"
    assert envelopes[0].write_time > 0


def test_duplicate_seqno_is_acked_and_not_written(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    client.acks("src-d", [1, 2, 3])
    acks = client.acks("src-d", [2, 3, 4])
    assert [a["status"] for a in acks] == ["duplicate", "duplicate", "written"]
    assert "offset" not in acks[0]
    assert source_seqnos(gateway.data_dir, "dc1.app", "src-d")[1] == [1, 2, 3, 4]


def test_stale_seqno_below_the_last_is_a_duplicate_even_if_never_written(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    client.acks("src-s", [100])
    acks = client.acks("src-s", [50, 99, 100, 101])
    assert [a["status"] for a in acks] == ["duplicate", "duplicate", "duplicate", "written"]
    assert source_seqnos(gateway.data_dir, "dc1.app", "src-s")[1] == [100, 101]


def test_seqno_gaps_are_allowed_and_a_chunk_reordered_in_its_request_is_out_of_order(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    # 7 came after 1000 in the request: it was never written, so it is not a duplicate
    acks = client.acks("src-g", [5, 1000, 7, 2**63 - 1])
    assert [a["status"] for a in acks] == ["written", "written", "out_of_order", "written"]
    assert client.session("src-g")["last_seqno"] == 2**63 - 1
    assert source_seqnos(gateway.data_dir, "dc1.app", "src-g")[1] == [5, 1000, 2**63 - 1]


def test_a_section_that_skips_ahead_of_the_log_is_out_of_order_with_where_the_log_ends(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    client.acks("src-gap", [10])
    # the client says 20 precedes these chunks, but the log ends at 10: a gap, not a resend
    gap = client.post_binary(
        encode_binary([({**meta("src-gap"), "prev_seqno": 20}, [(30, 0, b"x\n")])])
    ).json()["results"][0]
    assert [a["status"] for a in gap["acks"]] == ["out_of_order"]
    assert gap["last_seqno"] == 10
    # resent after what precedes it: a duplicate is then certain to be in the log
    chain = {**meta("src-gap"), "prev_seqno": 10}
    body = encode_binary([(chain, [(20, 0, b"y\n"), (30, 0, b"x\n")])])
    assert [a["status"] for a in client.post_binary(body).json()["results"][0]["acks"]] == [
        "written",
        "written",
    ]
    again = client.post_binary(body).json()["results"][0]
    assert [a["status"] for a in again["acks"]] == ["duplicate", "duplicate"]
    assert source_seqnos(gateway.data_dir, "dc1.app", "src-gap")[1] == [10, 20, 30]


def test_one_request_carries_many_sources_answered_in_request_order(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    sources = [f"multi-{i}" for i in range(20)]
    body = encode_binary(
        [
            (meta(s, "web"), [(seq, 1700000000000, chunk_data(seq)) for seq in (1, 2)])
            for s in sources
        ]
    )
    response = client.post_binary(body)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["source_id"] for r in results] == sources
    assert all(r["topic"] == "dc1.web" and r["last_seqno"] == 2 for r in results)
    for source in sources:
        partitions, seqnos = source_seqnos(gateway.data_dir, "dc1.web", source)
        assert seqnos == [1, 2] and len(partitions) == 1
    envelopes = topic_envelopes(gateway.data_dir, "dc1.web")
    assert {env.create_time for recs in envelopes.values() for _, env in recs} == {1700000000000}


def test_ndjson_text_and_base64_chunks_are_written(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    raw = bytes(range(256))
    lines = [
        {"log_type": "bin", "source_id": "nd", "seqno": 1, "data": "text line\n"},
        {
            "log_type": "bin",
            "source_id": "nd",
            "seqno": 2,
            "data_b64": base64.b64encode(raw).decode(),
            "create_time": 42,
            "codec": "raw",
        },
    ]
    body = b"\n".join(orjson.dumps(line) for line in lines) + b"\n"
    response = client.post_ndjson(body)
    assert response.status_code == 200, response.text
    assert [a["status"] for a in response.json()["results"][0]["acks"]] == ["written"] * 2
    (records,) = [r for r in topic_envelopes(gateway.data_dir, "dc1.bin").values() if r]
    assert [env.data for _, env in records] == [b"text line\n", raw]
    assert records[1][1].create_time == 42


def test_batch_session_open_answers_in_request_order(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    client.acks("b-1", [7])
    client.acks("b-3", [9], log_type="other")
    items = [meta("b-1"), meta("b-2"), meta("b-3", "other")]
    response = client.http.post("/v1/sessions", json={"sessions": items})
    assert response.status_code == 200, response.text
    sessions = response.json()["sessions"]
    assert [(s["source_id"], s["topic"], s["last_seqno"]) for s in sessions] == [
        ("b-1", "dc1.app", 7),
        ("b-2", "dc1.app", 0),
        ("b-3", "dc1.other", 9),
    ]


def test_a_source_stays_in_its_pinned_partition_across_requests(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    for start in range(1, 50, 7):
        client.acks("pinned", list(range(start, start + 7)))
    partitions, seqnos = source_seqnos(gateway.data_dir, "dc1.app", "pinned")
    assert partitions == {client.session("pinned")["partition"]}
    assert seqnos == list(range(1, 50))


def test_health_metrics_and_openapi_are_served(gateway: Any, client_for: Any) -> None:
    client = client_for(gateway.url)
    client.acks("m-1", [1, 2])
    client.acks("m-1", [2])
    assert client.http.get("/healthz").json()["status"] == "ok"
    metrics = client.http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert sample(text, "logbroker_chunks_total", topic="dc1.app", status="written") == 2
    assert sample(text, "logbroker_chunks_total", topic="dc1.app", status="duplicate") == 1
    assert sample(text, "logbroker_ack_latency_seconds_count") == 2
    assert sample(text, "logbroker_open_sessions") == 1
    requests = sample(text, "logbroker_http_requests_total", endpoint="write_chunks", status="200")
    assert requests == 2
    doc = client.http.get("/openapi.json").json()
    assert {"/v1/sessions", "/v1/write", "/healthz", "/metrics"} <= set(doc["paths"])


def test_a_fencing_session_refuses_the_older_writers_late_request(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    first = client.http.post("/v1/sessions", json={**meta("fenced"), "fence": True}).json()
    assert (first["epoch"], first["last_seqno"]) == (1, 0)
    old_writer = {**meta("fenced"), "epoch": 1}
    ok = client.post_binary(encode_binary([(old_writer, [(10, 0, b"a\n"), (20, 0, b"b\n")])]))
    assert [a["status"] for a in ok.json()["results"][0]["acks"]] == ["written", "written"]
    assert ok.json()["results"][0]["epoch"] == 1

    # the writer restarts: its new incarnation fences before resuming from last_seqno
    second = client.http.post("/v1/sessions", json={**meta("fenced"), "fence": True}).json()
    assert (second["epoch"], second["last_seqno"]) == (2, 20)
    # a request of the old incarnation that was still in flight arrives now: refused
    late = client.post_binary(encode_binary([(old_writer, [(25, 0, b"c\n"), (30, 0, b"d\n")])]))
    assert late.status_code == 200
    result = late.json()["results"][0]
    assert [a["status"] for a in result["acks"]] == ["fenced", "fenced"]
    assert (result["epoch"], result["last_seqno"]) == (2, 20)
    new_writer = {**meta("fenced"), "epoch": 2}
    resumed = client.post_binary(encode_binary([(new_writer, [(24, 0, b"c2\n")])]))
    assert resumed.json()["results"][0]["acks"][0]["status"] == "written"
    assert source_seqnos(gateway.data_dir, "dc1.app", "fenced")[1] == [10, 20, 24]
    # writes without an epoch are not fenced (the sessionless form stays as it was)
    assert client.acks("fenced", [40])[0]["status"] == "written"
    plain = client.http.post("/v1/sessions", json=meta("fenced")).json()
    assert (plain["epoch"], plain["last_seqno"]) == (2, 40)


def test_prev_seqno_refuses_a_request_that_overtook_its_predecessor(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    client.acks("piped", [1, 2])
    # the second of two pipelined requests arrives first: it says what must precede it
    overtaking = {**meta("piped"), "prev_seqno": 4}
    early = client.post_binary(encode_binary([(overtaking, [(5, 0, b"e\n"), (6, 0, b"f\n")])]))
    assert [a["status"] for a in early.json()["results"][0]["acks"]] == ["out_of_order"] * 2
    previous = {**meta("piped"), "prev_seqno": 2}
    assert (
        client.post_binary(encode_binary([(previous, [(3, 0, b"c"), (4, 0, b"d")])])).status_code
        == 200
    )
    again = client.post_binary(encode_binary([(overtaking, [(5, 0, b"e\n"), (6, 0, b"f\n")])]))
    assert [a["status"] for a in again.json()["results"][0]["acks"]] == ["written"] * 2
    assert source_seqnos(gateway.data_dir, "dc1.app", "piped")[1] == [1, 2, 3, 4, 5, 6]
    text = client.http.get("/metrics").text
    assert sample(text, "logbroker_chunks_total", topic="dc1.app", status="out_of_order") == 2


def test_a_section_failing_validation_is_refused_alone_in_both_framings(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    body = encode_binary(
        [
            (meta("good"), [(1, 0, b"a\n")]),
            (meta("bad", "Not A Log Type"), [(1, 0, b"b\n")]),
            (meta("zero"), [(0, 0, b"c\n")]),
        ]
    )
    results = client.post_binary(body).json()["results"]
    assert results[0]["acks"][0]["status"] == "written"
    assert [(r["source_id"], r["status"], r["error"]) for r in results[1:]] == [
        ("bad", 400, "bad_meta"),
        ("zero", 400, "bad_seqno"),
    ]
    lines = [
        {**meta("nd-good"), "seqno": 1, "data": "x\n"},
        {**meta("nd-bad"), "seqno": 1, "data_b64": "not base64!"},
        {**meta("nd-bad"), "seqno": 2, "data": "y\n"},
    ]
    answer = client.post_ndjson(b"\n".join(orjson.dumps(line) for line in lines))
    nd = answer.json()["results"]
    assert nd[0]["acks"][0]["status"] == "written"
    # the source of a refused line is refused whole: its later line would leave a gap
    assert [r.get("error") for r in nd[1:]] == ["bad_framing", "bad_framing"]
    assert source_seqnos(gateway.data_dir, "dc1.app", "nd-bad")[1] == []
    # nothing of the request can be written: a 4xx for the request as a whole, as before
    alone = client.post_binary(encode_binary([(meta("bad", "Bad!"), [(1, 0, b"b\n")])]))
    assert (alone.status_code, alone.json()["error"]) == (400, "bad_meta")


def test_a_session_acked_elsewhere_writes_a_handover_that_readers_skip(
    gateway: Any, client_for: Any
) -> None:
    client = client_for(gateway.url)
    client.acks("moved", [100])
    # the source's data up to 300 was acknowledged by another installation
    asked = {**meta("moved"), "fence": True, "acked_elsewhere": 300}
    session = client.http.post("/v1/sessions", json=asked).json()
    assert (session["last_seqno"], session["epoch"]) == (300, 1)
    # asking again (a retry) writes nothing more; a lower position never moves it back
    again = client.http.post("/v1/sessions", json={**meta("moved"), "acked_elsewhere": 200})
    assert again.json()["last_seqno"] == 300
    follow = {**meta("moved"), "epoch": 1, "prev_seqno": 300}
    acks = client.post_binary(encode_binary([(follow, [(400, 0, b"z\n")])])).json()
    assert acks["results"][0]["acks"][0]["status"] == "written"
    records = [
        env
        for part in topic_envelopes(gateway.data_dir, "dc1.app").values()
        for _, env in part
        if env.source_id == "moved"
    ]
    assert [(e.kind, e.seqno) for e in records] == [
        ("chunk", 100),
        ("handover", 300),
        ("chunk", 400),
    ]
    assert orjson.loads(records[1].data) == {"previous_seqno": 100}
    partition = session["partition"]
    read = client.http.get(f"/v1/topics/dc1.app/partitions/{partition}/messages?offset=0")
    assert [m["seqno"] for m in read.json()["messages"]] == [100, 400]
    audit = subprocess.run(
        logbroker_cmd("audit", "--data-dir", str(gateway.data_dir)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert audit.returncode == 0, audit.stdout
