"""A request of many new sources is decided in bulk (one pin step, one transaction, one source
count), yet each section keeps its own answer, and the pins made for it outlive a SIGKILL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest_api.framing import encode_binary
from log_store import open_store
from log_store.errors import BadRequest
from session_dedup.pinning import decode_pin, pin_key
from session_dedup.source import source_meta, usual_source_meta
from tests.conftest import GatewayProcess
from tests.gateway.conftest import Client, chunk_data, meta, topic_envelopes

CONFIG = """
partitions = 1
[limits]
max_sources_per_partition = 6
"""


def _section(source: str, seqnos: list[int], **conditions: int) -> tuple[dict[str, Any], Any]:
    return {**meta(source), **conditions}, [(s, 0, chunk_data(s)) for s in seqnos]


def _records_per_source(data_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """(partition, seqno) of every record of ``dc1.app``, per source."""
    found: dict[str, list[tuple[int, int]]] = {}
    for partition, records in topic_envelopes(data_dir, "dc1.app").items():
        for _, envelope in records:
            found.setdefault(envelope.source_id, []).append((partition, envelope.seqno))
    return found


def test_one_request_answers_each_section_on_its_own_when_some_are_refused(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    gateway = GatewayProcess(tmp_path / "data", ["--config", str(config)], tmp_path / "gw.log")
    gateway.start()
    client = Client(gateway.url)
    try:
        assert [a["status"] for a in client.acks("old", [1, 2])] == ["written"] * 2
        assert [a["status"] for a in client.acks("gap", [1])] == ["written"]
        fence = client.http.post("/v1/sessions", json={**meta("fenced"), "fence": True})
        assert fence.status_code == 200 and fence.json()["epoch"] == 1
        # 3 sources now; the limit is 6: "multi" and two of the five new ones still fit
        new = [f"new-{i}" for i in range(5)]
        body = encode_binary(
            [
                _section("old", [2, 3]),
                _section("fenced", [1], epoch=0),
                _section("gap", [6], prev_seqno=5),
                ({**meta("bad\x01"), "source_id": "bad\x01"}, [(1, 0, b"x\n")]),
                _section("multi", [2, 1, 3]),
                *(_section(source, [1]) for source in new),
            ]
        )
        response = client.post_binary(body)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        statuses = [[a["status"] for a in r.get("acks", [])] for r in results]
        assert statuses[:3] == [["duplicate", "written"], ["fenced"], ["out_of_order"]]
        assert results[0]["last_seqno"] == 3
        assert (results[1]["epoch"], results[2]["last_seqno"]) == (1, 1)
        assert (results[3]["status"], results[3]["error"]) == (400, "bad_meta")
        assert statuses[4] == ["written", "out_of_order", "written"]
        assert statuses[5:7] == [["written"], ["written"]]
        for refused in results[7:]:
            assert "acks" not in refused
            assert (refused["status"], refused["error"]) == (429, "limit_reached")
            assert (refused["limit"], refused["max"]) == ("max_sources_per_partition", 6)
        # written ones have consecutive offsets in request order
        offsets = [a["offset"] for r in results for a in r.get("acks", []) if "offset" in a]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        # a known source still writes; a refused one is still refused
        assert [a["status"] for a in client.acks("old", [4])] == ["written"]
        again = client.write("new-4", [1]).json()["results"][0]
        assert again["error"] == "limit_reached"
    finally:
        client.close()
        gateway.kill()
    records = _records_per_source(tmp_path / "data")
    assert records["old"] == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert records["multi"] == [(0, 2), (0, 3)]
    assert records["new-0"] == records["new-1"] == [(0, 1)]
    assert not {"fenced", "new-2", "new-3", "new-4"} & records.keys()
    assert records["gap"] == [(0, 1)]


@pytest.mark.fault
def test_pins_of_a_requests_new_sources_outlive_a_sigkill_after_their_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL once the data of a request of new sources is in its segment, before the ack
    (and anything after the data): restarted on a topic grown to 8 partitions, the resent
    request still goes to partition 0, and each source is in the log once."""
    data_dir = tmp_path / "data"
    sources = [f"host{i}:/var/log/app.log" for i in range(300)]
    body = encode_binary([(meta(s), [(1, 0, chunk_data(1))]) for s in sources])
    monkeypatch.setenv("LOGBROKER_STORE_CRASH_AT", "after-segment-write")
    first = GatewayProcess(data_dir, ["--partitions", "1"], tmp_path / "first.log").start()
    monkeypatch.delenv("LOGBROKER_STORE_CRASH_AT")
    try:
        with pytest.raises(httpx.TransportError):
            Client(first.url).post_binary(body)
        assert first.proc is not None and first.proc.wait(60) == -9
    finally:
        first.kill()
    store = open_store(data_dir)
    try:
        topic_id = store.describe_topic("dc1.app").topic_id
        store.set_partitions("dc1.app", 8)
        pins = store.get_topic_state_many("dc1.app", [pin_key(topic_id, s) for s in sources])
    finally:
        store.close()
    assert all(pin is not None and decode_pin(pin) == 0 for pin in pins.values())
    second = GatewayProcess(data_dir, ["--partitions", "1"], tmp_path / "second.log").start()
    client = Client(second.url)
    try:
        response = client.post_binary(body)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
    finally:
        client.close()
        second.kill()
    assert {r["partition"] for r in results} == {0}
    assert {r["acks"][0]["status"] for r in results} <= {"written", "duplicate"}
    records = _records_per_source(data_dir)
    assert {s: records.get(s) for s in sources} == {s: [(0, 1)] for s in sources}


@pytest.mark.parametrize(
    "fields",
    [
        {"source_id": "host:/var/log/a.log", "server": "host", "file": "/var/log/a.log"},
        {"source_id": "a b", "codec": "zstd"},
        {"source_id": " "},
        {"source_id": "tab\there"},
        {"source_id": "del\x7f"},
        {"source_id": "c1\x85"},
        {"source_id": "née"},
        {"source_id": ""},
        {"source_id": "x" * 513},
        {"source_id": "x" * 512, "server": "s" * 4097},
        {"source_id": "x", "file": "nul\x00"},
        {"source_id": "x", "server": None},
        {"source_id": 7},
        {"source_id": "x", "codec": "lz4"},
        {"source_id": "x", "codec": ["raw"]},
        {"source_id": "x", "log_type": ["app"]},
        {"source_id": "x", "log_type": "Bad..Type"},
        {"source_id": "x", "extra": "field"},
    ],
)
def test_the_usual_meta_check_accepts_only_what_the_full_check_accepts(
    fields: dict[str, Any],
) -> None:
    obj = {"log_type": "app", **fields}
    source_meta(log_type="app", source_id="seen")  # "app" is a log type seen valid before
    usual = usual_source_meta(obj)
    try:  # the full check, as meta_from_json made it before the usual path existed
        if not obj.keys() <= {"log_type", "source_id", "server", "file", "codec"}:
            raise BadRequest("unknown meta fields")
        if None in obj.values():
            raise BadRequest("null")
        full = source_meta(**obj)
    except BadRequest:
        assert usual is None
    else:
        assert usual is None or usual == full
    if fields.get("codec") != ["raw"] and str(fields["source_id"]).startswith("host:"):
        assert usual is not None  # the usual section takes the usual path
