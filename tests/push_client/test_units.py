"""The parts of the push-client that need no gateway: chunking, identity, state, config, wire."""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import re
import struct
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from push_client.backoff import Backoff
from push_client.codec import compress
from push_client.config import ConfigError, Entry, PushConfig, build_config
from push_client.handover import Doubt, SourceHandover, Step
from push_client.identity import FileIdentity, make_source_id, read_fingerprint
from push_client.installations import InstallationSpec, parse_servers
from push_client.rotation import rotated_dirs, rotated_from
from push_client.shipper import encoded_for
from push_client.state_file import (
    CorruptStateFile,
    PushState,
    SourcePosition,
    StateFile,
    decode_state,
    encode_state,
)
from push_client.tailer import Chunk, PathError, TailedFile
from push_client.token import BearerToken
from push_client.wire import SourceMeta, WireChunk, encode_write_body
from tests.conftest import REPO, logbroker_cmd


def _tailed(path: Path, entry: Entry | None = None, chunk_bytes: int = 4096) -> TailedFile:
    fd = os.open(path, os.O_RDONLY)
    fingerprint = read_fingerprint(fd, final=True) or "empty"
    st = os.fstat(fd)
    tailed = TailedFile(
        entry=entry or Entry(str(path), "app"),
        fd=fd,
        path=str(path),
        first_path=str(path),
        identity=FileIdentity(st.st_dev, st.st_ino, fingerprint),
        generation=0,
        source_id="s",
        host="h",
        chunk_bytes=chunk_bytes,
        max_line_bytes=64 * 1024,
        multiline_timeout_s=0.5,
    )
    tailed.resume_at(0)
    return tailed


def _data(tailed: TailedFile) -> list[bytes]:
    return [bytes(c.data) for c in tailed.pending]


def test_chunks_end_at_line_boundaries_and_seqno_is_the_end_offset(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    lines = [f"line {i} {'x' * (i % 50)}\n".encode() for i in range(2_000)]
    path.write_bytes(b"".join(lines))
    tailed = _tailed(path)
    tailed.read(1 << 30, now=0.0)
    chunks = list(tailed.pending)
    assert b"".join(_data(tailed)) == b"".join(lines)
    for chunk in chunks:
        assert bytes(chunk.data).endswith(b"\n") and len(chunk.data) <= 4096
        assert chunk.seqno == chunk.start + len(chunk.data)
    assert chunks[-1].seqno == path.stat().st_size
    tailed.close()


def test_an_incomplete_last_line_is_held_until_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"one\ntwo\nthr")
    tailed = _tailed(path)
    tailed.read(1 << 20, now=0.0)
    assert _data(tailed) == [b"one\ntwo\n"]
    assert tailed.read(1 << 20, now=1.0) == 0
    with open(path, "ab") as f:
        f.write(b"ee\n")
    tailed.read(1 << 20, now=2.0)
    assert _data(tailed) == [b"one\ntwo\n", b"three\n"]
    tailed.close()


def test_final_read_sends_a_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"one\ntail")
    tailed = _tailed(path)
    tailed.read(1 << 20, now=0.0, final=True)
    assert _data(tailed) == [b"one\ntail"]
    tailed.close()


def test_a_line_longer_than_a_chunk_travels_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    long_line = b"L" * 10_000 + b"\n"
    path.write_bytes(b"short\n" + long_line + b"after\n")
    tailed = _tailed(path)
    tailed.read(1 << 20, now=0.0)
    assert b"".join(_data(tailed)) == b"short\n" + long_line + b"after\n"
    assert long_line in _data(tailed)[1]
    tailed.close()


def test_multiline_holds_the_last_record_until_the_next_one_starts_or_time_passes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"2026 a\n  more a\n2026 b\n  more b\n")
    tailed = _tailed(path, Entry(str(path), "app", multiline=r"\d{4} "))
    tailed.read(1 << 20, now=0.0)
    assert _data(tailed) == [b"2026 a\n  more a\n"]
    tailed.read(1 << 20, now=0.1)
    assert len(tailed.pending) == 1, "record b may still grow"
    tailed.read(1 << 20, now=0.7)
    assert _data(tailed) == [b"2026 a\n  more a\n", b"2026 b\n  more b\n"]
    tailed.close()


def test_fingerprint_is_the_first_line_and_waits_for_it(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_bytes(b"first li")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_fingerprint(fd) is None
        with open(path, "ab") as f:
            f.write(b"ne\nsecond\n")
        complete = read_fingerprint(fd)
        with open(path, "ab") as f:
            f.write(b"third\n" * 100)
        assert read_fingerprint(fd) == complete
    finally:
        os.close(fd)


def test_source_id_leaves_the_path_out_and_fits_the_protocol() -> None:
    identity = FileIdentity(1, 2, "ab")
    # a file renamed by rotation keeps its id: the path is not part of it
    assert make_source_id("h", identity) == "h:1:2:ab"
    assert make_source_id("h", identity, 3) == "h:1:2:ab#g3"
    odd = make_source_id("h\nx\udcff", identity)
    assert "\n" not in odd and odd.isprintable()
    long = make_source_id("h" * 600, identity)
    assert len(long.encode()) <= 512 and long.endswith(":1:2:ab")


def _state() -> PushState:
    pos = SourcePosition("s", "/l/*", "/l/a", "/l/a", 1, 2, "fp", 0, "app", "raw", 42)
    return PushState({"s": pos}, [])


def test_state_round_trips_and_damage_is_detected(tmp_path: Path) -> None:
    raw = encode_state(_state())
    assert decode_state(raw).sources["s"].acked == 42
    for damaged in (b"", raw[: len(raw) // 2], raw.replace(b"42", b"43"), b"\x00" * 100):
        with pytest.raises(CorruptStateFile):
            decode_state(damaged)


def test_corrupt_state_file_is_moved_aside_and_an_empty_state_used(tmp_path: Path) -> None:
    state_file = StateFile(tmp_path)
    state_file.save(_state())
    assert state_file.load().sources["s"].acked == 42
    state_file.path.write_bytes(state_file.path.read_bytes()[:-20])
    assert state_file.load().sources == {}
    assert state_file.corruptions == 1
    assert len(list(tmp_path.glob("state.json.corrupt-*"))) == 1
    assert not list(tmp_path.glob("*.tmp"))


def _signed(payload: object) -> bytes:
    """A state file with ``payload`` and a checksum that matches it (written by a bug or by
    hand, not torn): only its contents can tell it is wrong."""
    body = orjson.dumps(payload)
    return body + b"\nsha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _payload(**source_fields: object) -> dict[str, object]:
    payload = orjson.loads(_state().to_json())
    payload["sources"][0].update(source_fields)
    payload["retired"] = [
        {"source_id": "r", "dev": 1, "ino": 3, "fingerprint": "fp", "generation": 0,
         "reason": "rotated", "retired_at": 1.0e9, "size": 10, "path": "/l/b", "acked": 10}
    ]  # fmt: skip
    return payload


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (_payload(acked="42"), "sources[0].acked must be a non-negative integer, not '42'"),
        (_payload(acked=-1), "sources[0].acked must be a non-negative integer, not -1"),
        (_payload(acked=42.5), "sources[0].acked must be a non-negative integer, not 42.5"),
        (_payload(acked=True), "sources[0].acked must be a non-negative integer, not True"),
        (_payload(generation=1.0), "sources[0].generation must be a non-negative integer"),
        (_payload(path=["/l/a"]), "sources[0].path must be a string, not ['/l/a']"),
        (_payload(draining="no"), "sources[0].draining must be true or false"),
        (_payload(pending_since="now"), "sources[0].pending_since must be a number of seconds"),
        (_payload(doubts=[["dc2", 50, 10]]), "sources[0].doubts must be a list of"),
        (_payload(doubts={"dc2": [0, 10]}), "sources[0].doubts must be a list of"),
        ({**_payload(), "sources": {"s": {}}}, "sources must be a list of records"),
        ({**_payload(), "sources": [["s", 42]]}, "sources[0] must be a record, not ['s', 42]"),
        ({**_payload(), "clean": "false"}, "clean must be true or false, not 'false'"),
        (
            {**_payload(), "retired": [{"source_id": "r"}]},
            "retired[0] lacks dev, fingerprint, generation, ino, reason, retired_at",
        ),
        (_payload(surplus=1), "sources[0] has an unknown field 'surplus'"),
    ],
)
def test_a_state_file_with_a_field_of_the_wrong_type_is_corrupt_and_named(
    tmp_path: Path, payload: dict[str, object], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Such a file matched its checksum and was taken: an offset that is a string crashed
    the loop at its first comparison, a float seqno went on the wire, ``"clean": "false"``
    read as true.  It is corrupt like a torn file: set aside, and the gateways' last seqnos
    (the lost-state path, exactly-once) are used instead."""
    assert decode_state(_signed(_payload())).sources["s"].acked == 42
    with pytest.raises(CorruptStateFile, match=re.escape(named)):
        decode_state(_signed(payload))
    state_file = StateFile(tmp_path)
    state_file.path.write_bytes(_signed(payload))
    with caplog.at_level(logging.WARNING, logger="logbroker.push"):
        assert state_file.load().sources == {}
    assert state_file.corruptions == 1 and not state_file.found
    assert len(list(tmp_path.glob("state.json.corrupt-*"))) == 1
    assert f"state file {state_file.path} is corrupt" in caplog.text
    assert named in caplog.text


def test_write_body_follows_the_binary_framing() -> None:
    meta = SourceMeta("app", "src", "h", "/f", "raw")
    body = encode_write_body(
        [(meta.encoded(), [WireChunk(7, 11, b"a\n"), WireChunk(9, 12, b"b\n")])]
    )
    assert body[:4] == b"LBW1"
    (meta_len,) = struct.unpack_from(">H", body, 4)
    assert orjson.loads(body[6 : 6 + meta_len]) == meta.as_dict()
    pos = 6 + meta_len
    assert struct.unpack_from(">I", body, pos) == (2,)
    assert struct.unpack_from(">QqI", body, pos + 4) == (7, 11, 2)
    assert body[pos + 24 : pos + 26] == b"a\n"
    assert len(body) == pos + 4 + 2 * (20 + 2)


def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0)
    delays = [backoff.next_delay() for _ in range(8)]
    assert 0.05 <= delays[0] <= 0.1
    assert 0.1 <= delays[1] <= 0.2
    assert all(d <= 1.0 for d in delays) and delays[-1] >= 0.5
    assert backoff.next_delay(at_least_s=3.0) == 3.0


def test_config_file_is_validated_with_clear_messages(tmp_path: Path) -> None:
    config = tmp_path / "push.toml"
    config.write_text('[push]\nservers = ["http://gw:1"]\nstate_dir = "/s"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="unknown keys"):
        build_config(file=config)
    config.write_text(
        '[push]\nservers = ["http://gw:1"]\nstate_dir = "/s"\n[[entry]]\npath = "/a"\n'
    )
    with pytest.raises(ConfigError, match="log_type"):
        build_config(file=config)
    config.write_text(
        '[push]\nservers = ["http://gw:1"]\nstate_dir = "/s"\nlinger_ms = 20\n'
        '[[entry]]\npath = "/a/*.log"\nlog_type = "web"\ncodec = "zstd"\n'
    )
    built = build_config(file=config, servers=["http://gw:2,http://gw:3"])
    assert built.servers == ("http://gw:2", "http://gw:3")
    assert built.linger_ms == 20 and built.entries[0].codec == "zstd"
    config.write_text("not = [toml")
    with pytest.raises(ConfigError, match="TOML"):
        build_config(file=config)
    config.write_bytes(b'[push]\nhost = "caf\xe9"\n')  # Latin-1: TOML is UTF-8
    with pytest.raises(ConfigError, match="TOML"):
        build_config(file=config)


def test_an_entry_names_its_olddir_as_one_directory_or_several(tmp_path: Path) -> None:
    config = tmp_path / "push.toml"
    config.write_text(
        _GOOD_PUSH + '[[entry]]\npath = "/a/*.log"\nlog_type = "web"\nolddir = "old"\n'
        '[[entry]]\npath = "/b/*.log"\nlog_type = "db"\nolddir = ["old", "/archive/*"]\n'
    )
    built = build_config(file=config)
    assert built.entries[0].olddir == ("old",)
    assert built.entries[1].olddir == ("old", "/archive/*")


@pytest.mark.parametrize(
    ("name", "original"),
    [
        ("app.log.1", "app.log"),
        ("app.log.0", "app.log"),  # logrotate's start 0
        ("app.log-20261127", "app.log"),
        ("app.log.1.gz", "app.log"),
        ("app.1.log", "app.log"),  # logrotate's extension .log
        ("app.0.log", "app.log"),
        ("app-2026112703.log", "app.log"),  # extension with dateext
        ("app.1.log.gz", "app.log"),  # extension with compress
        ("messages.3", "messages"),
        ("app.log", None),
        ("app-worker.log", None),
        ("app.log.bak", None),
        ("app.1", None),
        ("app.1.gz", None),
        ("other.1.log", None),
    ],
)
def test_rotated_names_of_logrotates_layouts_are_told(name: str, original: str | None) -> None:
    assert rotated_from(name, {"app.log", "messages"}) == original


def test_rotated_dirs_are_the_logs_own_then_its_olddirs_that_exist(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "old").mkdir(parents=True)
    (tmp_path / "archive" / "2026").mkdir(parents=True)
    (tmp_path / "archive" / "2025").mkdir(parents=True)
    olddirs = ("old", "missing", str(tmp_path / "archive" / "*"))
    assert rotated_dirs(str(logs), olddirs) == [
        str(logs),
        str(logs / "old"),
        str(tmp_path / "archive" / "2025"),
        str(tmp_path / "archive" / "2026"),
    ]


def test_progress_bar_shows_while_a_backlog_is_caught_up_and_then_clears() -> None:
    import io

    from push_client.progress import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(out)
    bar.update(acked_bytes=0, backlog_bytes=1_000)
    assert out.getvalue() == "", "no bar for a small lag"
    bar.update(acked_bytes=0, backlog_bytes=100_000_000)
    bar.update(acked_bytes=50_000_000, backlog_bytes=50_000_000)
    assert "50.0%" in out.getvalue()
    bar.update(acked_bytes=100_000_000, backlog_bytes=0)
    assert "100.0%" in out.getvalue() and out.getvalue().endswith("\n")


def test_servers_name_installations_in_order_or_one_installation_of_plain_urls() -> None:
    plain = parse_servers(["http://a:1,http://b:2/", "http://c:3"])
    assert plain == (InstallationSpec("default", ("http://a:1", "http://b:2", "http://c:3")),)
    named = parse_servers(["dc1=http://a:1,http://b:2", "dc2=http://c:3"])
    assert [(s.name, s.servers) for s in named] == [
        ("dc1", ("http://a:1", "http://b:2")),
        ("dc2", ("http://c:3",)),
    ]
    for bad in (["dc1=http://a", "http://b"], ["dc1=http://a", "dc1=http://b"], ["dc1="]):
        with pytest.raises(ValueError):
            parse_servers(bad)


def test_a_source_moves_between_installations_without_sending_an_acked_byte_twice() -> None:
    plan = SourceHandover(installation="dc1", frontier=1_000)
    up = {"dc1": False, "dc2": True}
    # requests of 1000..1500 and 1500..2000 were in flight when dc1 went down
    plan.on_failed("dc1", 1_000, 1_500, maybe_written=True)
    plan.on_failed("dc1", 1_500, 2_000, maybe_written=False)
    assert plan.settle_failures() == Doubt(1_000, 2_000, "dc1")
    assert plan.frontier == 2_000
    # dc2 takes the source over from after the doubt, never from inside it
    assert plan.target("dc2", up.__getitem__) == "dc2"
    assert plan.session_fields("dc2", multi=True) == {"fence": True, "acked_elsewhere": 2_000}
    assert plan.on_session("dc2", 2_000, multi=True) == Step(resume_at=2_000)
    plan.on_acked(3_000)
    # dc1 is back: first settle the doubt there, resending what it did not get
    up["dc1"] = True
    assert plan.target("dc1", up.__getitem__) == "dc1"
    assert plan.session_fields("dc1", multi=True) == {"fence": True}
    assert plan.on_session("dc1", 1_200, multi=True) == Step(resume_at=1_200, until=2_000)
    plan.resend_done("dc1", 2_000)
    assert plan.doubts == [] and plan.frontier == 3_000
    # then hand it over at dc1 from where dc2 acknowledged
    assert plan.session_fields("dc1", multi=True)["acked_elsewhere"] == 3_000
    assert plan.on_session("dc1", 3_000, multi=True) == Step(resume_at=3_000)
    assert plan.installation == "dc1"


def test_requests_that_never_reached_a_gateway_leave_no_doubt_and_doubts_merge() -> None:
    plan = SourceHandover(frontier=10)
    plan.on_failed("dc1", 10, 20, maybe_written=False)
    assert plan.settle_failures() is None and plan.frontier == 10
    plan.add_doubt(Doubt(10, 20, "dc1"))
    plan.add_doubt(Doubt(20, 30, "dc1"))
    plan.add_doubt(Doubt(40, 50, "dc2"))
    assert plan.doubts == [Doubt(10, 30, "dc1"), Doubt(40, 50, "dc2")]
    # a doubt that landed whole is settled by the session's answer alone
    assert plan.on_session("dc1", 35, multi=True) == Step(reopen=True)
    assert plan.doubts == [Doubt(40, 50, "dc2")]
    assert plan.session_fields("dc1", multi=True)["acked_elsewhere"] == 50


def _answer(tailed: TailedFile, chunks: list, status: str) -> dict:  # type: ignore[type-arg]
    return {
        "results": [
            {
                "source_id": tailed.source_id,
                "topic": "dc1.app",
                "partition": 0,
                "acks": [{"seqno": c.seqno, "status": status} for c in chunks],
            }
        ]
    }


def test_a_request_that_overtook_its_predecessor_is_sent_again_not_taken_for_a_loss(
    tmp_path: Path,
) -> None:
    """Two requests of one file in flight take different ways (two gateways, one forwarding):
    the second arrives first and is answered ``out_of_order``, and its answer is applied after
    the first one's acknowledgement.  The second goes back to be sent again; the file keeps
    its session (no 'the log holds less than it acknowledged', no resume from the gateway)."""
    from push_client.audit_publishing import PushAuditCounts
    from push_client.files import Counters
    from push_client.installations import Installation
    from push_client.shipper import Shipper, _WriteJob

    path = tmp_path / "a.log"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(2_000)))
    tailed = _tailed(path)
    tailed.read(1 << 30, now=0.0)
    first = tailed.take(4096)
    second = tailed.take(4096)
    installation = Installation(InstallationSpec("default", ("http://127.0.0.1:1",)))
    first_job = _WriteJob(installation, [(tailed, first)])
    second_job = _WriteJob(installation, [(tailed, second)])
    shipper = Shipper.__new__(Shipper)
    shipper.counters = Counters()

    audit = PushAuditCounts(tmp_path)
    audit.restore(None)
    audit.sent(
        "default",
        [(tailed.source_id, c.seqno, "", c.create_time_ms, 1) for c in [*first, *second]],
    )
    shipper.audit = audit
    shipper._on_write(first_job, _answer(tailed, first, "written"))
    shipper._on_write(second_job, _answer(tailed, second, "out_of_order"))
    counted = audit.of("default").snapshot().values()
    # the refused one is not counted
    assert [sum(m for m, _ in counted), sum(n for _, n in counted)] == [len(first)] * 2
    audit.close()
    assert tailed.session_ready
    assert tailed.acked == first[-1].seqno
    assert tailed.pending[0].start == second[0].start  # the second is sent again, first
    assert not tailed.pipeline_blocked and tailed.in_flight == 0

    # the same answer to a request sent after its predecessor was acknowledged is a loss:
    # the log holds less than it acknowledged, so the file resumes from the gateway's word
    second_again = tailed.take(4096)
    again_job = _WriteJob(installation, [(tailed, second_again)])
    shipper._on_write(again_job, _answer(tailed, second_again, "out_of_order"))
    assert not tailed.session_ready
    tailed.close()


def test_a_failed_over_installation_is_taken_back_once_ready_not_merely_alive() -> None:
    """The prober asks ``/readyz`` (a gateway whose store is away answers 503 there while
    ``/healthz`` says 200); a gateway without ``/readyz`` (older) is asked ``/healthz``."""
    import httpx

    from push_client.installations import _ready

    def gateway(ready: int | None) -> httpx.Client:
        def answer(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/healthz":
                return httpx.Response(200, json={"status": "ok"})
            if ready is None:
                return httpx.Response(404, json={"error": "not_found"})
            return httpx.Response(ready, json={})

        return httpx.Client(transport=httpx.MockTransport(answer))

    assert not _ready(gateway(503), "http://gw1:8080")
    assert _ready(gateway(200), "http://gw1:8080")
    assert _ready(gateway(None), "http://gw1:8080")


_GOOD_PUSH = '[push]\nservers = ["http://gw:1"]\nstate_dir = "/s"\n'
_GOOD_ENTRY = '[[entry]]\npath = "/a/*.log"\nlog_type = "web"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_GOOD_PUSH + "shutdown_timeout_s = -5\n" + _GOOD_ENTRY, "shutdown_timeout_s"),
        (_GOOD_PUSH + "graphite_interval_s = 0\n" + _GOOD_ENTRY, "graphite_interval_s"),
        (_GOOD_PUSH + "max_backoff_s = 0\n" + _GOOD_ENTRY, "max_backoff_s"),
        (_GOOD_PUSH + "probe_max_interval_s = 0\n" + _GOOD_ENTRY, "probe_max_interval_s"),
        (_GOOD_PUSH + "rescan_interval_s = 0\n" + _GOOD_ENTRY, "rescan_interval_s"),
        (_GOOD_PUSH + "multiline_timeout_s = -1\n" + _GOOD_ENTRY, "multiline_timeout_s"),
        (_GOOD_PUSH + "metrics_port = 70000\n" + _GOOD_ENTRY, "metrics_port"),
        (_GOOD_PUSH + "metrics_port = 0\n" + _GOOD_ENTRY, "metrics_port"),
        (_GOOD_PUSH + "max_line_bytes = 10\n" + _GOOD_ENTRY, "max_line_bytes must"),
        # nan passed every bound (each comparison with it is false), inf waited for ever
        (_GOOD_PUSH + "probe_max_interval_s = nan\n" + _GOOD_ENTRY, "probe_max_interval_s"),
        (_GOOD_PUSH + "probe_interval_s = inf\n" + _GOOD_ENTRY, "probe_interval_s must be a"),
        (_GOOD_PUSH + "rotate_wait_s = nan\n" + _GOOD_ENTRY, "rotate_wait_s must be a finite"),
        (_GOOD_PUSH + "shutdown_timeout_s = inf\n" + _GOOD_ENTRY, "shutdown_timeout_s must be"),
        ("push = 5\n" + _GOOD_ENTRY, "[push]"),
        (_GOOD_PUSH + "entry = 5\n", "entry"),
        (_GOOD_PUSH + "entry = [5]\n", "entry"),
        ('[push]\nservers = ["http://gw:1"]\nstate_dir = ""\n' + _GOOD_ENTRY, "state_dir"),
        ('[push]\nservers = ["http://gw:1"]\nstate_dir = 5\n' + _GOOD_ENTRY, "state_dir"),
        ('[push]\nservers = [5]\nstate_dir = "/s"\n' + _GOOD_ENTRY, "servers"),
        (_GOOD_PUSH + '[[entry]]\npath = 5\nlog_type = "web"\n', "path"),
        (_GOOD_PUSH + '[[entry]]\npath = "/a"\nlog_type = 5\n', "log_type"),
        (_GOOD_PUSH + '[[entry]]\npath = "/a"\nlog_type = "w"\nmultiline = [1]\n', "multiline"),
        (_GOOD_PUSH + '[[entry]]\npath = "/a"\nlog_type = "w"\nolddir = 5\n', "olddir must be"),
        (_GOOD_PUSH + '[[entry]]\npath = "/a"\nlog_type = "w"\nolddir = [""]\n', "olddir ''"),
        (_GOOD_PUSH + '[[entry]]\npath = "/a"\nlog_type = "w"\nolddir = [{}]\n', "olddir must"),
    ],
)
def test_every_bad_setting_is_a_config_error_naming_it(
    tmp_path: Path, text: str, message: str
) -> None:
    """Values the client cannot use are refused by name, never taken as something else
    (``state_dir = ""`` once put the state in the working directory) nor left to crash it
    later (``push = 5`` was a traceback, ``metrics_port = 70000`` one at start)."""
    config = tmp_path / "push.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(file=config)


def test_every_documented_push_key_is_accepted(tmp_path: Path) -> None:
    """docs/configuration.md lists the ``[push]`` keys; the client takes each of them."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    section = doc.split("### `[push]`", 1)[1].split("###", 1)[0]
    keys = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)
    assert "max_line_bytes" in keys and len(keys) > 20
    config = tmp_path / "push.toml"
    for key in keys:
        if key in ("servers", "state_dir"):
            continue
        config.write_text(_GOOD_PUSH + f"{key} = {{}}\n" + _GOOD_ENTRY)
        with pytest.raises(ConfigError) as refused:  # a table is no value for any key
            build_config(file=config)
        assert "unknown" not in str(refused.value), key
    config.write_text(_GOOD_PUSH + "max_line_bytes = 1048576\n" + _GOOD_ENTRY)
    assert build_config(file=config).max_line_bytes == 1048576


def test_a_token_file_missing_from_the_start_is_said_once_and_read_once_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped token_file was silent: the client sent no token, and the only sign was
    files parked for a 401 with no word about the file."""
    caplog.set_level(logging.INFO, logger="logbroker.push")
    path = tmp_path / "token"
    token = BearerToken(None, path)
    assert token.value is None and not token.refresh() and not token.refresh()
    said = [
        r.getMessage() for r in caplog.records if "cannot read the token file" in r.getMessage()
    ]
    assert len(said) == 1 and str(path) in said[0] and "without a token" in said[0]
    path.write_text("s3cr3t\n")
    assert token.refresh() and token.headers() == {"Authorization": "Bearer s3cr3t"}
    path.unlink()
    assert not token.refresh() and not token.refresh()
    said = [
        r.getMessage() for r in caplog.records if "cannot read the token file" in r.getMessage()
    ]
    assert len(said) == 2 and "with the token read last" in said[1]


def test_lag_seconds_of_a_file_written_without_pause_stay_as_small_as_the_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy log always has a few bytes not acknowledged yet; its lag in seconds once counted
    from the last moment it had none, and grew for as long as the application wrote."""
    path = tmp_path / "a.log"
    path.write_bytes(b"first line\n")
    tailed = _tailed(path)
    clock = [1000.0]
    monkeypatch.setattr("push_client.tailer.time.time", lambda: clock[0])
    for second in range(60):
        clock[0] = 1000.0 + second
        with open(path, "ab") as f:
            f.write(b"x" * 99 + b"\n")
        tailed.refresh(now=float(second))
        assert tailed.pending_since is not None
        assert clock[0] - tailed.pending_since <= 1.0, f"lag of {second} s reported"
        tailed.on_acked(tailed.size)  # shipped within the second
    tailed.refresh(now=61.0)
    assert tailed.pending_since is None
    # An outage: nothing is acknowledged for an hour; the lag is the hour, in bounded memory.
    for second in range(3600):
        clock[0] = 2000.0 + second
        with open(path, "ab") as f:
            f.write(b"y\n")
        tailed.refresh(now=100.0 + second)
    assert tailed.pending_since == 2000.0
    assert len(tailed._unacked._seen) <= tailed._unacked.max_entries
    tailed.on_acked(tailed.size - 2 * 600)  # caught up to ten minutes ago
    tailed.refresh(now=5000.0)
    assert 2000.0 + 3600 - 600 - 60 <= tailed.pending_since <= 2000.0 + 3600 - 600
    tailed.close()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"codec": "zstd"}, "--codec applies only to PATH_OR_GLOB arguments"),
        ({"log_type": "other"}, "--log-type applies only to PATH_OR_GLOB arguments"),
        ({"multiline": "^x"}, "--multiline applies only"),
        ({"log_type": "other", "codec": "gzip"}, "--log-type and --codec applies only"),
        ({"olddir": ["old"]}, "--olddir applies only to PATH_OR_GLOB arguments"),
    ],
)
def test_entry_flags_with_a_config_file_and_no_paths_are_refused_not_ignored(
    tmp_path: Path, flags: dict[str, str], named: str
) -> None:
    """``--config push.toml --codec zstd`` shipped the file's entries raw, without a word:
    the entry flags describe the entry the PATH_OR_GLOB arguments add, and there was none."""
    config = tmp_path / "push.toml"
    config.write_text(
        '[push]\nservers = ["http://gw:1"]\nstate_dir = "/s"\n'
        '[[entry]]\npath = "/a/*.log"\nlog_type = "web"\n'
    )
    with pytest.raises(ConfigError, match=re.escape(named)) as refused:
        build_config(file=config, **flags)
    assert "in its [[entry]] tables" in str(refused.value) and str(config) in str(refused.value)
    # With paths they describe the paths' entry, and the file's entries keep their own.
    built = build_config(file=config, paths=["/b.log"], **{"log_type": "other", **flags})
    assert built.entries[0] == Entry("/a/*.log", "web")
    assert built.entries[1].path == "/b.log" and built.entries[1].log_type == "other"
    assert built.entries[1].codec == flags.get("codec", "raw")
    assert built.entries[1].olddir == tuple(flags.get("olddir", ()))


def test_push_with_a_config_file_and_codec_but_no_paths_exits_2_naming_the_flag(
    tmp_path: Path,
) -> None:
    config = tmp_path / "push.toml"
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text("a line\n")
    config.write_text(
        f'[push]\nservers = ["http://127.0.0.1:9"]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[entry]]\npath = "{logs}/*.log"\nlog_type = "web"\n'
    )
    out = subprocess.run(
        logbroker_cmd("push", "--config", str(config), "--codec", "zstd", "--idle-exit", "1"),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 2, out.stderr
    assert "--codec applies only to PATH_OR_GLOB arguments" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "state").exists(), "started before refusing"


def test_an_idle_poll_looks_only_at_files_inotify_may_not_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle client stat'ed every file four times a second although inotify reports each
    change of a watched directory: with a thousand files, most of its idle CPU.  Between
    full polls only the files whose changes inotify may miss are looked at: one renamed
    away (its writer may go on in a directory not watched) and one whose directory is not
    watched (the watch table was full)."""
    import concurrent.futures

    from push_client.discovery import ChangeWatcher
    from push_client.files import Counters, FileSet
    from push_client.state_file import PushState
    from push_client.tailer import Phase

    watched, unwatched = tmp_path / "watched", tmp_path / "unwatched"
    for directory in (watched, unwatched):
        directory.mkdir()
        for name in ("a.log", "b.log"):
            (directory / name).write_text(f"{name}\n")
    config = build_config(
        servers=["http://gw:1"],
        state_dir=str(tmp_path / "state"),
        log_type="app",
        paths=[str(watched / "*.log"), str(unwatched / "*.log")],
    )
    watcher = ChangeWatcher(True)
    assert watcher.active, "inotify is needed: the client's Linux mechanism under test"
    real_watch = watcher.watch
    monkeypatch.setattr(watcher, "watch", lambda d: None if d == str(unwatched) else real_watch(d))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        files = FileSet(config, PushState(), Counters(), watcher, pool, on_retired=lambda: None)
        try:
            found = {t.path: t for t in files.discover()}
            assert len(found) == 4
            found[str(watched / "b.log")].phase = Phase.DRAINING
            looked_at: list[str] = []
            for tailed in found.values():
                real_refresh = tailed.refresh
                monkeypatch.setattr(
                    tailed,
                    "refresh",
                    lambda now, t=tailed, r=real_refresh: looked_at.append(t.path) or r(now),
                )
            files.refresh_all(1.0, watched_too=False)
            assert sorted(looked_at) == sorted(
                [str(watched / "b.log"), str(unwatched / "a.log"), str(unwatched / "b.log")]
            )
            looked_at.clear()
            files.refresh_all(2.0)
            assert len(looked_at) == 4
        finally:
            files.close()
            watcher.close()


def test_a_parked_file_shows_the_refusal_that_holds_it_not_an_earlier_one_that_passed(
    tmp_path: Path,
) -> None:
    """A file refused with a 429 (RETRYING) and then parked for a 403 kept showing the 429
    in --status beside the 403, an error that no longer held it."""
    from push_client.parking import ParkingLot, Refusal
    from push_client.status import file_row

    path = tmp_path / "app.log"
    path.write_bytes(b"a line\n")
    tailed = _tailed(path)
    tailed.session_refusal = "HTTP 429 limit_reached: too many sources"
    ParkingLot(60.0).park(tailed, Refusal(403, "forbidden", "not yours"), 0.0, 0.0)
    row = file_row(tailed)
    assert row["retrying"] is None and row["parked"]["error"] == "forbidden", row
    os.close(tailed.fd)


def test_an_installation_up_again_shows_no_error() -> None:
    """An installation that came back kept its last error in status.json (``up: true`` with
    ``last_error`` of the outage) until it went down again."""
    from push_client.installations import InstallationSet
    from push_client.status import installation_rows

    installations = InstallationSet(
        [InstallationSpec("dc1", ("http://a:1",)), InstallationSpec("dc2", ("http://b:1",))],
        probe_interval_s=60.0,
        wake=lambda: None,
    )
    dc1 = installations.members[0]
    installations.mark_down(dc1, "http://a:1: ConnectError: refused")
    assert installation_rows(installations)[0]["last_error"].endswith("refused")
    installations.mark_up(dc1)
    installations.close()
    assert installation_rows(installations)[0] == {
        "name": "dc1",
        "servers": ["http://a:1"],
        "up": True,
        "current": True,
        "last_error": "",
        "next_probe_at": None,
        "failing_gateways": [],
    }


def test_a_status_row_is_kept_while_its_file_shows_the_same_and_built_again_on_change(
    tmp_path: Path,
) -> None:
    """The rows of idle files are not built again every second, and one whose file changed
    in any way the status shows is."""
    from push_client.parking import ParkingLot, Refusal
    from push_client.status import FileRows, file_row

    path = tmp_path / "app.log"
    path.write_bytes(b"a line\n")
    tailed = _tailed(path)
    rows = FileRows()
    first = rows.rows([tailed])[0]
    assert rows.rows([tailed])[0] is first
    tailed.path_error = PathError("Permission denied", 1.0, "EACCES")
    second = rows.rows([tailed])[0]
    assert second["path_error"] == {"error": "Permission denied", "errno": "EACCES", "since": 1.0}
    tailed.path_error = None
    tailed.handover.census.add("dc2")
    assert rows.rows([tailed])[0]["waiting_for"] == ["dc2"]
    ParkingLot(60.0).park(tailed, Refusal(403, "forbidden", "not yours"), 0.0, 5.0)
    assert rows.rows([tailed])[0] == file_row(tailed)
    assert rows.rows([tailed])[0]["parked"]["since"] == 5.0
    os.close(tailed.fd)


def test_a_status_row_shows_every_value_of_its_file_under_its_name(tmp_path: Path) -> None:
    """What a row holds, with every part set (kept the same when the values it is built
    from became named fields)."""
    from push_client.parking import ParkingLot, Refusal
    from push_client.status import file_row

    path = tmp_path / "app.log"
    path.write_bytes(b"a line\n")
    tailed = _tailed(path)
    tailed.topic, tailed.partition, tailed.session_ready = "dc1.app", 3, True
    tailed.session_installation = "dc1"
    tailed.pending_since = 7.0
    tailed.session_refusal = "HTTP 429 limit_reached: too many sources"
    tailed.handover.doubts.append(Doubt(0, 7, "dc2"))
    tailed.path_error = PathError("Permission denied", 2.0, "EACCES")
    ParkingLot(60.0).park(tailed, Refusal(403, "forbidden", "not yours"), 0.0, 5.0)
    st = os.fstat(tailed.fd)
    assert file_row(tailed) == {
        "path": str(path),
        "source_id": "s",
        "log_type": "app",
        "topic": "dc1.app",
        "partition": 3,
        "phase": "parked",
        "dev": st.st_dev,
        "ino": st.st_ino,
        "acked": 0,
        "size": 7,
        "pending_since": 7.0,
        "installation": "dc1",
        "parked": {"status": 403, "error": "forbidden", "reason": "not yours", "since": 5.0},
        "doubts": [["dc2", 0, 7]],
        "retrying": None,
        "waiting_for": [],
        "path_error": {"error": "Permission denied", "errno": "EACCES", "since": 2.0},
    }
    os.close(tailed.fd)


def test_a_chunk_compressed_before_a_reload_changed_its_codec_is_sent_in_the_new_one() -> None:
    """A chunk is compressed as soon as it is cut; a reload may change its entry's codec
    before it is sent, and its section then names the new codec: the chunk must be in it."""
    data = b"one line\n" * 100
    done: concurrent.futures.Future[bytes | memoryview] = concurrent.futures.Future()
    done.set_result(compress("zstd", data))
    chunk = Chunk(0, len(data), data, 0.0, 0, encoded=done, encoded_with="zstd")
    assert bytes(encoded_for("zstd", chunk)) == compress("zstd", data)
    assert bytes(encoded_for("raw", chunk)) == data
    assert bytes(encoded_for("gzip", chunk)) == compress("gzip", data)


def test_an_entry_put_back_while_its_file_is_let_go_goes_on_with_the_same_source(
    tmp_path: Path,
) -> None:
    """An entry removed by a reload and put back by the next one before the file's last
    request was answered: the file was found again at once as a new source (``#g1``) and
    shipped from its start, every line twice in the topic."""
    from push_client.discovery import ChangeWatcher
    from push_client.files import Counters, FileSet
    from push_client.state_file import PushState
    from push_client.tailer import Phase

    (tmp_path / "k1.log").write_text("one\ntwo\n")
    (tmp_path / "k2.log").write_text("three\n")

    def config_of(*names: str) -> PushConfig:
        return build_config(
            servers=["http://gw:1"],
            state_dir=str(tmp_path / "state"),
            log_type="app",
            paths=[str(tmp_path / name) for name in names],
        )

    both = config_of("k1.log", "k2.log")
    watcher = ChangeWatcher(False)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        files = FileSet(both, PushState(), Counters(), watcher, pool, on_retired=lambda: None)
        try:
            k1 = next(t for t in files.discover() if t.path.endswith("k1.log"))
            k1.session_ready = True
            k1.in_flight = 1  # its last request is on the wire
            files.apply_config(config_of("k2.log"))
            assert k1.phase is Phase.CLOSING
            files.apply_config(both)
            assert files.discover() == []
            k1.in_flight = 0
            files.let_go_of_quiet_files(time.monotonic())
            again = files.discover()
            assert [t.source_id for t in again] == [k1.source_id]
        finally:
            files.close()
            watcher.close()
