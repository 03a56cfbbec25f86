"""Values every reader of the log can hold and show: a create time Spark can load, and source
text without control, separator or format characters.

Each such value is refused on its own section (400 ``bad_meta``, naming it), as a seqno out
of range is: the other sections of the request are written.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest

from ingest_api.framing import BINARY_MEDIA_TYPE, NDJSON_MEDIA_TYPE, encode_binary
from log_store.errors import BadRequest
from session_dedup.source import source_meta
from tests.gateway.conftest import meta, topic_envelopes

MAX_CREATE_TIME_MS = 253_402_214_400_000
"""9999-12-31T00:00:00Z in ms: the latest create time docs/protocol.md promises to take."""


def _post(url: str, body: bytes, media: str = BINARY_MEDIA_TYPE) -> httpx.Response:
    return httpx.post(url + "/v1/write", content=body, headers={"content-type": media})


def _results(response: httpx.Response) -> dict[str, dict[str, Any]]:
    assert response.status_code == 200, response.text
    return {r["source_id"]: r for r in response.json()["results"]}


def _stored(data_dir: Any, topic: str = "dc1.app") -> dict[str, list[Any]]:
    """Per source id, the envelopes the topic holds."""
    found: dict[str, list[Any]] = {}
    for envelopes in topic_envelopes(data_dir, topic).values():
        for _, env in envelopes:
            found.setdefault(env.source_id, []).append(env)
    return found


def test_a_create_time_outside_1970_to_9999_refuses_its_section_alone(shared_gateway: Any) -> None:
    """``create_time * 1000`` of -99999999999999999 ms overflowed the loader's timestamp
    column, and one such record stopped ``logbroker load`` for the whole topic."""
    body = encode_binary(
        [
            (meta("ct-negative"), [(1, 5, b"a\n"), (2, -99_999_999_999_999_999, b"b\n")]),
            (meta("ct-past-9999"), [(1, MAX_CREATE_TIME_MS + 1, b"c\n")]),
            (meta("ct-bounds"), [(1, 0, b"d\n"), (2, MAX_CREATE_TIME_MS, b"e\n")]),
        ]
    )
    results = _results(_post(shared_gateway.url, body))
    for source, value in (("ct-negative", -99_999_999_999_999_999), ("ct-past-9999", None)):
        refused = results[source]
        assert (refused["status"], refused["error"]) == (400, "bad_meta"), refused
        shown = str(value if value is not None else MAX_CREATE_TIME_MS + 1)
        assert (
            f"create_time {shown} is not an integer of milliseconds in 0 .. " in (refused["reason"])
        )
    assert [a["status"] for a in results["ct-bounds"]["acks"]] == ["written", "written"]

    lines = [
        {"log_type": "app", "source_id": "nd-negative", "seqno": 1, "data": "x\n"},
        {"log_type": "app", "source_id": "nd-negative", "seqno": 2, "data": "y\n"}
        | {"create_time": -99_999_999_999_999_999},
        {"log_type": "app", "source_id": "nd-good", "seqno": 1, "data": "z\n", "create_time": 7},
    ]
    ndjson = b"\n".join(orjson.dumps(line) for line in lines)
    results = _results(_post(shared_gateway.url, ndjson, NDJSON_MEDIA_TYPE))
    assert (results["nd-negative"]["status"], results["nd-negative"]["error"]) == (400, "bad_meta")
    assert "line 2: create_time -99999999999999999" in results["nd-negative"]["reason"]
    assert results["nd-good"]["acks"][0]["status"] == "written"

    stored = _stored(shared_gateway.data_dir)
    assert "ct-negative" not in stored and "ct-past-9999" not in stored
    assert "nd-negative" not in stored  # its good line too: a source is refused whole
    assert [e.create_time for e in stored["ct-bounds"]] == [0, MAX_CREATE_TIME_MS]
    assert [e.create_time for e in stored["nd-good"]] == [7]


REFUSED_TEXT = {
    "server with CR LF and ESC": {"server": "a\r\nSet-Cookie: x=1\x1b[31m"},
    "server with BEL": {"server": "host\x07"},
    "server with DEL": {"server": "host\x7f"},
    "server with a right-to-left override": {"server": "host\u202e"},
    "server with a zero-width space": {"server": "ho\u200bst"},
    "file with LF": {"file": "/var/log/a\nb.log"},
    "file with ESC": {"file": "/var/log/\x1b[2Ja.log"},
    "file with C1 NEL": {"file": "/var/log/a\x85b.log"},
    "file with a line separator": {"file": "/var/log/a\u2028b.log"},
    "file with a right-to-left override": {"file": "/var/log/gol.\u202eexe"},
    "file with a left-to-right isolate": {"file": "/var/log/a\u2066b.log"},
    "source_id with a right-to-left override": {"source_id": "host:\u202e1"},
    "source_id with a byte order mark": {"source_id": "\ufeffhost:1"},
    "source_id with a tag character": {"source_id": "host:\U000e0041"},
}


@pytest.mark.parametrize("case", list(REFUSED_TEXT))
def test_control_and_format_characters_refuse_their_section_alone(
    shared_gateway: Any, case: str
) -> None:
    fields = REFUSED_TEXT[case]
    tag = re.sub(r"\W+", "-", case)
    bad = {**meta(f"bad-{tag}"), **fields}
    good = meta(f"good-{tag}")
    results = list(
        _results(
            _post(
                shared_gateway.url,
                encode_binary([(bad, [(1, 1, b"a\n")]), (good, [(1, 1, b"b\n")])]),
            )
        ).values()
    )
    refused, written = results
    assert (refused["status"], refused["error"]) == (400, "bad_meta"), refused
    name = next(iter(fields))
    char = next(c for c in fields[name] if not (c.isascii() and c.isprintable()))
    assert f"{name} must not contain " in refused["reason"]
    assert f"U+{ord(char):04X}" in refused["reason"]
    assert written["acks"][0]["status"] == "written"
    stored = _stored(shared_gateway.data_dir)
    assert bad["source_id"] not in stored and good["source_id"] in stored

    # a session of a batch is refused alone the same way
    answer = httpx.post(
        shared_gateway.url + "/v1/sessions", json={"sessions": [bad, meta(f"session-{tag}")]}
    )
    assert answer.status_code == 200, answer.text
    session_refused, opened = answer.json()["sessions"]
    assert (session_refused["status"], session_refused["error"]) == (400, "bad_meta")
    assert opened["last_seqno"] == 0


def test_names_real_files_hold_are_taken(shared_gateway: Any) -> None:
    """A file name is what it is: the zero-width non-joiner of Persian words, the joiner of
    emoji sequences, accents and astral characters are taken."""
    fields = {
        "file": "/var/log/\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 "
        "\U0001f468\u200d\U0001f4bb é.log",
        "server": "hôte-\U0001f600",
        "source_id": "hôte:1:2:ab",
    }
    results = _results(
        _post(shared_gateway.url, encode_binary([({**meta("x"), **fields}, [(1, 1, b"a\n")])]))
    )
    assert results["hôte:1:2:ab"]["acks"][0]["status"] == "written"
    (env,) = _stored(shared_gateway.data_dir)["hôte:1:2:ab"]
    assert (env.file, env.server) == (fields["file"], fields["server"])


@pytest.mark.parametrize(
    ("name", "value"),
    [("server", "a\x1b[31m"), ("server", "h\x85"), ("file", "a\u202eb"), ("file", "a\x7fb")],
)
def test_legacy_store_refuses_the_same_characters(
    shared_gateway: Any, name: str, value: str
) -> None:
    response = httpx.post(
        shared_gateway.url + "/store",
        params={"log_type": "legacy", name: value},
        content=b"line\n",
    )
    assert response.status_code == 400, response.text
    assert f"U+{ord(next(c for c in value if not c.isalpha())):04X}" in response.json()["reason"]


def test_the_api_description_says_which_characters_each_field_refuses(
    shared_gateway: Any,
) -> None:
    """The patterns of ``/openapi.json`` match exactly the values the gateway takes (tools
    that generate requests from them, a fuzzer among them, send nothing it refuses)."""
    doc = httpx.get(shared_gateway.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    props = schemas["SessionRequest"]["properties"]
    samples = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c % 7 == 0]
    samples += [chr(c) for c in (0xAD, 0x85, 0x2028, 0x202E, 0x2066, 0x200C, 0xFEFF, 0xE0041)]
    for name in ("source_id", "server", "file"):
        pattern = re.compile(props[name]["pattern"])
        for char in samples:
            fields = {"source_id": "s", name: f"a{char}b"}
            try:
                source_meta(log_type="app", **fields)
                taken = True
            except BadRequest:
                taken = False
            assert bool(pattern.fullmatch(fields[name])) == taken, (name, hex(ord(char)))
    create_time = schemas["ChunkLine"]["properties"]["create_time"]
    assert (create_time["minimum"], create_time["maximum"]) == (0, MAX_CREATE_TIME_MS)
