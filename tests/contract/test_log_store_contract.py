"""What every log store backend promises (log_store/interface.py), tested against each one."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from log_store import (
    BadRequest,
    InvalidTopicName,
    LogStore,
    OffsetOutOfRange,
    PartitionState,
    Record,
    StoreUnavailable,
    TopicConfig,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
    open_store,
)
from log_store.errors import CorruptData
from log_store.interface import UNLIMITED, PrefetchingState
from tests.contract.backends import open_spec

APPENDER = Path(__file__).with_name("appender.py")
REPO = Path(__file__).resolve().parents[2]


def read_records(store: LogStore, topic: str, partition: int, offset: int = 0) -> list[Record]:
    records: list[Record] = []
    while True:
        result = store.read(topic, partition, offset, 256 * 1024)
        records.extend(result.records)
        if result.next_offset >= result.end_offset:
            return records
        offset = result.next_offset


def read_all(store: LogStore, topic: str, partition: int, offset: int = 0) -> list[bytes]:
    return [r.value for r in read_records(store, topic, partition, offset)]


# -- offsets and atomicity ----------------------------------------------------------------


def test_offsets_increase_and_are_the_ones_each_append_was_given(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=2))
    results = []
    for n in (1, 3, 5, 1):
        result = store.append("dc1.t", 0, [b"v%d" % i for i in range(n)])
        assert result.count == n
        results.append(result)
    given = [o for r in results for o in range(r.first_offset, r.last_offset + 1)]
    offsets = [r.offset for r in store.read("dc1.t", 0, 0).records]
    assert offsets == given == sorted(set(given))
    assert store.end_offset("dc1.t", 0) > offsets[-1]
    assert store.end_offset("dc1.t", 1) == 0
    if store.capabilities.dense_offsets:
        assert [r.first_offset for r in results] == [0, 1, 4, 9]
        assert offsets == list(range(10))
        assert store.end_offset("dc1.t", 0) == 10


def test_read_your_writes_returns_exact_bytes(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    values = [os.urandom(random.randrange(0, 3000)) for _ in range(200)]
    store.append("dc1.t", 0, values[:50])
    store.append("dc1.t", 0, values[50:])
    records = read_records(store, "dc1.t", 0)
    assert [r.value for r in records] == values
    middle = store.read("dc1.t", 0, records[123].offset, 1)
    assert [r.offset for r in middle.records] == [records[123].offset]
    assert middle.records[0].value == values[123]


def test_read_past_end_returns_nothing_and_the_end(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    store.append("dc1.t", 0, [b"a", b"b"])
    end = store.end_offset("dc1.t", 0)
    assert end >= 2
    result = store.read("dc1.t", 0, end)
    assert result.records == [] and result.end_offset == end and result.next_offset == end
    assert store.read("dc1.t", 0, 10**12).records == []


def test_read_honours_max_bytes_but_returns_at_least_one_record(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    store.append("dc1.t", 0, [b"x" * 1000] * 50)
    assert len(store.read("dc1.t", 0, 0, 10).records) == 1
    assert len(store.read("dc1.t", 0, 0, 5000).records) == 5


def test_failed_transaction_appends_nothing_and_others_in_its_group_commit(
    store: LogStore,
) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))

    def failing(state: PartitionState) -> Sequence[bytes]:
        state.put("k", b"never")
        raise ValueError("refused")

    def good(state: PartitionState) -> Sequence[bytes]:
        state.put("k2", b"kept")
        return [b"good"]

    futures = [store.submit("dc1.t", 0, failing), store.submit("dc1.t", 0, good)]
    with pytest.raises(ValueError):
        futures[0].result()
    assert futures[1].result().count == 1
    assert read_all(store, "dc1.t", 0) == [b"good"]
    assert store.get_state("dc1.t", 0, "k") is None
    assert store.get_state("dc1.t", 0, "k2") == b"kept"


def test_state_updates_commit_with_the_records_they_admit(store: LogStore) -> None:
    """The dedup pattern: a transaction sees earlier ones of its group and the committed state."""
    store.create_topic("dc1.t", TopicConfig(partitions=1))

    def admit(seqno: int) -> Callable[[PartitionState], Sequence[bytes]]:
        def fn(state: PartitionState) -> Sequence[bytes]:
            last = int.from_bytes(state.get("src") or b"\0", "big")
            if seqno <= last:
                return []
            state.put("src", seqno.to_bytes(8, "big"))
            return [b"%d" % seqno]

        return fn

    seqnos = [1, 2, 2, 5, 3, 6, 6, 1, 7]
    futures = [store.submit("dc1.t", 0, admit(s)) for s in seqnos]
    counts = [f.result().count for f in futures]
    assert counts == [1, 1, 0, 1, 0, 1, 0, 0, 1]
    assert read_all(store, "dc1.t", 0) == [b"1", b"2", b"5", b"6", b"7"]
    assert store.get_state("dc1.t", 0, "src") == (7).to_bytes(8, "big")


def test_prefetched_state_reads_the_group_and_own_puts_before_the_database(
    tmp_path: Path,
) -> None:
    """A key read ahead in bulk must not hide a put made since by the same group commit."""
    with open_store(tmp_path / "data") as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.transact("dc1.t", 0, lambda s: (s.put("k", b"db"), s.put("gone", b"x"), [])[2])
        store.transact("dc1.t", 0, lambda s: (s.put("gone", b""), [])[1])
        release = threading.Event()
        seen: dict[str, list[bytes | None]] = {}

        def hold(_state: PartitionState) -> Sequence[bytes]:
            # keeps the committer busy so that the next two are committed as one group
            release.wait(60)
            return []

        def first(state: PartitionState) -> Sequence[bytes]:
            assert isinstance(state, PrefetchingState)
            state.prefetch(["k", "new", "gone", "k"])
            seen["first"] = [state.get("k"), state.get("new"), state.get("gone")]
            state.put("new", b"from first")
            seen["first-own"] = [state.get("new")]
            return [b"1"]

        def second(state: PartitionState) -> Sequence[bytes]:
            assert isinstance(state, PrefetchingState)
            state.prefetch(["k", "new"])
            seen["second"] = [state.get("k"), state.get("new")]
            return [b"2"]

        held = store.submit("dc1.t", 0, hold)
        futures = [store.submit("dc1.t", 0, fn) for fn in (first, second)]
        release.set()
        held.result()
        assert [f.result().count for f in futures] == [1, 1]
    assert seen == {
        "first": [b"db", None, None],
        "first-own": [b"from first"],
        "second": [b"db", b"from first"],
    }


def test_a_waiting_writer_never_overtakes_what_its_thread_queued_before(tmp_path: Path) -> None:
    """``transact`` may commit in the caller's thread (the embedded store); a transaction the
    same thread submitted before it still commits first, and other threads lose nothing."""
    store = open_store(tmp_path / "data")
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    stop = threading.Event()

    def background() -> None:
        while not stop.is_set():
            store.append("dc1.t", 0, [b"bg"])

    other = threading.Thread(target=background)
    other.start()
    try:
        for i in range(100):
            queued = store.submit("dc1.t", 0, lambda _s, i=i: [b"q%d" % i])
            waited = store.transact("dc1.t", 0, lambda _s, i=i: [b"w%d" % i])
            assert queued.result().last_offset < waited.first_offset
    finally:
        stop.set()
        other.join()
    values = read_all(store, "dc1.t", 0)
    store.close()
    mine = [v for v in values if v != b"bg"]
    assert mine == [v for i in range(100) for v in (b"q%d" % i, b"w%d" % i)]


def test_idle_partition_lets_go_of_its_files_after_waiting_writers(tmp_path: Path) -> None:
    """Appends committed in the writer's own thread still leave no segment open once idle."""
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"x"])
        (segment,) = store_dir_of(data_dir).glob("*.log")
        fd_dir = Path("/proc/self/fd")

        def segment_open() -> bool:
            return any(
                os.readlink(fd_dir / fd) == str(segment)
                for fd in os.listdir(fd_dir)
                if (fd_dir / fd).is_symlink()
            )

        assert segment_open()
        deadline = time.monotonic() + 60
        while segment_open() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not segment_open()


def test_concurrent_threads_share_commits_and_lose_nothing(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    results: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for b in range(50):
            r = store.append("dc1.t", 0, [b"%d:%d:%d" % (w, b, i) for i in range(10)])
            with lock:
                results.append((w, r.first_offset, r.last_offset))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_offset = {r.offset: r.value for r in read_records(store, "dc1.t", 0)}
    assert len(by_offset) == 8 * 50 * 10
    for w, first, last in results:
        batch = [by_offset[o] for o in range(first, last + 1)]
        assert len({v.rsplit(b":", 1)[0] for v in batch}) == 1
        assert batch[0].startswith(b"%d:" % w)


# -- segments and retention ---------------------------------------------------------------


def test_retention_is_altered_kept_and_set_back_to_unlimited(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1, retention_ms=3_600_000))
    store.alter_topic("dc1.t", retention_bytes=1 << 30)

    def retention() -> tuple[int | None, int | None]:
        config = store.describe_topic("dc1.t").config
        return config.retention_ms, config.retention_bytes

    assert retention() == (3_600_000, 1 << 30)  # a setting not given is kept
    store.alter_topic("dc1.t", retention_ms=UNLIMITED)
    assert retention() == (None, 1 << 30)
    store.alter_topic("dc1.t", retention_bytes=UNLIMITED)
    assert retention() == (None, None)
    with pytest.raises(BadRequest):
        store.alter_topic("dc1.t", retention_ms=-5)
    assert retention() == (None, None)


def test_reads_cross_segment_boundaries(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=8192))
    values = [b"%06d" % i + b"." * 994 for i in range(100)]
    for i in range(0, 100, 3):
        store.append("dc1.t", 0, values[i : i + 3])
    if store.capabilities.segment_files:
        assert store.describe_topic("dc1.t").partitions[0].segments > 5
    records = read_records(store, "dc1.t", 0)
    assert [r.value for r in records] == values
    # one read that starts inside one segment and runs over several
    result = store.read("dc1.t", 0, records[5].offset, 40_000)
    assert [r.value for r in result.records] == values[5 : 5 + len(result.records)]
    assert len(result.records) >= 30


@pytest.mark.requires("store_retention", "dense_offsets", "segment_files")
def test_retention_by_size_keeps_newest_data_and_moves_start(store: LogStore) -> None:
    store.create_topic(
        "dc1.t", TopicConfig(partitions=1, segment_bytes=8192, retention_bytes=20_000)
    )
    values = [b"%06d" % i + b"." * 994 for i in range(100)]
    for v in values:
        store.append("dc1.t", 0, [v])
    moved = store.apply_retention()
    info = store.describe_topic("dc1.t").partitions[0]
    assert moved[("dc1.t", 0)] == info.start_offset > 0
    assert info.end_offset == 100
    assert info.size_bytes <= 20_000 + 8192
    assert read_all(store, "dc1.t", 0, info.start_offset) == values[info.start_offset :]
    with pytest.raises(OffsetOutOfRange) as exc:
        store.read("dc1.t", 0, 0)
    assert exc.value.start_offset == info.start_offset and exc.value.end_offset == 100
    seg_files = sorted(p.name for p in (store_dir(store, "dc1.t")).glob("*.log"))
    assert len(seg_files) == info.segments


def store_dir(store: LogStore, topic: str) -> Path:
    info = store.describe_topic(topic)
    data_dir: Path = store.data_dir  # type: ignore[attr-defined]
    return data_dir / "topics" / topic / info.topic_id / "0"


@pytest.mark.requires("store_retention", "segment_files")
def test_retention_by_age_drops_only_old_segments(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=4096, retention_ms=60_000))
    for i in range(30):
        store.append("dc1.t", 0, [b"%d" % i + b"." * 1000])
    assert store.apply_retention() == {}  # nothing is a minute old yet
    later = int(time.time() * 1000) + 120_000
    moved = store.apply_retention(later)
    info = store.describe_topic("dc1.t").partitions[0]
    assert info.segments == 1  # the active segment always stays
    assert moved[("dc1.t", 0)] == info.start_offset
    assert read_all(store, "dc1.t", 0, info.start_offset)[-1].startswith(b"29.")


def test_forced_segment_deletion_by_operator(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=4096))
    for i in range(40):
        store.append("dc1.t", 0, [b"%d" % i + b"." * 1000])
    records = read_records(store, "dc1.t", 0)
    before = records[20].offset
    new_start = store.delete_segments_before("dc1.t", 0, before)
    assert 0 < new_start <= before
    first_kept = next(r for r in records if r.offset >= new_start)
    assert store.read("dc1.t", 0, new_start).records[0] == first_kept
    with pytest.raises(OffsetOutOfRange):
        store.read("dc1.t", 0, 0)
    # appends continue after the deletion
    assert store.append("dc1.t", 0, [b"after"]).first_offset > records[-1].offset
    with pytest.raises(BadRequest):
        store.delete_segments_before("dc1.t", 0, -1)


# -- topics -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "../etc",
        "dc1..x",
        "Upper",
        "x" * 202,
        "a\x00b",
        "a\nb",
        "-lead",
        ".hidden",
        "dc1 space",
        "dc1/../../x",
    ],
)
def test_bad_topic_names_are_refused_and_create_nothing(store: LogStore, name: str) -> None:
    with pytest.raises(InvalidTopicName):
        store.create_topic(name)
    with pytest.raises(InvalidTopicName):
        store.append(name, 0, [b"x"])
    assert store.list_topics() == []
    if store.capabilities.segment_files:
        data_dir: Path = store.data_dir  # type: ignore[attr-defined]
        topics_dir = data_dir / "topics"
        assert not topics_dir.exists() or list(topics_dir.iterdir()) == []


def test_topic_lifecycle_and_bad_requests(store: LogStore) -> None:
    info = store.create_topic("dc1.t", TopicConfig(partitions=2))
    assert [t.name for t in store.list_topics()] == ["dc1.t"]
    with pytest.raises(TopicExists):
        store.create_topic("dc1.t")
    assert store.create_topic("dc1.t", exist_ok=True).topic_id == info.topic_id
    with pytest.raises(UnknownPartition):
        store.append("dc1.t", 2, [b"x"])
    with pytest.raises(UnknownPartition):
        store.read("dc1.t", -1, 0)
    with pytest.raises(OffsetOutOfRange):
        store.read("dc1.t", 0, -5)
    with pytest.raises(UnknownTopic):
        store.read("dc1.nope", 0, 0)
    with pytest.raises(BadRequest):
        store.create_topic("dc1.zero", TopicConfig(partitions=0))
    grown = store.set_partitions("dc1.t", 4)
    assert grown.config.partitions == 4
    store.append("dc1.t", 3, [b"x"])
    with pytest.raises(BadRequest):
        store.set_partitions("dc1.t", 2)


def test_recreated_topic_starts_empty_with_new_identity_and_state(store: LogStore) -> None:
    old = store.create_topic("dc1.t", TopicConfig(partitions=1))
    store.append("dc1.t", 0, [b"old"])
    assert store.put_topic_state_if_absent("dc1.t", "pin:a", b"\x00") == b"\x00"
    store.delete_topic("dc1.t")
    with pytest.raises(UnknownTopic):
        store.read("dc1.t", 0, 0)
    new = store.create_topic("dc1.t", TopicConfig(partitions=1))
    assert new.topic_id != old.topic_id
    assert store.read("dc1.t", 0, 0).records == []
    assert store.get_topic_state("dc1.t", "pin:a") is None
    assert store.put_topic_state_if_absent("dc1.t", "pin:a", b"\x01") == b"\x01"
    assert store.put_topic_state_if_absent("dc1.t", "pin:a", b"\x02") == b"\x01"


def test_topic_deleted_by_another_process_is_not_written_by_this_one(
    open_backend: Callable[[], LogStore],
) -> None:
    first, second = open_backend(), open_backend()
    first.create_topic("dc1.t", TopicConfig(partitions=2))
    first.append("dc1.t", 0, [b"before"])
    first.transact("dc1.t", 0, lambda state: (state.put("k", b"old"), [])[1])
    second.delete_topic("dc1.t")
    with pytest.raises(UnknownTopic):
        first.append("dc1.t", 0, [b"lost?"])
    # a partition this process never opened: refused too, and no directory comes back
    with pytest.raises(UnknownTopic):
        first.append("dc1.t", 1, [b"lost?"])
    if first.capabilities.segment_files:
        data_dir: Path = first.data_dir  # type: ignore[attr-defined]
        assert not list((data_dir / "topics").rglob("partition.db"))
    second.create_topic("dc1.t", TopicConfig(partitions=2))
    # every path of the first process sees the new topic, not the old one
    assert first.read("dc1.t", 0, 0).records == []
    assert first.end_offset("dc1.t", 1) == 0
    assert first.get_state("dc1.t", 0, "k") is None
    assert first.append("dc1.t", 0, [b"new"]).first_offset == 0
    assert first.append("dc1.t", 1, [b"new1"]).first_offset == 0
    assert read_all(second, "dc1.t", 0) == [b"new"]
    assert read_all(second, "dc1.t", 1) == [b"new1"]


def test_reads_name_the_identity_of_the_topic_they_read(
    open_backend: Callable[[], LogStore],
) -> None:
    """A read says which topic of the name it read (a reader keeps it with its offsets):
    exactly on a store whose partitions belong to one identity, and as of the store's last
    look on one that reads by name (Kafka), where ``current_topic_id`` asks afresh."""
    first, second = open_backend(), open_backend()
    old = first.create_topic("dc1.t", TopicConfig(partitions=1))
    first.append("dc1.t", 0, [b"old"])
    assert first.read("dc1.t", 0, 0).topic_id == old.topic_id
    assert first.current_topic_id("dc1.t") == old.topic_id
    second.delete_topic("dc1.t")
    new = second.create_topic("dc1.t", TopicConfig(partitions=1))
    second.append("dc1.t", 0, [b"new"])
    assert first.current_topic_id("dc1.t") == new.topic_id  # asked afresh
    read = first.read("dc1.t", 0, 0)
    assert read.topic_id == new.topic_id, (read.topic_id, old.topic_id, new.topic_id)
    assert [r.value for r in read.records] == [b"new"]
    second.delete_topic("dc1.t")
    with pytest.raises(UnknownTopic):
        first.current_topic_id("dc1.t")


@pytest.mark.requires("segment_files")
def test_retention_in_another_process_frees_the_segments_a_reader_had_open(
    open_backend: Callable[[], LogStore],
) -> None:
    reader, operator = open_backend(), open_backend()
    reader.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=4096))
    for i in range(40):
        reader.append("dc1.t", 0, [b"%d" % i + b"." * 1000])
    assert len(read_all(reader, "dc1.t", 0)) == 40  # opens every segment
    new_start = operator.delete_segments_before("dc1.t", 0, 30)
    assert new_start > 0
    reader.read("dc1.t", 0, new_start)
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    assert not [target for target in held if target.endswith(".log (deleted)")]


# -- waiting ------------------------------------------------------------------------------


def test_waiting_reader_is_woken_by_an_append_of_another_process(
    open_backend: Callable[[], LogStore], store_spec: str
) -> None:
    store = open_backend()
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    assert store.wait_for_data("dc1.t", 0, 0, 0.05) is False
    woke: list[float] = []

    def wait() -> None:
        if store.wait_for_data("dc1.t", 0, 0, 10.0):
            woke.append(time.time())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    # The writer stays alive with its store open: nothing but its commit can wake us.
    child = subprocess.Popen(
        [
            sys.executable,
            str(APPENDER),
            store_spec,
            "dc1.t",
            "0",
            "w",
            "1",
            "1",
            "10",
            "3",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        ack = child.stdout.readline().split()
        waiter.join(2)
        assert woke, "the waiting reader was not woken"
        # woken by the commit (inotify), not by a timeout: slack for a loaded host only
        assert woke[0] - float(ack[5]) < 0.5
        assert child.poll() is None, "the writer exited; its close may have woken the reader"
    finally:
        child.kill()
        child.wait()
        waiter.join(15)


def _append_in_child(store_spec: str, partition: int, linger_s: float) -> tuple[Any, float]:
    """Another process that appends one batch to ``dc1.t`` and stays (store open) for
    ``linger_s``: (the process, when its append was acked)."""
    args = [store_spec, "dc1.t", str(partition), "w", "1", "1", "10", str(linger_s)]
    child = subprocess.Popen(
        [sys.executable, str(APPENDER), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert child.stdout is not None
    ack = child.stdout.readline().split()
    assert ack, "the appender acked nothing"
    return child, float(ack[5])


def test_followers_are_called_by_appends_of_another_process_until_they_let_go(
    open_backend: Callable[[], LogStore], store_spec: str
) -> None:
    store = open_backend()
    # partition 0 is made by no write yet (the embedded store has no file of it to watch)
    store.create_topic("dc1.t", TopicConfig(partitions=2))
    calls: dict[int, list[float]] = {0: [], 1: []}
    unfollow = {
        p: store.follow_appends("dc1.t", p, lambda p=p: calls[p].append(time.time()))
        for p in (0, 1)
    }
    children = []
    try:
        child, acked = _append_in_child(store_spec, 0, 10)
        children.append(child)
        deadline = time.monotonic() + 5
        while not any(at >= acked - 0.5 for at in calls[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        woken = [at for at in calls[0] if at >= acked - 0.5]
        assert woken, "the follower was not called"
        # called by the append (inotify, the tail consumer), not by a look now and then:
        # slack for a loaded host only
        assert woken[0] - acked < 0.5
        assert not calls[1], "an append to partition 0 called partition 1's follower"
        unfollow[0]()
        time.sleep(0.5)
        called = len(calls[0])
        child, _acked = _append_in_child(store_spec, 0, 10)
        children.append(child)
        time.sleep(1.0)
        assert len(calls[0]) == called, "called after it let go"
        child, acked = _append_in_child(store_spec, 1, 10)
        children.append(child)
        deadline = time.monotonic() + 5
        while not calls[1] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls[1] and calls[1][0] - acked < 0.5
    finally:
        unfollow[1]()
        for child in children:
            child.kill()
            child.wait()


def test_a_follower_of_a_topic_made_again_is_called_by_the_new_topic_s_appends(
    store: LogStore,
) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    calls: list[float] = []
    unfollow = store.follow_appends("dc1.t", 0, lambda: calls.append(time.time()))
    store.append("dc1.t", 0, [b"old"])
    store.append("dc1.t", 0, [b"old"])
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls
    store.delete_topic("dc1.t")
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    time.sleep(2)  # what the deletion called is over (on Kafka, the tail saw the new topic)
    called = len(calls)
    store.append("dc1.t", 0, [b"new"])
    appended = time.time()
    deadline = time.monotonic() + 5
    while len(calls) == called and time.monotonic() < deadline:
        time.sleep(0.01)
    unfollow()
    assert len(calls) > called, "the new topic's append called no follower"
    assert calls[called] - appended < 1.0


def test_followers_are_called_within_milliseconds_of_each_append(store: LogStore) -> None:
    """On Kafka the tail consumer took its records in batches that waited for 1,000 records
    or half a second, so a long-poll was woken a quarter of a second after the commit on
    average (what the test above allows for a loaded host)."""
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    store.append("dc1.t", 0, [b"made"])
    called = threading.Event()
    unfollow = store.follow_appends("dc1.t", 0, called.set)
    try:
        time.sleep(1.0)  # followed (on Kafka, the tail consumer is assigned the partition)
        called.clear()
        delays = []
        for i in range(9):
            store.append("dc1.t", 0, [b"x%d" % i])
            acked = time.monotonic()
            assert called.wait(5), "the follower was not called"
            delays.append(time.monotonic() - acked)
            called.clear()
            time.sleep(0.05)
    finally:
        unfollow()
    assert sorted(delays)[4] < 0.1, delays


def test_following_many_partitions_takes_no_thread_each_and_one_append_calls_them(
    store: LogStore,
) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=64))
    store.append("dc1.t", 5, [b"made"])  # one partition made, the others not
    threads = len(os.listdir("/proc/self/task"))
    called: dict[int, threading.Event] = {p: threading.Event() for p in range(64)}
    started = time.monotonic()
    unfollows = [
        store.follow_appends("dc1.t", p, called[p].set) for p in range(64) for _ in range(3)
    ]
    # at once: on Kafka, the tail consumer was assigned each partition in a call that waited
    # for its fetch in progress (0.5 s each, 32 s for these)
    assert time.monotonic() - started < 5
    # the store's one watcher thread (the tail consumer's, and librdkafka's few, on Kafka)
    assert len(os.listdir("/proc/self/task")) - threads <= 8
    for p in (5, 6):
        store.append("dc1.t", p, [b"x"])
    assert called[5].wait(5) and called[6].wait(5)
    assert not called[7].is_set()
    for unfollow in unfollows:
        unfollow()


def test_cancelled_append_is_not_committed_and_the_partition_keeps_working(
    store: LogStore,
) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    release = threading.Event()

    def slow(state: PartitionState) -> Sequence[bytes]:
        release.wait(5)
        return [b"first"]

    first = store.submit("dc1.t", 0, slow)
    time.sleep(0.1)  # the committer is now inside ``slow``; the next ones queue behind it
    queued = [store.submit("dc1.t", 0, lambda _s, i=i: [b"q%d" % i]) for i in range(3)]
    assert queued[1].cancel()
    release.set()
    assert first.result(5).count == 1
    assert queued[0].result(5).count == 1 and queued[2].result(5).count == 1
    records = read_records(store, "dc1.t", 0)
    assert [r.value for r in records] == [b"first", b"q0", b"q2"]
    assert store.append("dc1.t", 0, [b"after"]).first_offset > records[-1].offset


# -- processes and crashes ----------------------------------------------------------------


def check_batches(records: list[Record]) -> dict[tuple[str, int], tuple[int, int]]:
    """Every batch is whole and contiguous; returns (writer, batch) -> (first, last) offset."""
    seen: dict[tuple[str, int], tuple[int, int]] = {}
    i = 0
    while i < len(records):
        writer, batch, index, count = records[i].value.split(b":")[:4]
        assert int(index) == 0, f"batch starts mid-way at offset {records[i].offset}"
        n = int(count)
        for j in range(n):
            parts = records[i + j].value.split(b":")
            assert (parts[0], parts[1], int(parts[2])) == (writer, batch, j), "torn batch"
            assert records[i + j].offset == records[i].offset + j, "a batch's offsets have gaps"
        key = (writer.decode(), int(batch))
        assert key not in seen, "batch written twice"
        seen[key] = (records[i].offset, records[i].offset + n - 1)
        i += n
    return seen


def check_state_agrees(
    store: LogStore, topic: str, seen: dict[tuple[str, int], tuple[int, int]], writers: set[str]
) -> None:
    """Each appender's state key names the newest of its batches in the log: no more, no less."""
    newest: dict[str, int] = {}
    for writer, batch in seen:
        if writer in writers:
            newest[writer] = max(batch, newest.get(writer, -1))
    for writer, batch in newest.items():
        assert store.get_state(topic, 0, f"last/{writer}") == str(batch).encode()


@pytest.mark.slow
def test_four_processes_appending_lose_nothing_and_never_interleave(
    store: LogStore, store_spec: str
) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=64 * 1024))
    # On Kafka each process that writes fences the one before (one writer per partition):
    # correct, but each turn costs a takeover, so fewer turns make the same point.
    batches = 60 if store.capabilities.dense_offsets else 8
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(APPENDER),
                store_spec,
                "dc1.t",
                "0",
                f"w{w}",
                str(batches),
                "7",
                "100",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for w in range(4)
    ]
    acks = []
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0
        acks.extend(line.split() for line in out.splitlines())
    records = read_records(store, "dc1.t", 0)
    seen = check_batches(records)
    assert len(seen) == 4 * batches and len(records) == 4 * batches * 7
    for _, writer, batch, first, last, _ in acks:
        assert seen[(writer, int(batch))] == (int(first), int(last))


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_mid_append_keeps_every_acked_batch_and_no_torn_one(
    store_spec: str, seed: int
) -> None:
    with contextlib.closing(open_spec(store_spec)) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=256 * 1024))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(APPENDER),
                store_spec,
                "dc1.t",
                "0",
                f"w{w}",
                "100000",
                "50",
                "300",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for w in range(2)
    ]
    rng = random.Random(seed)
    acks = []
    for p in procs:  # both are appending (however slowly they started), then a random moment
        assert p.stdout is not None
        acks.append(p.stdout.readline().split())
    time.sleep(rng.random())
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        out, _ = p.communicate(timeout=30)
        acks.extend(line.split() for line in out.splitlines() if line.startswith("ack"))
    assert all(ack and ack[0] == "ack" for ack in acks)
    with contextlib.closing(open_spec(store_spec)) as store:
        records = read_records(store, "dc1.t", 0)
        seen = check_batches(records)
        for _, writer, batch, first, last, _ in acks:
            assert seen[(writer, int(batch))] == (int(first), int(last))
        check_state_agrees(store, "dc1.t", seen, {"w0", "w1"})
        end = store.end_offset("dc1.t", 0)
        assert end > records[-1].offset
        if store.capabilities.dense_offsets:
            assert end == len(records)
        assert store.append("dc1.t", 0, [b"after:0:0:1:"]).first_offset >= end
        check_batches(read_records(store, "dc1.t", 0))


# -- a sick disk --------------------------------------------------------------------------


@pytest.mark.fault
@pytest.mark.requires("segment_files")
def test_full_disk_refuses_appends_cleanly_and_recovers_when_space_returns(
    backend: str,
    small_filesystem: Path,
) -> None:
    store = open_store(small_filesystem / "data")
    try:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        acked = [b"%d" % i + b"." * 2000 for i in range(20)]
        for v in acked:
            store.append("dc1.t", 0, [v])
        filler = small_filesystem / "filler"
        with open(filler, "wb") as f, pytest.raises(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        with pytest.raises(StoreUnavailable):
            for _ in range(50):
                store.append("dc1.t", 0, [b"x" * 60_000])
        assert read_all(store, "dc1.t", 0)[: len(acked)] == acked
        filler.unlink()
        after = store.append("dc1.t", 0, [b"after"])
        values = read_all(store, "dc1.t", 0)
        assert values[after.first_offset] == b"after"
        assert values[: len(acked)] == acked
    finally:
        store.close()
    with open_store(small_filesystem / "data") as reopened:
        assert read_all(reopened, "dc1.t", 0)[-1] == b"after"


@pytest.mark.fault
@pytest.mark.requires("segment_files")
def test_read_only_data_dir_refuses_appends_with_store_unavailable(
    backend: str, small_filesystem: Path
) -> None:
    with open_store(small_filesystem / "data") as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"kept"])
    subprocess.run(["mount", "-o", "remount,ro", str(small_filesystem)], check=True)
    with pytest.raises(StoreUnavailable):
        store = open_store(small_filesystem / "data")
        try:
            store.append("dc1.t", 0, [b"refused"])
        finally:
            store.close()
    subprocess.run(["mount", "-o", "remount,rw", str(small_filesystem)], check=True)
    with open_store(small_filesystem / "data") as store:
        assert read_all(store, "dc1.t", 0) == [b"kept"]
        assert store.append("dc1.t", 0, [b"again"]).first_offset == 1


def test_topic_state_put_if_absent_keeps_the_first_value_for_many_keys(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    assert store.put_topic_state_if_absent("dc1.t", "a", b"1") == b"1"
    won = store.put_topic_state_many_if_absent("dc1.t", {"a": b"2", "b": b"3", "c": b"4"})
    assert won == {"a": b"1", "b": b"3", "c": b"4"}
    assert store.get_topic_state("dc1.t", "b") == b"3"
    with pytest.raises(UnknownTopic):
        store.put_topic_state_many_if_absent("dc1.nope", {"a": b"1"})


@pytest.mark.fault
@pytest.mark.requires("segment_files")
@pytest.mark.parametrize(
    ("point", "killed_batch_kept"),
    [
        ("torn-segment-write", False),
        ("after-segment-write", True),
        ("after-segment-roll", True),
    ],
)
def test_crash_mid_append_keeps_the_batch_whole_or_not_at_all(
    backend: str, tmp_path: Path, point: str, killed_batch_kept: bool
) -> None:
    """A batch cut short is cut off; a synced one not yet indexed is replayed, state included."""
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=8192))
        for batch in range(3):
            store.append("dc1.t", 0, [b"w:%d:%d:2:" % (batch, i) + b"." * 1000 for i in range(2)])
    # batches of 6 KiB: the next append rolls a segment, so every point is reached
    child = subprocess.run(
        [sys.executable, str(APPENDER), str(data_dir), "dc1.t", "0", "k", "5", "6", "1000"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "LOGBROKER_STORE_CRASH_AT": point},
    )
    assert child.returncode == -signal.SIGKILL
    with open_store(data_dir) as store:
        records = read_records(store, "dc1.t", 0)
        acked = [line.split() for line in child.stdout.splitlines()]
        batches = len(acked) + (1 if killed_batch_kept else 0)
        assert len(records) == 6 + 6 * batches
        seen = check_batches(records)
        if batches:
            check_state_agrees(store, "dc1.t", seen, {"k"})
        else:
            assert store.get_state("dc1.t", 0, "last/k") is None
        result = store.append("dc1.t", 0, [b"after:0:0:1:"])
        assert result.first_offset == len(records)
        assert read_all(store, "dc1.t", 0)[-1] == b"after:0:0:1:"
        segments = store.describe_topic("dc1.t").partitions[0].segments
    assert len(list(store_dir_of(data_dir).glob("*.log"))) == segments, "a file not indexed"


def store_dir_of(data_dir: Path) -> Path:
    (partition_dir,) = (data_dir / "topics" / "dc1.t").glob("*/0")
    return partition_dir


def _snapshot_index(partition_dir: Path, into: Path) -> None:
    into.mkdir()
    for name in ("partition.db", "partition.db-wal"):
        if (partition_dir / name).exists():
            shutil.copy2(partition_dir / name, into / name)


def _restore_index(partition_dir: Path, snapshot: Path) -> None:
    for name in ("partition.db", "partition.db-wal", "partition.db-shm"):
        (partition_dir / name).unlink(missing_ok=True)
        if (snapshot / name).exists():
            shutil.copy2(snapshot / name, partition_dir / name)


def test_index_and_state_that_lag_the_segments_are_replayed_from_them(tmp_path: Path) -> None:
    """What a power cut does to the lazily synced index: it comes back older than the log.

    The index and state area are put back to an earlier commit by hand; reopening replays
    every later batch (across segment rolls, state-only batches included) and the partition
    reads and answers as before.
    """
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1, segment_bytes=8192))
        store.transact("dc1.t", 0, lambda s: (s.put("seq/a", b"1"), [b"a1" + b"." * 3000])[1])
        partition_dir = store_dir_of(data_dir)
        store.close()
        _snapshot_index(partition_dir, tmp_path / "index-then")
    with open_store(data_dir) as store:
        for i in range(2, 12):
            value = b"a%d" % i + b"." * 3000
            store.transact("dc1.t", 0, lambda s, i=i, v=value: (s.put("seq/a", b"%d" % i), [v])[1])
        store.transact("dc1.t", 0, lambda s: (s.put("epoch/a", b"7"), [])[1])
        expected = read_all(store, "dc1.t", 0)
        segments = store.describe_topic("dc1.t").partitions[0].segments
        assert segments > 2
    _restore_index(partition_dir, tmp_path / "index-then")
    with open_store(data_dir) as store:
        assert read_all(store, "dc1.t", 0) == expected
        assert store.get_state("dc1.t", 0, "seq/a") == b"11"
        assert store.get_state("dc1.t", 0, "epoch/a") == b"7"
        info = store.describe_topic("dc1.t").partitions[0]
        assert (info.end_offset, info.segments) == (11, segments)
        assert store.append("dc1.t", 0, [b"next"]).first_offset == 11


def test_segment_shorter_than_its_index_is_refused_not_served(tmp_path: Path) -> None:
    """Acknowledged bytes missing from a segment (a disk that lied) are never silently skipped:
    writes are refused (503) and reads say it as damaged data, naming the partition."""
    data_dir = tmp_path / "data"
    with open_store(data_dir) as store:
        store.create_topic("dc1.t", TopicConfig(partitions=1))
        store.append("dc1.t", 0, [b"x" * 100])
        store.append("dc1.t", 0, [b"y" * 100])
    (segment,) = store_dir_of(data_dir).glob("*.log")
    os.truncate(segment, segment.stat().st_size - 10)
    with open_store(data_dir) as store:
        with pytest.raises(CorruptData, match="acknowledged data is missing") as read:
            store.read("dc1.t", 0, 0)
        assert (read.value.topic, read.value.partition) == ("dc1.t", 0)
        with pytest.raises(StoreUnavailable, match=r"dc1\.t/0 is damaged"):
            store.append("dc1.t", 0, [b"z"])
        (described,) = store.describe_topic("dc1.t").partitions
        assert described.damaged is not None and described.end_offset == 2


def test_transaction_knows_the_offset_its_records_will_get(store: LogStore) -> None:
    store.create_topic("dc1.t", TopicConfig(partitions=1))
    store.append("dc1.t", 0, [b"a", b"b"])
    seen: list[int] = []

    def fn(n: int) -> Callable[[PartitionState], Sequence[bytes]]:
        def run(state: PartitionState) -> Sequence[bytes]:
            seen.append(state.next_offset())
            return [b"x"] * n

        return run

    futures = [store.submit("dc1.t", 0, fn(n)) for n in (3, 0, 2)]
    results = [f.result() for f in futures]
    assert seen == [r.first_offset for r in results]
    assert [r.offset for r in store.read("dc1.t", 0, results[0].first_offset).records] == [
        *range(results[0].first_offset, results[0].last_offset + 1),
        *range(results[2].first_offset, results[2].last_offset + 1),
    ]
    if store.capabilities.dense_offsets:
        assert results[0].first_offset == 2 and results[2].first_offset == 5
