"""Durability against power loss, not only against ``kill -9``.

SIGKILL keeps the page cache, so it cannot tell a missing fsync.  These tests trace real runs
(the embedded store appending from several threads; a real gateway fed by a real push-client)
with an ``LD_PRELOAD`` shim that journals every write and sync, then rebuild the files as a
power cut just before each sync of the run would have left them (powercut.py), reopen them
and check: every acknowledged append is there at its offsets, nothing is torn or corrupt, the
seqno table is exact, the push-client's state file is whole and never ahead of the log, and the
client resumes without loss or duplicate.  The negative controls replay the same runs as if one
sync of the product were missing, and show that the checks then fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from log_store import StoreUnavailable, UnknownTopic, open_store
from push_client.state_file import CorruptStateFile, decode_state
from session_dedup.seqno_table import decode_seqno, rebuild_from_records, seqno_key
from tests.conftest import free_port, logbroker_cmd
from tests.durability.powercut import (
    PowerCut,
    Record,
    build_shim,
    power_cuts,
    read_journal,
    traced_env,
)
from tests.durability.store_workload import TOPIC, record_values
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    assert_exactly_once,
    read_delivered,
)

REPO = Path(__file__).resolve().parents[2]
TRANSACTIONS = 160

pytestmark = [pytest.mark.fault, pytest.mark.slow]


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(tmp_path_factory.mktemp("powercut-shim"))


@pytest.fixture(scope="module")
def store_run(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> tuple[list[Record], Path]:
    """One traced run of the store workload: its journal and its (traced) data dir."""
    base = tmp_path_factory.mktemp("store-run")
    root = base / "root"
    root.mkdir()
    journal = base / "journal"
    journal.touch()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.durability.store_workload",
            str(root / "data"),
            str(journal),
            str(TRANSACTIONS),
        ],
        env=traced_env(shim, journal, [root]),
        cwd=REPO,
        check=True,
        timeout=120,
    )
    return read_journal(journal), root


def check_store_after_cut(data_dir: Path, marks: tuple[str, ...]) -> None:
    """What a reopened store must show after a power cut, given what had been acknowledged."""
    acked: dict[int, tuple[int, int, str]] = {}
    epochs: dict[str, int] = {}
    acked_start = 0
    for text in marks:
        kind, *args = text.split()
        if kind == "ACK":
            acked[int(args[0])] = (int(args[1]), int(args[2]), args[3])
        elif kind == "EPOCH":
            epochs[args[0]] = max(epochs.get(args[0], 0), int(args[1]))
        elif kind == "START":
            acked_start = int(args[0])
    if not (data_dir / "catalog.db").exists():
        assert not acked and not epochs, "the data dir is gone, acknowledged appends with it"
        return
    with open_store(data_dir) as store:
        if not store.list_topics():
            assert not acked and not epochs, "the topic is gone, acknowledged appends with it"
            return
        info = store.describe_topic(TOPIC).partitions[0]
        assert info.damaged is None, f"refused to serve: {info.damaged}"
        assert info.start_offset >= acked_start, "an acknowledged deletion was undone"
        offset = info.start_offset
        present: dict[int, tuple[int, int, str]] = {}
        while offset < info.end_offset:
            first = offset
            values = []
            while not values or len(values) < int(values[0].split(b":")[2]):
                (record,) = store.read(TOPIC, 0, offset, 1).records
                values.append(record.value)
                offset += 1
            txn, _, _, source = values[0].decode().split(":")[:4]
            assert values == record_values(int(txn), source), f"torn or corrupt at {first}"
            present[int(txn)] = (first, offset - 1, source)
        for txn, (first, last, source) in acked.items():
            if first >= info.start_offset:
                assert present.get(txn) == (first, last, source), f"acked txn {txn} lost"
        newest: dict[str, int] = {}
        for txn, (_, _, source) in sorted(present.items(), key=lambda kv: kv[1][0]):
            newest[source] = txn
        for source, txn in newest.items():
            stored = store.get_state(TOPIC, 0, f"seq/{source}")
            assert stored == str(txn).encode(), f"seqno of {source} is {stored!r}, log has {txn}"
        for source, epoch in epochs.items():
            stored_epoch = int(store.get_state(TOPIC, 0, f"epoch/{source}") or b"0")
            assert stored_epoch >= epoch, f"acked epoch {epoch} of {source} lost"
        assert store.append(TOPIC, 0, [b"after the cut"]).first_offset == info.end_offset


def check_every_cut(
    records: list[Record],
    root: Path,
    scratch: Path,
    check: Callable[[PowerCut, dict[Path, Path]], None],
    *,
    drop_sync: Callable[[str], bool] | None = None,
    every: int = 1,
) -> int:
    """Run ``check`` on the files each power cut leaves; returns the number of cuts."""
    cuts = 0
    for cut in power_cuts(records, [root], drop_sync=drop_sync, every=every):
        image = scratch / f"cut{cut.index}"
        check(cut, cut.disk.materialize(image))
        cuts += 1
    return cuts


def test_every_acked_append_survives_a_power_cut_at_any_sync(
    store_run: tuple[list[Record], Path], tmp_path: Path
) -> None:
    records, root = store_run
    syncs = sum(r.op in (b"S", b"D") for r in records)
    assert syncs > 60, "the run should hold many group commits, rolls and a deletion"

    def check(cut: PowerCut, placed: dict[Path, Path]) -> None:
        check_store_after_cut(placed[root] / "data", cut.marks)

    cuts = check_every_cut(records, root, tmp_path, check)
    assert cuts > 60


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(lambda path: path.endswith(".log"), id="segment-fdatasync"),
        pytest.param(lambda path: path.endswith("/0"), id="partition-directory-fsync"),
    ],
)
def test_a_missing_store_sync_is_caught(
    store_run: tuple[list[Record], Path], tmp_path: Path, missing: Callable[[str], bool]
) -> None:
    """Negative control: the same run, replayed as if the store had skipped one of its syncs."""
    records, root = store_run
    failures: list[str] = []

    def check(cut: PowerCut, placed: dict[Path, Path]) -> None:
        try:
            check_store_after_cut(placed[root] / "data", cut.marks)
        except (AssertionError, StoreUnavailable) as exc:  # found out, or refused to serve
            failures.append(str(exc))

    check_every_cut(records, root, tmp_path, check, drop_sync=missing, every=2)
    assert failures, "a store without this sync passed the power-cut check"


# -- gateway and push-client ----------------------------------------------------------------

FILES = 3
TICKS = 40
LINES_PER_TICK = 25


class TracedGateway:
    """``logbroker serve`` in its own process group, optionally traced."""

    def __init__(self, data_dir: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                logbroker_cmd("serve", "--data-dir", str(data_dir), "--port", str(self.port)),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"the gateway did not start: {log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def push_until_idle(
    url: str, state_dir: Path, logs: Path, log_path: Path, env: dict[str, str] | None
) -> None:
    """Run the push-client until it has shipped everything and been idle for a second."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            logbroker_cmd(
                "push",
                "--server",
                url,
                "--log-type",
                "app",
                "--state-dir",
                str(state_dir),
                *FAST_FLAGS,
                "--idle-exit",
                "1",
                str(logs / "*.log"),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
    try:
        assert proc.wait(90) == 0, log_path.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@dataclass
class ShippingRun:
    records: list[Record]
    data_root: Path
    state_root: Path
    logs: Path
    writers: list[LineWriter]


@pytest.fixture(scope="module")
def shipping_run(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> ShippingRun:
    """A traced gateway and push-client shipping lines appended to 3 files as they grow."""
    base = tmp_path_factory.mktemp("shipping-run")
    data_root, state_root, logs = base / "data", base / "state", base / "logs"
    for d in (data_root, state_root, logs):
        d.mkdir()
    journal = base / "journal"
    journal.touch()
    env = traced_env(shim, journal, [data_root, state_root])
    writers = [LineWriter(f"f{i}") for i in range(FILES)]
    paths = [logs / f"f{i}.log" for i in range(FILES)]
    for path in paths:
        path.touch()
    gateway = TracedGateway(data_root, base / "gateway.log", env)
    try:

        def grow() -> None:
            for _ in range(TICKS):
                for writer, path in zip(writers, paths, strict=True):
                    writer.append(path, LINES_PER_TICK)
                time.sleep(0.03)

        grower = threading.Thread(target=grow)
        grower.start()
        push_until_idle(gateway.url, state_root, logs, base / "push.log", env)
        grower.join()
    finally:
        gateway.kill()
    return ShippingRun(read_journal(journal), data_root, state_root, logs, writers)


def check_shipping_after_cut(data_dir: Path, state_dir: Path) -> None:
    """The client's state is whole and never ahead of the log; the seqno table is exact."""
    state_path = state_dir / "state.json"
    positions = decode_state(state_path.read_bytes()).sources if state_path.exists() else {}
    if not (data_dir / "catalog.db").exists():
        assert not any(p.acked for p in positions.values()), "acked lines, and no log at all"
        return
    with open_store(data_dir) as store:
        try:
            info = store.describe_topic("dc1.app")
        except UnknownTopic:
            assert not any(p.acked for p in positions.values()), "acked lines, and no topic"
            return
        logged: dict[str, int] = {}
        for part in info.partitions:
            records = []
            offset = part.start_offset
            while offset < part.end_offset:
                read = store.read("dc1.app", part.partition, offset)
                records.extend(read.records)
                offset = read.next_offset
            table = rebuild_from_records(records)
            for source_id, last in table.items():
                stored = decode_seqno(
                    store.get_state("dc1.app", part.partition, seqno_key(source_id))
                )
                assert stored == last, f"seqno table says {stored} for {source_id}, log {last}"
            logged.update(table)
    for source_id, position in positions.items():
        assert position.acked <= logged.get(source_id, 0), (
            f"the client's saved position {position.acked} of {source_id} is past the log "
            f"({logged.get(source_id, 0)}): acknowledged lines were lost"
        )


def _cut_images(
    run: ShippingRun, scratch: Path, drop_sync: Callable[[str], bool] | None = None
) -> Iterator[tuple[PowerCut, Path, Path]]:
    for cut in power_cuts(run.records, [run.data_root, run.state_root], drop_sync=drop_sync):
        placed = cut.disk.materialize(scratch / f"cut{cut.index}")
        yield cut, placed[run.data_root], placed[run.state_root]


def test_push_client_and_gateway_survive_a_power_cut_at_any_sync(
    shipping_run: ShippingRun, tmp_path: Path
) -> None:
    run = shipping_run
    state_saves = sum(r.op == b"R" and r.fields[1].endswith("/state.json") for r in run.records)
    assert state_saves >= 2, "the client should have saved its state more than once"
    images = []
    for _cut, data_dir, state_dir in _cut_images(run, tmp_path):
        check_shipping_after_cut(data_dir, state_dir)
        images.append((data_dir, state_dir))
    # Resume from an early, a middle and the last image: every line exactly once.
    for n, (data_dir, state_dir) in enumerate(
        [images[len(images) // 4], images[len(images) // 2], images[-1]]
    ):
        gateway = TracedGateway(data_dir, tmp_path / f"resume-gateway-{n}.log")
        try:
            push_until_idle(gateway.url, state_dir, run.logs, tmp_path / f"resume-{n}.log", None)
        finally:
            gateway.kill()
        assert not list(state_dir.glob("state.json.corrupt-*"))
        assert_exactly_once(read_delivered(data_dir, "app"), *run.writers)


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(lambda path: path.endswith("/state.json.tmp"), id="client-state-fsync"),
        pytest.param(lambda path: path.endswith(".log"), id="gateway-segment-fdatasync"),
    ],
)
def test_a_missing_sync_of_client_or_gateway_is_caught(
    shipping_run: ShippingRun, tmp_path: Path, missing: Callable[[str], bool]
) -> None:
    """Negative control: the same run, replayed as if the client or the gateway skipped a sync."""
    failures = []
    for _cut, data_dir, state_dir in _cut_images(shipping_run, tmp_path, missing):
        try:
            check_shipping_after_cut(data_dir, state_dir)
        except (AssertionError, CorruptStateFile, StoreUnavailable) as exc:
            failures.append(exc)
    assert failures, "a run without this sync passed the power-cut check"
