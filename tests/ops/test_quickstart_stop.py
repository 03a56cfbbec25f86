"""scripts/quickstart.sh stops every process it started, whatever signal it gets and however
often: the gateway and the push-client run in sessions of their own, so a signal to the
script's process group does not reach them.

The script runs in a copy of the repository whose ``bootstrap.sh`` puts stand-ins for
``logbroker`` and ``python`` first on the PATH: each records its pid and, like the real reader
leaving its group, takes a while to stop on TERM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAND_IN = """#!/usr/bin/env bash
# python -c ...: the script's checks that the gateway answers
[[ ${1-} == -c ]] && exit 0
echo "$$ ${1-}" >> "$FAKE_PIDS"
trap 'sleep 0.5; exit 0' TERM
while :; do sleep 0.05; done
"""
ROLES = {"serve", "scripts/sample_log.py", "push", "read"}


@pytest.fixture
def fake_repo(tmp_path: Path) -> Iterator[Path]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "quickstart.sh", repo / "scripts" / "quickstart.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("logbroker", "python"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    (repo / "scripts" / "bootstrap.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    yield repo
    for pid in _started(tmp_path / "pids"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _started(pids_file: Path) -> dict[int, str]:
    if not pids_file.exists():
        return {}
    rows = (line.split(" ", 1) for line in pids_file.read_text().splitlines() if line)
    return {int(pid): role for pid, role in rows}


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _start(repo: Path, *prefix: str) -> tuple[subprocess.Popen[bytes], Path]:
    pids_file = repo.parent / "pids"
    env = {**os.environ, "FAKE_PIDS": str(pids_file), "DEMO_DIR": str(repo.parent / "demo")}
    script = subprocess.Popen(
        [*prefix, "bash", "scripts/quickstart.sh"],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        # a file, not a pipe: a process left running would hold a pipe open
        stderr=(repo.parent / "stderr").open("wb"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while set(_started(pids_file).values()) != ROLES:
        assert time.monotonic() < deadline, _started(pids_file)
        time.sleep(0.05)
    return script, pids_file


def _assert_all_stopped(script: subprocess.Popen[bytes], pids_file: Path) -> None:
    script.wait(15)
    assert b"quickstart: stopping" in (pids_file.parent / "stderr").read_bytes()
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in _started(pids_file)):
        left = {role for pid, role in _started(pids_file).items() if _running(pid)}
        assert time.monotonic() < deadline, f"still running: {left}"
        time.sleep(0.05)


@pytest.mark.parametrize("signals", [1, 2, 5])
def test_every_process_is_stopped_however_often_the_script_gets_term(
    fake_repo: Path, signals: int
) -> None:
    script, pids_file = _start(fake_repo)
    for _ in range(signals):  # the later ones arrive while the reader takes its time to stop
        os.kill(script.pid, signal.SIGTERM)
        time.sleep(0.3)
    _assert_all_stopped(script, pids_file)


def test_a_timeout_stops_every_process(fake_repo: Path) -> None:
    # timeout(1) sends TERM to the script and to its process group (the reader, the sample log)
    script, pids_file = _start(fake_repo, "timeout", "2")
    _assert_all_stopped(script, pids_file)


def test_interrupt_then_term_stops_every_process(fake_repo: Path) -> None:
    script, pids_file = _start(fake_repo)
    os.kill(script.pid, signal.SIGINT)
    time.sleep(0.3)
    os.kill(script.pid, signal.SIGTERM)
    _assert_all_stopped(script, pids_file)
