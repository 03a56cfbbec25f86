"""The gateway's parts on their own: settings, framing, pinning, metrics, rate limits."""

from __future__ import annotations

import asyncio
import itertools
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ingest_api.app import load_route_modules
from ingest_api.errors import ApiError
from ingest_api.framing import encode_binary, parse_binary
from ingest_api.metrics import MetricsRegistry
from ingest_api.rate_limit import SourceRateLimiter
from ingest_api.settings import ConfigError, GatewaySettings, Limits, load_settings
from log_store import open_store
from session_dedup.envelope import EnvelopeWriter, decode
from session_dedup.exactly_once import (
    CHUNK_STATUSES,
    ChunkBatch,
    ExactlyOnceWriter,
    SessionRequest,
)
from session_dedup.pinning import stable_partition
from session_dedup.seqno_table import rebuild_from_records
from session_dedup.source import SourceMeta, source_meta
from tests.conftest import logbroker_cmd


def test_settings_come_from_file_then_env_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        'data_dir = "/from/file"\nport = 1000\ndc = "dcfile"\npartitions = 3\n'
        "[limits]\nmax_chunk_bytes = 10\nrequest_timeout_s = 2\n"
        '[tokens.t1]\nwrite = ["app"]\nread = ["dc1.*"]\n'
    )
    env = {
        "LOGBROKER_PORT": "2000",
        "LOGBROKER_DC": "dcenv",
        "LOGBROKER_LIMITS_MAX_CHUNK_BYTES": "20",
    }
    settings = load_settings(config_file=config, env=env, flags={"dc": "dcflag", "port": None})
    assert settings.data_dir == Path("/from/file")
    assert (settings.port, settings.dc, settings.partitions) == (2000, "dcflag", 3)
    assert settings.limits.max_chunk_bytes == 20
    assert settings.limits.request_timeout_s == 2.0
    assert settings.tokens["t1"].write_log_types == ("app",)
    assert GatewaySettings.from_json(settings.to_json()) == settings


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("port = 'x'", "port"),
        ("partitions = 0", "partitions"),
        ("dc = 'DC/1'", "dc"),
        ("store = 'mysql'", "store"),
        ("store = 'kafka'", "kafka_bootstrap"),
        ("kafka_bootstrap = 'kafka1:9092'", "set but the store is 'sqlite'"),
        (
            "store = 'kafka'\nkafka_bootstrap = 'k:9092'\nhost = '0.0.0.0'\npeer_token = 'p'\n"
            "[tokens.t]\nadmin = true",
            "needs advertised_url",
        ),
        # refused at once, not after the start's 10 s reach check, as an HTTP client's error
        ("advertised_url = 'notaurl'", "advertised_url 'notaurl' must be an http"),
        ("advertised_url = 'gw1:8080'", "advertised_url 'gw1:8080' must be an http"),
        ("advertised_url = 'http://gw1:80800'", "advertised_url 'http://gw1:80800' is not a URL"),
        ("advertised_url = 'http://gw1:8080?x=1'", "without a query"),
        ("colour = 'blue'", "colour"),
        ("[limits]\nmax_body_bytes = -1", "max_body_bytes"),
        ("[tokens.t]\nwrite = 'app'", "write"),
        ("host = '0.0.0.0'", "loopback"),
        ("[tokens.t1]\nname = 'same'\nread = ['*']\n[tokens.t2]\nname = 'same'", "same"),
        ("[tokens.t]\nadmin = 'yes'", "admin"),
        ("push_allow = ['not-a-network']", "push_allow"),
        ("partitions = 65", "max_partitions_per_topic"),
        ("[limits]\nmax_topics = 0", "max_topics"),
        ("[limits]\nsource_idle_expiry_s = inf", "source_idle_expiry_s"),
        ("[limits]\nrequest_timeout_s = inf", "request_timeout_s"),
        ("graphite_interval_s = nan", "graphite_interval_s"),
        # the [kafka] table is checked whatever the store
        ("[kafka]\ncompresion = 'lz4'", "unknown kafka settings: compresion"),
        ("[kafka]\ncompression = 'lz5'", "kafka compression must be one of"),
        ("[kafka]\nlinger_ms = 'soon'", "kafka.linger_ms"),
        ("[kafka]\nsession_timeout_ms = 10", "session_timeout_ms"),
    ],
)
def test_invalid_settings_are_refused_with_a_reason(tmp_path: Path, text: str, named: str) -> None:
    config = tmp_path / "g.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=named):
        load_settings(config_file=config, env={}, flags={"data_dir": "/d"})


def test_a_token_without_a_name_is_owned_by_a_digest_that_does_not_reveal_it(
    tmp_path: Path,
) -> None:
    config = tmp_path / "g.toml"
    config.write_text("[tokens.s3cr3t-token]\nread = ['*']\n[tokens.other]\nname = 'ops'\n")
    settings = load_settings(config_file=config, env={}, flags={"data_dir": "/d"})
    unnamed, named = settings.tokens["s3cr3t-token"], settings.tokens["other"]
    assert unnamed.owner.startswith("token-") and "s3cr3t" not in unnamed.owner
    assert named.owner == "ops"
    assert GatewaySettings.from_json(settings.to_json()) == settings


def test_a_token_being_rotated_shares_its_name_with_the_new_one_granting_the_same(
    tmp_path: Path,
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        "[tokens.old-token]\nname = 'web-hosts'\nwrite = ['app']\nread = ['dc1.app']\n"
        "[tokens.new-token]\nname = 'web-hosts'\nwrite = ['app']\nread = ['dc1.app']\n"
    )
    settings = load_settings(config_file=config, env={}, flags={"data_dir": "/d"})
    old, new = settings.tokens["old-token"], settings.tokens["new-token"]
    assert old.owner == new.owner == "web-hosts"  # groups and subscriptions stay usable
    assert GatewaySettings.from_json(settings.to_json()) == settings


def test_binary_framing_round_trips_and_keeps_data_as_views() -> None:
    meta = {"log_type": "app", "source_id": "s", "server": "h", "file": "/f", "codec": "zstd"}
    latest = 253_402_214_400_000  # 9999-12-31: the latest create time a chunk may carry
    body = encode_binary([(meta, [(1, 5, b"a\n"), (2**63 - 1, latest, b"")]), (meta, [])])
    sections = parse_binary(body, Limits())
    assert len(sections) == 2
    first = sections[0]
    assert (first.meta.codec, first.meta.server) == ("zstd", "h")
    assert first.batch.seqnos == [1, 2**63 - 1]
    assert first.batch.create_times == [5, latest]
    assert [bytes(d) for d in first.batch.datas] == [b"a\n", b""]
    assert isinstance(first.batch.datas[0], memoryview)
    assert len(sections[1].batch) == 0


def _parsed(body: bytes | list[bytes], limits: Limits) -> list[Any]:
    """What ``parse_binary`` makes of ``body``, comparable: each section's meta, seqnos,
    create times, data and error; or the request's refusal."""
    try:
        sections = parse_binary(body, limits)
    except ApiError as exc:
        return [("refused", exc.status, exc.error, exc.reason)]
    return [
        (
            s.meta,
            s.batch.seqnos,
            s.batch.create_times,
            [bytes(d) for d in s.batch.datas],
            (s.error.status, s.error.error, s.error.reason) if s.error else None,
        )
        for s in sections
    ]


def test_binary_framing_reads_a_body_in_the_pieces_it_arrived_in() -> None:
    """Cut anywhere, a body parses as it does whole (the gateway no longer joins the pieces
    of a write's body); a chunk within one piece is a view into that piece."""
    rng = random.Random(5)
    meta = {"log_type": "app", "source_id": "s", "server": "h", "file": "/f"}
    good = encode_binary(
        [
            (meta, [(1, 5, b"a" * 700), (2, 5, b""), (3, 6, b"b\n" * 300)]),
            ({**meta, "source_id": "t", "epoch": 3}, [(9, 7, bytes(range(256)) * 3)]),
            ({**meta, "source_id": "u"}, []),
        ]
    )
    bodies = [
        good,
        good[:-1],  # a chunk running past the end
        good[:9],  # cut inside a meta
        good + b"\x00",  # truncated before a meta length
        good[:4] + b"\x00\x02{}" + good[4:],  # a bad meta, refused on its own
        b"LBW2" + good[4:],
        b"LB",
        b"LBW1",
    ]
    limits = Limits(max_chunk_bytes=650)  # the first section refused: a chunk of 700 bytes
    for body in bodies:
        whole = _parsed(body, limits)
        for _ in range(60):
            cuts = sorted(rng.sample(range(len(body) + 1), rng.randint(0, min(8, len(body)))))
            pieces = [body[a:b] for a, b in itertools.pairwise([0, *cuts, len(body)])]
            assert _parsed(pieces, limits) == whole, (body[:20], cuts)
    pieces = [good[:1000], good[1000:]]
    for section in parse_binary(pieces, Limits()):
        for data in section.batch.datas:
            if isinstance(data, memoryview):
                assert any(data.obj is piece for piece in pieces)
    straddling = [d for s in parse_binary(pieces, Limits()) for d in s.batch.datas]
    assert sum(isinstance(d, memoryview) for d in straddling) == len(straddling) - 1


def test_binary_framing_refuses_a_section_with_a_chunk_over_the_limit_with_413() -> None:
    body = encode_binary(
        [
            ({"log_type": "a", "source_id": "s"}, [(1, 0, b"x" * 11)]),
            ({"log_type": "a", "source_id": "t"}, [(1, 0, b"x")]),
            ({"log_type": "a", "source_id": "s"}, [(2, 0, b"x")]),
        ]
    )
    sections = parse_binary(body, Limits(max_chunk_bytes=10))
    errors = [(s.error.status, s.error.error) if s.error else None for s in sections]
    # the source is refused as a whole: its later section would leave a gap otherwise
    assert errors == [(413, "chunk_too_large"), None, (413, "chunk_too_large")]


def test_pinning_hash_is_stable_across_releases() -> None:
    # a change here would move every source of every installation: never change the hash
    assert [stable_partition(s, 16) for s in ("host1:/var/log/a", "b", "c", "d")] == [3, 5, 11, 11]


def test_seqno_table_rebuilt_from_the_log_matches_the_state_area(tmp_path: Path) -> None:
    store = open_store(tmp_path / "data")
    writer = ExactlyOnceWriter(store, dc="dc1", partitions=1)
    for i, seqnos in enumerate(([1, 2, 3], [10, 20], [7])):
        meta = source_meta(log_type="app", source_id=f"s{i}")
        writer.write(meta, ChunkBatch(seqnos, [0] * len(seqnos), [b"x"] * len(seqnos)))
        writer.write(meta, ChunkBatch([1], [0], [b"dup"]))
    records = store.read("dc1.app", 0, 0, max_bytes=1 << 30).records
    table = rebuild_from_records(records)
    assert table == {"s0": 3, "s1": 20, "s2": 7}
    sessions = writer.open_sessions([source_meta(log_type="app", source_id=s) for s in table])
    assert [s.last_seqno for s in sessions] == list(table.values())
    store.close()


def test_many_sources_in_one_request_are_decided_as_one_by_one(tmp_path: Path) -> None:
    """Sources decided in one transaction (their state read in bulk) get the same answers as
    when each is written alone: duplicates, out-of-order chunks, fences and the source limit."""
    store = open_store(tmp_path / "data")
    writer = ExactlyOnceWriter(store, dc="dc1", partitions=1, max_sources_per_partition=5)

    def meta(i: int) -> SourceMeta:
        return source_meta(log_type="app", source_id=f"s{i}")

    for i in range(3):  # s0..s2 exist, with last seqno 10
        writer.write(meta(i), ChunkBatch([10], [0], [b"old"]))
    (fenced,) = writer.open_sessions([meta(2)], [SessionRequest(fence=True)])
    sections = [
        (meta(0), ChunkBatch([5, 10, 11], [0] * 3, [b"a"] * 3)),  # dup, dup, written
        (meta(1), ChunkBatch([12, 12, 11, 13], [0] * 4, [b"b"] * 4)),  # ooo inside the section
        (meta(2), ChunkBatch([20], [0], [b"c"], epoch=fenced.epoch - 1)),  # a stale writer
        (meta(3), ChunkBatch([1, 2], [0, 0], [b"d", b"d"])),  # new
        (meta(4), ChunkBatch([7], [0], [b"e"], prev_seqno=3)),  # new, but a gap
        (meta(5), ChunkBatch([1], [0], [b"f"])),  # new: the fifth source, at the limit
        (meta(6), ChunkBatch([1], [0], [b"g"])),  # new: over the limit
        (meta(3), ChunkBatch([2, 3], [0, 0], [b"d", b"d"])),  # s3 again: dup, written
    ]
    outcomes = asyncio.run(writer.write_many_async(sections))
    assert [[CHUNK_STATUSES[c] for c in o.written] for o in outcomes] == [
        ["duplicate", "duplicate", "written"],
        ["written", "out_of_order", "out_of_order", "written"],
        ["fenced"],
        ["written", "written"],
        ["out_of_order"],
        ["written"],
        ["refused"],
        ["duplicate", "written"],
    ]
    assert [o.last_seqno for o in outcomes] == [11, 13, 10, 2, 0, 1, 0, 3]
    sessions = writer.open_sessions([meta(i) for i in range(7)])
    assert [s.last_seqno for s in sessions] == [11, 13, 10, 3, 0, 1, 0]
    store.close()


def test_metrics_render_prometheus_text() -> None:
    registry = MetricsRegistry()
    counter = registry.counter("x_total", "things", ("kind",))
    counter.inc(2, ('a"b',))
    histogram = registry.histogram("lat_seconds", "latency", buckets=(0.1, 1.0))
    histogram.observe(0.05)
    histogram.observe(5.0)
    registry.gauge("live", "live things", read=lambda: 3.0)
    text = registry.render().decode()
    assert '# TYPE x_total counter\nx_total{kind="a\\"b"} 2.0\n' in text
    assert 'lat_seconds_bucket{le="0.1"} 1.0\n' in text
    assert 'lat_seconds_bucket{le="+Inf"} 2.0\n' in text
    assert "lat_seconds_count 2.0\n" in text
    assert "live 3.0\n" in text


def test_rate_limiter_charges_all_sources_or_none() -> None:
    limiter = SourceRateLimiter(rate=10, burst=10)
    assert limiter.admit([("a", 10)]) is None
    wait = limiter.admit([("b", 5), ("a", 5)])
    assert wait is not None and 0 < wait <= 0.6
    assert limiter.admit([("b", 10)]) is None, "the refused request charged source b"
    time.sleep(0.25)
    assert limiter.admit([("a", 2)]) is None


def test_batch_encoder_writes_the_same_bytes_as_encode() -> None:
    writer = EnvelopeWriter(source_id="s", server="h", file="/f", log_type="app", codec="gzip")
    encode_chunk = writer.encoder(1_700_000_000_001)
    for seqno, create_time, data in ((1, 0, b"a"), (2, 0, b""), (2**63 - 1, -(2**63), b"zz")):
        expected = writer.encode(seqno, create_time, 1_700_000_000_001, data)
        assert encode_chunk(seqno, create_time, memoryview(data)) == expected
        assert decode(expected).seqno == seqno


def test_route_modules_that_are_not_installed_are_skipped_but_broken_ones_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_routes_for_test.py").write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load_route_modules(("ingest_api.admin_api", "ingest_api.not_built_yet"))
    assert [m.__name__ for m in loaded] == ["ingest_api.admin_api"]
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_anywhere"):
        load_route_modules(("broken_routes_for_test",))


def test_a_route_cached_under_a_deleted_topic_does_not_write_into_the_topic_made_again(
    tmp_path: Path,
) -> None:
    """Two gateways (or workers) on one store: one routed a source to partition 1 of a topic
    of 4 partitions and keeps that route cached; the other deletes the topic and makes it
    again with 3, where the source is pinned to partition 0 and writes it.  A retry of the
    same chunks through the first must find them there (duplicates), not write them into
    partition 1 of the new topic: the source would be in two partitions, its seqnos twice."""
    source = "host1:/var/log/app0.log"
    assert (stable_partition(source, 4), stable_partition(source, 3)) == (1, 0)
    store_a, store_b = open_store(tmp_path / "data"), open_store(tmp_path / "data")
    try:
        gateway_a = ExactlyOnceWriter(store_a, dc="dc1", partitions=4)
        gateway_b = ExactlyOnceWriter(store_b, dc="dc1", partitions=3)
        meta = source_meta(log_type="app", source_id=source)
        first = gateway_a.write(meta, ChunkBatch([1], [0], [b"old topic\n"]))
        assert first.route.partition == 1
        store_b.delete_topic("dc1.app")
        again = gateway_b.write(meta, ChunkBatch([1, 2, 3], [0] * 3, [b"a\n", b"b\n", b"c\n"]))
        assert again.route.partition == 0
        assert store_a.read("dc1.app", 0, 0).records  # the first's store now knows the new topic
        for write in (
            lambda: gateway_a.write(meta, ChunkBatch([1, 2, 3], [0] * 3, [b"a\n", b"b\n", b"c\n"])),
            lambda: asyncio.run(
                gateway_a.write_many_async([(meta, ChunkBatch([3], [0], [b"c\n"]))])
            )[0],
        ):
            retried = write()
            assert retried.route.partition == 0
            assert bytes(retried.written).count(CHUNK_STATUSES.index("written")) == 0
        (session,) = gateway_a.open_sessions([meta])
        assert session.last_seqno == 3
        per_partition = [
            [decode(r.value).seqno for r in store_b.read("dc1.app", p, 0).records] for p in range(3)
        ]
        assert per_partition == [[1, 2, 3], [], []]
    finally:
        store_a.close()
        store_b.close()


def test_a_valid_kafka_table_is_accepted_beside_the_embedded_store(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text("[kafka]\ncompression = 'zstd'\nlinger_ms = 5\n")
    settings = load_settings(config_file=config, env={}, flags={"data_dir": "/d"})
    assert settings.store == "sqlite" and settings.kafka["compression"] == "zstd"


def test_serve_with_the_embedded_store_refuses_a_misspelt_kafka_key(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text("[kafka]\ncompresion = 'lz4'\n")
    result = subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(tmp_path / "d"), "--config", str(config)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "unknown kafka settings: compresion" in result.stderr
    assert not (tmp_path / "d").exists()
