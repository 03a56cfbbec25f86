"""An entry's path spelled another way for the same files keeps their sources.

``*.log`` edited to ``*.log*`` (to catch the rotated files), ``./`` put in front, a relative
path given as the absolute one at the next start (the command moved into a unit), a glob given
as the names a shell expanded it to, or a TOML entry's path edited and reloaded: each made the
client take every file of its state for gone, and ship it again from its start under a new
source id (``#g1``) into the same topic, so every line already delivered was there twice.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess, logbroker_cmd
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    until,
    wait_for_lines,
)

_LOG_TYPES = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the module (starting one takes seconds): each test ships its own
    log types, so that no test sees another's topics."""
    base = tmp_path_factory.mktemp("gateway")
    started = GatewayProcess(base / "data", [], base / "gateway.log")
    try:
        yield started.start()
    finally:
        started.kill()


@pytest.fixture
def app() -> str:
    """A log type of this test only."""
    return f"app{next(_LOG_TYPES)}"


def _push_once(
    cwd: Path, server: str, *paths: str, log_type: str, codec: str = "raw"
) -> subprocess.CompletedProcess[str]:
    """A one-shot run (``--idle-exit``) from ``cwd``, with the state dir ``cwd/state``."""
    args = ["--server", server, "--log-type", log_type, "--codec", codec, "--state-dir", "state"]
    args += FAST_FLAGS
    done = subprocess.run(
        logbroker_cmd("push", *args, "--idle-exit", "0.5", *paths),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done


def _files(tmp_path: Path) -> tuple[Path, list[tuple[Path, LineWriter]]]:
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "alias").symlink_to(logs)
    return logs, [(logs / f"k{i}.log", LineWriter(f"k{i}")) for i in (1, 2)]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["logs/*.log"], ["logs/*.log*"]),
        (["logs/*.log"], ["./logs/*.log"]),
        (["logs/*.log"], ["{tmp}/logs/*.log"]),
        (["{tmp}/logs/*.log"], ["logs/k1.log", "logs/k2.log"]),
        (["logs/*.log"], ["alias/*.log"]),
    ],
    ids=[
        "glob-widened",
        "dot-prefix",
        "relative-then-absolute",
        "glob-then-expanded",
        "through-a-symlink",
    ],
)
def test_an_entry_spelled_otherwise_for_the_same_files_ships_every_line_once(
    tmp_path: Path, gateway: GatewayProcess, app: str, before: list[str], after: list[str]
) -> None:
    _logs, files = _files(tmp_path)
    for path, writer in files:
        writer.append(path, 100)
    _push_once(tmp_path, gateway.url, *(p.format(tmp=tmp_path) for p in before), log_type=app)
    first = read_delivered(gateway.data_dir, app)
    for path, writer in files:
        writer.append(path, 50)
    again = _push_once(
        tmp_path, gateway.url, *(p.format(tmp=tmp_path) for p in after), log_type=app
    )
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, *(writer for _path, writer in files))
    assert set(delivered.seqnos) == set(first.seqnos)  # the same two sources, no #g1
    assert "gone since the last run" not in again.stderr
    assert again.stderr.count("is now matched by entry") == 2, again.stderr


def test_a_file_rotated_while_down_is_read_to_its_end_under_the_widened_glob(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    logs, files = _files(tmp_path)
    (k1, writer), _ = files
    writer.append(k1, 100)
    _push_once(tmp_path, gateway.url, "logs/*.log", log_type=app)
    writer.append(k1, 50)
    os.rename(k1, logs / "k1.log.1")  # rotated while the client is down
    writer.append(k1, 30)
    again = _push_once(tmp_path, gateway.url, "logs/*.log*", log_type=app)
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, writer)
    assert len(delivered.seqnos) == 2  # the rotated file's source, and the new k1.log
    assert "gone since the last run" not in again.stderr


def test_a_directory_renamed_while_down_keeps_its_files_sources_under_the_new_entry(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    logs, files = _files(tmp_path)
    for path, writer in files:
        writer.append(path, 100)
    _push_once(tmp_path, gateway.url, "logs/*.log", log_type=app)
    first = read_delivered(gateway.data_dir, app)
    moved = logs.rename(tmp_path / "moved")
    for path, writer in files:
        writer.append(moved / path.name, 50)
    again = _push_once(tmp_path, gateway.url, "moved/*.log", log_type=app)
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, *(writer for _path, writer in files))
    assert set(delivered.seqnos) == set(first.seqnos)
    assert "gone since the last run" not in again.stderr


def test_a_codec_changed_between_two_starts_keeps_the_sources(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    _logs, files = _files(tmp_path)
    for path, writer in files:
        writer.append(path, 100)
    _push_once(tmp_path, gateway.url, "logs/*.log", log_type=app)
    first = read_delivered(gateway.data_dir, app)
    for path, writer in files:
        writer.append(path, 50)
    _push_once(tmp_path, gateway.url, "logs/*.log*", log_type=app, codec="zstd")
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, *(writer for _path, writer in files))
    assert set(delivered.seqnos) == set(first.seqnos)
    assert delivered.codecs == {"raw", "zstd"}


def test_a_codec_changed_by_a_reload_keeps_the_sources(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    """Before: a reload that changed an entry's codec closed its files and shipped them again
    from their start as new sources, every line twice in the same topic."""
    logs, files = _files(tmp_path)
    state = tmp_path / "state"
    config = tmp_path / "push.toml"

    def write_config(codec: str) -> None:
        config.write_text(
            f'[push]\nservers = ["{gateway.url}"]\nstate_dir = "{state}"\n'
            f'[[entry]]\npath = "{logs}/*.log"\nlog_type = "{app}"\ncodec = "{codec}"\n'
        )

    for path, writer in files:
        writer.append(path, 100)
    write_config("raw")
    push = PushProcess(["--config", str(config), *FAST_FLAGS], tmp_path / "push.log").start()
    try:
        push.wait_started(state)
        first = wait_for_lines(gateway.data_dir, app, 200)
        write_config("zstd")
        assert push.proc is not None
        push.proc.send_signal(signal.SIGHUP)
        assert until(lambda: "configuration reloaded" in push.log(), 15), push.log()
        for path, writer in files:
            writer.append(path, 50)
        wait_for_lines(gateway.data_dir, app, 300)
        time.sleep(0.5)  # what a source shipped again would add comes now
        assert push.stop() == 0
    finally:
        push.kill()
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, *(writer for _path, writer in files))
    assert set(delivered.seqnos) == set(first.seqnos)
    assert delivered.codecs == {"raw", "zstd"}
    assert push.log().count("gives it codec zstd (it was raw): it goes on as source") == 2
    assert "closing its source" not in push.log()


def test_a_changed_log_type_is_a_new_source_in_the_new_topic_and_named_so(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    _logs, files = _files(tmp_path)
    old, new = f"{app}-old", f"{app}-new"
    for path, writer in files:
        writer.append(path, 100)
    _push_once(tmp_path, gateway.url, "logs/*.log", log_type=old)
    first = read_delivered(gateway.data_dir, old)
    for path, writer in files:
        writer.append(path, 50)
    again = _push_once(tmp_path, gateway.url, "logs/*.log*", log_type=new)
    writers = [writer for _path, writer in files]
    assert_exactly_once(read_delivered(gateway.data_dir, new), *writers)
    assert read_delivered(gateway.data_dir, old).ids() == first.ids()
    assert "gone since the last run" not in again.stderr
    assert again.stderr.count("is unconfigured since the last run: entry logs/*.log*") == 2
    assert f"gives it log type {new} (it was {old})" in again.stderr


@pytest.mark.parametrize("after", ["logs/*.log*", "alias/*.log"], ids=["glob-widened", "symlink"])
def test_a_reloaded_entry_path_spelled_otherwise_keeps_shipping_the_same_sources(
    tmp_path: Path, gateway: GatewayProcess, app: str, after: str
) -> None:
    logs, files = _files(tmp_path)
    state = tmp_path / "state"
    config = tmp_path / "push.toml"

    def write_config(path: str) -> None:
        config.write_text(
            f'[push]\nservers = ["{gateway.url}"]\nstate_dir = "{state}"\n'
            f'[[entry]]\npath = "{path}"\nlog_type = "{app}"\n'
        )

    for path, writer in files:
        writer.append(path, 100)
    write_config(f"{logs}/*.log")
    push = PushProcess(["--config", str(config), *FAST_FLAGS], tmp_path / "push.log").start()
    try:
        push.wait_started(state)
        first = wait_for_lines(gateway.data_dir, app, 200)
        write_config(f"{tmp_path}/{after}")
        assert push.proc is not None
        push.proc.send_signal(signal.SIGHUP)
        assert until(lambda: "configuration reloaded" in push.log(), 15), push.log()
        for path, writer in files:
            writer.append(path, 50)
        wait_for_lines(gateway.data_dir, app, 300)
        time.sleep(0.5)  # what a source shipped again would add comes now
        assert push.stop() == 0
    finally:
        push.kill()
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, *(writer for _path, writer in files))
    assert set(delivered.seqnos) == set(first.seqnos)
    assert push.log().count("is now matched by entry") == 2
    assert "closing its source" not in push.log()


def test_an_entry_removed_and_put_back_goes_on_with_its_files_sources(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    """Before: the files of an entry left out for one run (commented out, say) and put back
    were let go "unconfigured" and then taken for new content: shipped again from byte 0
    under ``#g1``, every line of them twice in the topic."""
    _logs, files = _files(tmp_path)
    (k1, w1), (k2, w2) = files
    for path, writer in files:
        writer.append(path, 100)
    _push_once(tmp_path, gateway.url, "logs/k1.log", "logs/k2.log", log_type=app)
    first = read_delivered(gateway.data_dir, app)
    w2.append(k2, 20)
    _push_once(tmp_path, gateway.url, "logs/k2.log", log_type=app)  # k1's entry left out
    w1.append(k1, 30)  # written meanwhile: shipped once its entry is back
    w2.append(k2, 10)
    again = _push_once(tmp_path, gateway.url, "logs/k1.log", "logs/k2.log", log_type=app)
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, w1, w2)
    assert set(delivered.seqnos) == set(first.seqnos), again.stderr


def test_an_entry_removed_and_put_back_by_reloads_goes_on_with_its_files_sources(
    tmp_path: Path, gateway: GatewayProcess, app: str
) -> None:
    """The reviewer's sharpest form: an entry commented out (SIGHUP) and restored (SIGHUP)
    shipped its files again in full."""
    _logs, files = _files(tmp_path)
    (k1, w1), (k2, w2) = files
    state = tmp_path / "state"
    config = tmp_path / "push.toml"

    def write_config(*paths: Path) -> None:
        entries = "".join(f'[[entry]]\npath = "{p}"\nlog_type = "{app}"\n' for p in paths)
        config.write_text(f'[push]\nservers = ["{gateway.url}"]\nstate_dir = "{state}"\n{entries}')

    for path, writer in files:
        writer.append(path, 100)
    write_config(k1, k2)
    push = PushProcess(["--config", str(config), *FAST_FLAGS], tmp_path / "push.log").start()
    try:
        push.wait_started(state)
        first = wait_for_lines(gateway.data_dir, app, 200)
        assert push.proc is not None
        write_config(k2)
        push.proc.send_signal(signal.SIGHUP)
        assert until(lambda: "(unconfigured)" in push.log(), 15), push.log()  # let go
        w1.append(k1, 20)  # written while left out
        write_config(k1, k2)
        push.proc.send_signal(signal.SIGHUP)
        assert until(lambda: push.log().count("configuration reloaded") == 2, 15), push.log()
        w1.append(k1, 20)  # and after it is back
        wait_for_lines(gateway.data_dir, app, 240)
        time.sleep(0.5)  # what a source shipped again would add comes now
        assert push.stop() == 0
    finally:
        push.kill()
    delivered = read_delivered(gateway.data_dir, app)
    assert_exactly_once(delivered, w1, w2)
    assert set(delivered.seqnos) == set(first.seqnos)
    assert "is matched by an entry again" in push.log()
