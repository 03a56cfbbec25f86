"""logrotate's other layouts: every line ships exactly once whether the rotations happen while
the client runs or while it is stopped (cleanly, or by SIGKILL).

Rotations while the client was stopped were looked for only in the source's own directory and
only as ``app.log`` with a suffix (``app.log.1``, ``app.log-20261127``): logrotate's ``olddir``
(rotated files moved to another directory) lost the source's rest and every file rotated in
between, and its ``extension`` (``app.1.log``, ``app-2026112701.log``) lost the files rotated in
between; a compressed ``app.1.log.gz`` was passed over without a word.
"""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess
from tests.push_client.conftest import (
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow

_LOG_TYPES = itertools.count()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the module: each test ships its own log type (its own topic)."""
    base = tmp_path_factory.mktemp("gateway")
    started = GatewayProcess(base / "data", [], base / "gateway.log")
    try:
        yield started.start()
    finally:
        started.kill()


@pytest.fixture
def app() -> str:
    return f"names{next(_LOG_TYPES)}"


@dataclass(frozen=True)
class Layout:
    """Where logrotate puts ``app.log`` when it rotates it, and the entry that tails it."""

    name: str
    olddir: str | None
    """logrotate's ``olddir``: "old" (relative to the log's directory), "ABSOLUTE" (a
    directory elsewhere), None (the log's own directory)."""
    rotated_name: Callable[[int], str]
    """The name of the n-th file of a numbered rotation, or of the n-th rotation (dated)."""
    numbered: bool = True
    start: int = 1
    glob: str = "*.log"

    def directory(self, tmp_path: Path) -> Path:
        logs = tmp_path / "logs"
        if self.olddir is None:
            return logs
        return logs / self.olddir if self.olddir != "ABSOLUTE" else tmp_path / "archive"

    def flags(self, tmp_path: Path) -> list[str]:
        return [] if self.olddir is None else ["--olddir", self.setting(tmp_path)]

    def setting(self, tmp_path: Path) -> str:
        assert self.olddir is not None
        return str(self.directory(tmp_path)) if self.olddir == "ABSOLUTE" else self.olddir


LAYOUTS = [
    Layout("olddir", "old", lambda n: f"app.log.{n}"),
    Layout("olddir-absolute", "ABSOLUTE", lambda n: f"app.log.{n}"),
    Layout("olddir-dateext", "old", lambda n: f"app.log-2026112{n}", numbered=False),
    # extension .log: with *.log the rotated names are the glob's, as they always were; an
    # entry naming the log itself did not find the files rotated in between
    Layout("extension", None, lambda n: f"app.{n}.log", glob="app.log"),
    Layout("extension-dateext", None, lambda n: f"app-202611270{n}.log", False, glob="app.log"),
    Layout("extension-start-0", None, lambda n: f"app.{n}.log", start=0, glob="app.log"),
    Layout("start-0", None, lambda n: f"app.log.{n}", start=0),
]


class Rotator:
    """Rotates ``logs/app.log`` as logrotate does in ``layout`` (rename, then create)."""

    def __init__(self, tmp_path: Path, layout: Layout) -> None:
        self.layout = layout
        self.path = tmp_path / "logs" / "app.log"
        self.target = layout.directory(tmp_path)
        self.target.mkdir(parents=True, exist_ok=True)
        self.rotations = 0

    def rotate(self) -> Path:
        """Rotate once; return the rotated file's new path."""
        layout = self.layout
        self.rotations += 1
        if layout.numbered:
            name_of = layout.rotated_name
            last = layout.start
            while (self.target / name_of(last)).exists():
                last += 1
            for n in range(last - 1, layout.start - 1, -1):
                os.rename(self.target / name_of(n), self.target / name_of(n + 1))
            rotated = self.target / name_of(layout.start)
        else:
            rotated = self.target / layout.rotated_name(self.rotations)
        os.rename(self.path, rotated)
        self.path.touch()
        return rotated


def _start(
    gateway: GatewayProcess,
    start_push,
    tmp_path: Path,
    layout: Layout,
    app: str,
    grace: str = "1",
) -> PushProcess:
    state = tmp_path / "state"
    push = start_push(
        gateway.url,
        state,
        tmp_path / "logs" / layout.glob,
        log_type=app,
        extra=["--rotated-grace", grace, *layout.flags(tmp_path)],
    )
    return push.wait_started(state)


@pytest.mark.parametrize("stop", ["clean", "sigkill"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def test_rotations_while_stopped_ship_every_line_once(
    tmp_path: Path, gateway, start_push, app: str, layout: Layout, stop: str
) -> None:
    (tmp_path / "logs").mkdir()
    rotator = Rotator(tmp_path, layout)
    writer = LineWriter("rn")
    writer.append(rotator.path, 200)
    push = _start(gateway, start_push, tmp_path, layout, app)
    wait_for_lines(gateway.data_dir, app, 200)
    if stop == "clean":
        assert push.stop() == 0, push.log()
    else:
        time.sleep(1.5)  # its position saved (every 0.5 s) ...
        writer.append(rotator.path, 100)  # ... and lines it may or may not have sent
        time.sleep(0.2)
        push.kill()
    time.sleep(1.1)  # file times after the last save, whatever the clock's granularity
    writer.append(rotator.path, 100)  # the rest of the source, written while stopped
    for _ in range(3):  # the source ends up rotated three times, two files in between
        rotator.rotate()
        writer.append(rotator.path, 100)
    push = _start(gateway, start_push, tmp_path, layout, app)
    wait_for_lines(gateway.data_dir, app, len(writer.ids), timeout_s=30)
    time.sleep(1.0)  # a moment for lines that should not come
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(gateway.data_dir, app), writer)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def test_rotations_while_running_then_killed_ship_every_line_once(
    tmp_path: Path, gateway, start_push, app: str, layout: Layout
) -> None:
    """A rename to the layout's name while the client runs is followed by inode; a client
    killed while it still reads the renamed file finds it again at its start, also in an
    ``olddir``, where the application that kept its descriptor went on writing."""
    (tmp_path / "logs").mkdir()
    rotator = Rotator(tmp_path, layout)
    writer = LineWriter("rr")
    writer.append(rotator.path, 100)
    # renamed files are read while they grow, let go once quiet for the grace (5 minutes)
    push = _start(gateway, start_push, tmp_path, layout, app, grace="300")
    wait_for_lines(gateway.data_dir, app, 100)
    late: Path | None = None
    for _ in range(3):
        handle = open(rotator.path, "ab")  # noqa: SIM115 - the application's descriptor
        late = rotator.rotate()
        handle.write(writer.lines(50))  # written before it reopens its log
        handle.close()
        writer.append(rotator.path, 100)
        wait_for_lines(gateway.data_dir, app, len(writer.ids), timeout_s=30)
    time.sleep(1.5)  # positions saved
    push.kill()
    assert late is not None
    with open(late, "ab") as handle:  # the newest rotated file, still written ...
        handle.write(writer.lines(50))
    writer.append(rotator.path, 100)  # ... and the log itself
    push = _start(gateway, start_push, tmp_path, layout, app, grace="300")
    wait_for_lines(gateway.data_dir, app, len(writer.ids), timeout_s=30)
    time.sleep(1.0)
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(gateway.data_dir, app), writer)


def test_compressed_file_rotated_with_extension_while_stopped_is_named(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    """logrotate's ``extension .log`` with ``compress``: ``app.1.log.gz``.  The bytes of the
    source it holds that were not shipped are named, not passed over."""
    layout = Layout("extension", None, lambda n: f"app.{n}.log", glob="app.log")
    (tmp_path / "logs").mkdir()
    rotator = Rotator(tmp_path, layout)
    shipped, lost = LineWriter("ok"), LineWriter("lost")
    shipped.append(rotator.path, 100)
    push = _start(gateway, start_push, tmp_path, layout, app)
    wait_for_lines(gateway.data_dir, app, 100)
    assert push.stop() == 0, push.log()
    acked = rotator.path.stat().st_size
    lost.append(rotator.path, 50)
    held = rotator.path.stat().st_size
    rotated = rotator.rotate()
    with open(rotated, "rb") as src, gzip.open(f"{rotated}.gz", "wb") as gz:
        shutil.copyfileobj(src, gz)
    rotated.unlink()
    shipped.append(rotator.path, 50)
    push = _start(gateway, start_push, tmp_path, layout, app)
    wait_for_lines(gateway.data_dir, app, 150, timeout_s=30)
    time.sleep(1.0)
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(gateway.data_dir, app), shipped)
    said = push.log_path.read_text(errors="replace")
    assert (
        "app.1.log.gz rotated from app.log while the client was stopped and compressed "
        f"(gzip): bytes {acked}..{held} of source"
    ) in said, said[-3000:]


def test_a_file_in_an_olddir_shared_by_two_logs_of_one_name_is_named_not_guessed(
    tmp_path: Path, gateway, start_push, app: str
) -> None:
    """``/a/app.log`` and ``/b/app.log`` rotated into one absolute olddir: a file rotated
    there in between while the client was stopped may be either's, so it is not shipped
    under one of them by a guess; it is named.  The two sources themselves are found there
    by inode and finished."""
    logs, archive, state = tmp_path / "logs", tmp_path / "archive", tmp_path / "state"
    for directory in (logs / "a", logs / "b", archive):
        directory.mkdir(parents=True)
    wa, wb, unsure = LineWriter("a"), LineWriter("b"), LineWriter("unsure")
    wa.append(logs / "a" / "app.log", 100)
    wb.append(logs / "b" / "app.log", 100)
    extra = ["--rotated-grace", "1", "--olddir", str(archive)]
    push = start_push(gateway.url, state, logs / "*" / "app.log", log_type=app, extra=extra)
    push.wait_started(state)
    wait_for_lines(gateway.data_dir, app, 200)
    assert push.stop() == 0, push.log()
    time.sleep(1.1)  # file times after the last save
    wa.append(logs / "a" / "app.log", 50)
    wb.append(logs / "b" / "app.log", 50)
    os.rename(logs / "a" / "app.log", archive / "app.log-20261101")
    unsure.append(logs / "a" / "app.log", 30)  # rotated in between: a's, or b's?
    os.rename(logs / "a" / "app.log", archive / "app.log-20261102")
    wa.append(logs / "a" / "app.log", 20)
    os.rename(logs / "b" / "app.log", archive / "app.log-20261103")
    wb.append(logs / "b" / "app.log", 20)
    push = start_push(gateway.url, state, logs / "*" / "app.log", log_type=app, extra=extra)
    push.wait_started(state)
    wait_for_lines(gateway.data_dir, app, 340, timeout_s=30)
    time.sleep(1.5)  # a moment for lines that should not come, and the status
    status = (state / "status.json").read_text()
    assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(gateway.data_dir, app), wa, wb)
    said = push.log_path.read_text(errors="replace")
    shared = archive / "app.log-20261102"
    assert (
        f"{shared} rotated from {logs / 'a' / 'app.log'} or {logs / 'b' / 'app.log'} while the "
        "client was stopped (an olddir they share): which one's cannot be told"
    ) in said, said[-3000:]
    assert str(shared) in status
