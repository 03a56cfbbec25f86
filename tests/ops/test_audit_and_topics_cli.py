"""``logbroker audit`` and ``logbroker topics`` on real data dirs, through the real command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from log_store import PartitionState, TopicConfig, open_store
from ops.audit import audit_store
from session_dedup.envelope import Envelope, encode
from session_dedup.seqno_table import encode_seqno, seqno_key

REPO = Path(__file__).resolve().parents[2]


def logbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def chunk(source: str, seqno: int) -> bytes:
    return encode(Envelope(source, "host1", "/var/log/a", "access", "raw", seqno, 1, 2, b"x\n"))


def write_admitted(data_dir: Path, source: str, seqnos: list[int]) -> None:
    with open_store(data_dir) as store:
        store.create_topic("dc1.access", TopicConfig(partitions=2), exist_ok=True)

        def fn(state: PartitionState) -> Sequence[bytes]:
            state.put(seqno_key(source), encode_seqno(max(seqnos)))
            return [chunk(source, s) for s in seqnos]

        store.transact("dc1.access", 0, fn)


def test_audit_passes_on_a_consistent_store(tmp_path: Path) -> None:
    write_admitted(tmp_path, "src-a", [10, 20, 30])
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "audit: OK" in result.stdout


def test_audit_reports_a_duplicate_seqno_and_a_stale_dedup_table(tmp_path: Path) -> None:
    write_admitted(tmp_path, "src-a", [10, 20])
    with open_store(tmp_path) as store:
        store.append("dc1.access", 0, [chunk("src-a", 20), chunk("src-a", 40)])
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert "seqno 20 after 20" in result.stdout
    assert "wrote up to 20, the log says 40" in result.stdout


def test_audit_reports_a_source_in_two_partitions(tmp_path: Path) -> None:
    write_admitted(tmp_path, "src-a", [10])
    with open_store(tmp_path) as store:
        store.append("dc1.access", 1, [chunk("src-a", 11)])
    result = logbroker("audit", "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert "is in partitions 0 and 1" in result.stdout


def test_topics_cli_creates_describes_and_refuses_bad_names(tmp_path: Path) -> None:
    created = logbroker(
        "topics", "--data-dir", str(tmp_path), "create", "dc1.web", "--partitions", "3"
    )
    assert created.returncode == 0, created.stderr
    described = logbroker("topics", "--data-dir", str(tmp_path), "--json", "describe", "dc1.web")
    assert json.loads(described.stdout)["partitions"] == 3
    for bad in ("../etc", "a/b", "UPPER"):
        refused = logbroker("topics", "--data-dir", str(tmp_path), "create", bad)
        assert refused.returncode == 2
        assert "invalid topic name" in refused.stderr
    listed = logbroker("topics", "--data-dir", str(tmp_path), "list")
    assert listed.stdout.count("id=") == 1


def test_unbuilt_or_unknown_usage_exits_2_with_a_message() -> None:
    result = logbroker("bench", "no-such-benchmark")
    assert result.returncode == 2 and "no benchmark" in result.stderr
    assert logbroker().returncode == 2


def test_internal_topics_are_hidden_and_cannot_be_changed_from_the_cli(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.create_topic("logbroker-internal.delivery", TopicConfig(partitions=1))
        store.create_topic("dc1.web", TopicConfig(partitions=1))
    listed = logbroker("topics", "--data-dir", str(tmp_path), "list")
    assert "dc1.web" in listed.stdout and "logbroker-internal" not in listed.stdout
    everything = logbroker("topics", "--data-dir", str(tmp_path), "list", "--all")
    assert "logbroker-internal.delivery" in everything.stdout
    for action in (["delete"], ["alter", "--retention-bytes", "1"]):
        refused = logbroker(
            "topics",
            "--data-dir",
            str(tmp_path),
            action[0],
            "logbroker-internal.delivery",
            *action[1:],
        )
        assert refused.returncode == 2 and "internal" in refused.stderr
    with open_store(tmp_path) as store:
        assert store.describe_topic("logbroker-internal.delivery").config.retention_bytes is None


def test_tools_that_read_a_store_never_create_one(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    a_file = tmp_path / "a-file"
    a_file.write_text("not a store")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["audit", "--data-dir", str(typo)], f"no data directory '{typo}'"),
        (["topics", "--data-dir", str(typo), "list"], f"no data directory '{typo}'"),
        (["topics", "--data-dir", str(a_file), "list"], "is not a directory"),
        (["audit", "--data-dir", str(empty)], "holds no logbroker store"),
        (["topics", "--data-dir", str(empty), "describe", "dc1.x"], "holds no logbroker store"),
    ]
    for args, message in cases:
        done = logbroker(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr
        assert "Traceback" not in done.stderr
    assert not typo.exists()
    assert list(empty.iterdir()) == []


def test_topics_takes_its_options_before_or_after_the_action(tmp_path: Path) -> None:
    write_admitted(tmp_path, "src-a", [10])
    before = logbroker("topics", "--data-dir", str(tmp_path), "--json", "list")
    after = logbroker("topics", "list", "--data-dir", str(tmp_path), "--json")
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    assert before.stdout == after.stdout
    assert json.loads(after.stdout.splitlines()[0])["name"] == "dc1.access"
    described = logbroker("topics", "describe", "dc1.access", "--data-dir", str(tmp_path))
    assert described.returncode == 0, described.stderr
    assert "partitions=2" in described.stdout
    # a limit the topic does not have reads as the options take it, not as Python's None
    assert "None" not in described.stdout, described.stdout


def test_a_misspelt_flag_is_refused_with_the_commands_own_usage() -> None:
    refused = logbroker("serve", "--kafka-bootstap", "k:9092")
    assert refused.returncode == 2
    assert refused.stderr.startswith("usage: logbroker serve"), refused.stderr
    assert "unrecognized arguments: --kafka-bootstap k:9092" in refused.stderr
    unknown = logbroker("--bogus")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("usage: logbroker [-h] COMMAND")


def test_a_reader_that_stops_reading_the_output_gets_no_traceback(tmp_path: Path) -> None:
    write_admitted(tmp_path, "host1:/var/log/a", [1, 2])
    for args in (("topics", "--data-dir", str(tmp_path), "describe", "dc1.access"),
                 ("audit", "--data-dir", str(tmp_path))):  # fmt: skip
        # `logbroker topics ... | head -1`: the reader is gone before the command writes
        proc = subprocess.Popen(
            [sys.executable, "-m", "ops", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        assert proc.wait(60) == 128 + signal.SIGPIPE, stderr
        assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_topics_create_and_alter_stay_within_the_gateways_partition_limit(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    assert logbroker("topics", "--data-dir", data, "create", "dc1.web").returncode == 0

    def settings() -> tuple[int, int | None]:
        with open_store(data) as store:
            config = store.describe_topic("dc1.web").config
        return config.partitions, config.retention_ms

    # the default limit (64), as a gateway without a configuration would apply it
    over = logbroker(
        "topics", "--data-dir", data, "alter", "dc1.web", "--partitions", "65",
        "--retention-hours", "1",
    )  # fmt: skip
    assert over.returncode == 2
    assert "at most 64 partitions (limits.max_partitions_per_topic" in over.stderr
    assert settings() == (4, None)  # the retention was not changed either
    created = logbroker("topics", "--data-dir", data, "create", "dc1.big", "--partitions", "65")
    assert created.returncode == 2 and "max_partitions_per_topic" in created.stderr
    zero = logbroker("topics", "--data-dir", data, "create", "dc1.none", "--partitions", "0")
    assert zero.returncode == 2 and "partitions must be" in zero.stderr
    with open_store(data) as store:
        assert [t.name for t in store.list_topics()] == ["dc1.web"]
    shrunk = logbroker("topics", "--data-dir", data, "alter", "dc1.web", "--partitions", "2")
    assert shrunk.returncode == 2 and "never shrink" in shrunk.stderr
    # the limit the gateway is configured with: in its file, or its environment
    config = tmp_path / "gateway.toml"
    config.write_text("[limits]\nmax_partitions_per_topic = 100\n")
    raised = logbroker(
        "topics", "--data-dir", data, "alter", "dc1.web", "--partitions", "65",
        "--config", str(config),
    )  # fmt: skip
    assert raised.returncode == 0, raised.stderr
    assert settings() == (65, None)
    lowered = subprocess.run(
        [sys.executable, "-m", "ops", "topics", "--data-dir", data, "alter", "dc1.web",
         "--partitions", "70", "--config", str(config)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "LOGBROKER_LIMITS_MAX_PARTITIONS_PER_TOPIC": "66"},
    )  # fmt: skip
    assert lowered.returncode == 2 and "at most 66 partitions" in lowered.stderr
    assert settings() == (65, None)
    # and the store to the gateway's max_topics
    config.write_text("[limits]\nmax_topics = 1\n")
    full = logbroker("topics", "--data-dir", data, "create", "dc1.two", "--config", str(config))
    assert full.returncode == 2 and "max_topics" in full.stderr
    with open_store(data) as store:
        assert [t.name for t in store.list_topics()] == ["dc1.web"]


def test_a_topics_retention_can_be_set_back_to_unlimited(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    created = logbroker(
        "topics", "--data-dir", data, "create", "dc1.kept", "--retention-hours", "2",
        "--retention-bytes", "100000",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    def retention() -> tuple[int | None, int | None]:
        with open_store(data) as store:
            config = store.describe_topic("dc1.kept").config
        return config.retention_ms, config.retention_bytes

    assert retention() == (7_200_000, 100_000)
    alter = ("topics", "--data-dir", data, "alter", "dc1.kept")
    assert logbroker(*alter, "--retention-hours", "unlimited").returncode == 0
    assert retention() == (None, 100_000)
    assert logbroker(*alter, "--retention-bytes", "unlimited").returncode == 0
    assert retention() == (None, None)
    assert logbroker(*alter, "--retention-hours", "1").returncode == 0
    assert retention() == (3_600_000, None)
    for bad in (("--retention-hours", "-1"), ("--retention-bytes", "nan")):
        refused = logbroker(*alter, *bad)
        assert refused.returncode == 2, bad
        assert "unlimited" in refused.stderr
    assert retention() == (3_600_000, None)


class _WritingWhileAudited:
    """A store a gateway goes on writing while the audit reads it: the first look at the
    dedup table comes after one more commit of ``source``."""

    def __init__(self, store: Any, source: str, seqno: int) -> None:
        self._store, self._source, self._seqno = store, source, seqno

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get_state(self, topic: str, partition: int, key: str) -> bytes | None:
        if self._seqno is not None:
            seqno, self._seqno = self._seqno, None
            source = self._source

            def fn(state: PartitionState) -> Sequence[bytes]:
                state.put(seqno_key(source), encode_seqno(seqno))
                return [chunk(source, seqno)]

            self._store.transact(topic, partition, fn)
        return self._store.get_state(topic, partition, key)


def test_audit_of_a_store_being_written_reads_on_to_the_table(tmp_path: Path) -> None:
    """Before: a commit between the audit's look at the log's end and its look at the table
    was a PROBLEM ("the dedup table says ... wrote up to 40, the log says 30"), on every
    audit of a live Kafka namespace."""
    write_admitted(tmp_path, "src-a", [10, 20, 30])
    with open_store(tmp_path) as store:
        report = audit_store(_WritingWhileAudited(store, "src-a", 40))
    assert report.ok, report.problems
    first = report.partitions[0]
    assert (first.partition, first.records, first.end_offset) == (0, 4, 4)


def test_audit_still_reports_a_table_ahead_of_everything_in_the_log(tmp_path: Path) -> None:
    write_admitted(tmp_path, "src-a", [10, 20])
    with open_store(tmp_path) as store:
        store.transact(
            "dc1.access", 0, lambda state: state.put(seqno_key("src-a"), encode_seqno(50)) or []
        )
        report = audit_store(store)
    assert report.problems == [
        "dc1.access/0: the dedup table says source 'src-a' wrote up to 50, the log says 20"
    ]
