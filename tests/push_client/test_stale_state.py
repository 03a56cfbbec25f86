"""A state dir restored from a snapshot (or a backup) with several installations: clean, with
a valid checksum, and older than the last run.  The installation each source last wrote to is
asked before the source goes elsewhere, and what is written twice anyway (that installation
down past ``position_wait_s``) is an error with the byte range, a metric and a status line."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from push_client.handover import Overlap, SourceHandover, Step
from tests.conftest import REPO, logbroker_cmd
from tests.push_client.conftest import (
    Delivered,
    LineWriter,
    assert_exactly_once_across,
    read_delivered,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]

FAILOVER_FLAGS = ["--failover-after", "1", "--probe-interval", "0.3", "--probe-max-interval", "1"]
LINE = 73
"""Bytes of one line of ``LineWriter`` (``r:000000000 `` and 60 bytes of padding)."""


def _both(dc1: Any, dc2: Any) -> tuple[Delivered, Delivered]:
    return read_delivered(dc1.data_dir, "app", "dc1"), read_delivered(dc2.data_dir, "app", "dc2")


def _wait(predicate: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _status_doc(state: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((state / "status.json").read_bytes())
        return doc
    except (OSError, ValueError):
        return {}


def _status_text(state: Path) -> str:
    return subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    ).stdout


def _restored_state_with_dc1_down(
    tmp_path: Path, start_gateway: Any, start_push: Any, writer: LineWriter
) -> tuple[Any, Any, Path, Path, list[str]]:
    """Ship 1000 lines to dc1 and stop (the snapshot is taken), ship 1000 more and stop,
    restore the snapshot's state.json, kill dc1 and write 500 lines: what a host restored
    from a VM snapshot meets at its next start while dc1 is down."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", *FAILOVER_FLAGS]
    for shipped in (1_000, 2_000):
        writer.append(path, 1_000)
        push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
        _wait(lambda n=shipped: _both(dc1, dc2)[0].count() == n, f"{shipped} lines in dc1")
        assert push.stop() == 0, push.log()
        if shipped == 1_000:
            snapshot = (state / "state.json").read_bytes()
            assert b'"clean":true' in snapshot
    (state / "state.json").write_bytes(snapshot)  # the host is restored from the snapshot
    dc1.kill()  # ... while the installation the file last went to is down
    writer.append(path, 500)
    return dc1, dc2, path, state, extra


def test_a_restored_clean_state_waits_for_the_installation_it_last_wrote_to_then_ships_once(
    tmp_path: Path, start_gateway: Any, start_push: Any
) -> None:
    """The clean state said the file was acknowledged up to line 1000 at dc1; dc1 holds 2000.
    It used to be trusted: the file went to dc2 from line 1000, and lines 1000..1999 were in
    both installations, silently."""
    writer = LineWriter("r")
    dc1, dc2, path, state, extra = _restored_state_with_dc1_down(
        tmp_path, start_gateway, start_push, writer
    )
    push = start_push(
        f"dc1={dc1.url}", state, path, extra=[*extra, "--position-wait", "60"]
    ).wait_started(state)

    def waiting() -> bool:
        files = _status_doc(state).get("files", [])
        return any(f.get("waiting_for") == ["dc1"] for f in files)

    # (the old client never waited: it shipped to dc2 within a few seconds)
    _wait(lambda: waiting() or _both(dc1, dc2)[1].count(), "the wait for dc1's position", 15)
    assert waiting(), push.log()
    assert f"WAITING {path}: for dc1" in _status_text(state)
    time.sleep(2)  # well past failover_after_s: dc1 is marked down, and still nothing moves
    assert _both(dc1, dc2)[1].count() == 0, "shipped to dc2 before knowing what dc1 holds"
    dc1.start()
    _wait(lambda: _both(dc1, dc2)[0].count() >= 2_500, "every line in dc1")
    time.sleep(0.5)
    assert push.stop() == 0, push.log()
    assert_exactly_once_across(list(_both(dc1, dc2)), writer)
    assert "are in both" not in push.log()


def test_an_installation_holding_what_went_elsewhere_is_an_error_a_metric_and_a_status_line(
    tmp_path: Path, start_gateway: Any, start_push: Any
) -> None:
    """dc1 stays down past position_wait_s: the file goes to dc2 from the restored position
    (at-least-once, as documented), and when dc1 answers it holds lines 1000..1999 too.  That
    was silent; now it is an ERROR naming the source, both installations and the bytes, the
    counter logbroker_push_overlap_bytes_total, and an OVERLAP line in --status.  Nothing
    else is written twice: new lines go to dc1 from where dc2 acknowledged."""
    writer = LineWriter("r")
    dc1, dc2, path, state, extra = _restored_state_with_dc1_down(
        tmp_path, start_gateway, start_push, writer
    )
    push = start_push(
        f"dc1={dc1.url}", state, path, extra=[*extra, "--position-wait", "1"]
    ).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[1].count() == 1_500, "lines 1000..2499 in dc2")
    dc1.start()
    said = f"bytes {1_000 * LINE}..{2_000 * LINE} ({1_000 * LINE} bytes) are in both dc1 and dc2"
    _wait(lambda: said in push.log(), "the overlap to be said", 20)
    assert "did not answer within position_wait_s" in push.log()
    assert "ERROR" in next(line for line in push.log().splitlines() if said in line)
    shown = f"OVERLAP {path}: bytes {1_000 * LINE}..{2_000 * LINE} are in both dc1 and dc2"
    _wait(lambda: shown in _status_text(state), "the overlap in --status", 5)
    _wait(
        lambda: (
            f"logbroker_push_overlap_bytes_total {1_000 * LINE}.0"
            in (state / "metrics.prom").read_text()
        ),
        "the overlap counted",
        5,
    )
    writer.append(path, 300)
    _wait(lambda: _both(dc1, dc2)[0].count() >= 2_300, "the new lines in dc1")
    time.sleep(0.5)
    assert push.stop() == 0, push.log()
    first, second = _both(dc1, dc2)
    twice = {f"r:{n:09d}" for n in range(1_000, 2_000)}
    # the documented double write, and nothing else: every other line once
    assert sorted(set(first.ids()) & set(second.ids())) == sorted(twice)
    second.lines = {
        s: [line for line in lines if line.split(b" ", 1)[0].decode() not in twice]
        for s, lines in second.lines.items()
    }
    assert_exactly_once_across([first, second], writer)


def test_a_restored_state_whose_file_moved_to_the_other_installation_after_it_ships_once(
    tmp_path: Path, start_gateway: Any, start_push: Any
) -> None:
    """After the snapshot the file failed over to dc2 (lines 1000..1999 there); the restored
    state says dc1, 1000 lines, and both are up.  The client went on at dc1 from where dc1
    held it (line 1000) and wrote lines 1000..1999 a second time, silently: now the other
    installations are asked at the start before the first session (not waited for)."""
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2")
    path = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("m")
    extra = ["--server", f"dc2={dc2.url}", *FAILOVER_FLAGS, "--position-wait", "1"]
    writer.append(path, 1_000)
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[0].count() == 1_000, "1000 lines in dc1")
    assert push.stop() == 0, push.log()
    snapshot = (state / "state.json").read_bytes()
    dc1.kill()  # the next run fails over: lines 1000..1999 go to dc2
    writer.append(path, 1_000)
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: _both(dc1, dc2)[1].count() == 1_000, "1000 lines in dc2")
    assert push.stop() == 0, push.log()
    dc1.start()
    (state / "state.json").write_bytes(snapshot)  # the host is restored from the snapshot
    writer.append(path, 500)
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
    _wait(lambda: sum(d.count() for d in _both(dc1, dc2)) >= 2_500, "every line")
    time.sleep(1)
    assert push.stop() == 0, push.log()
    assert_exactly_once_across(list(_both(dc1, dc2)), writer)
    assert _both(dc1, dc2)[0].count() == 1_500  # lines 0..999 and 2000..2499


def test_a_restart_with_an_installation_that_refuses_to_answer_ships_to_the_other(
    tmp_path: Path, start_gateway: Any, start_push: Any
) -> None:
    """dc2 does not take this client's token.  The question asked of every installation at a
    start is not asked of it again and again: its refusal is its answer, as for a census."""
    config = tmp_path / "dc2.toml"
    config.write_text('[tokens.dc2-only]\nwrite = ["app"]\n')  # this client has no token
    dc1 = start_gateway(tmp_path / "data-dc1", "--dc", "dc1")
    dc2 = start_gateway(tmp_path / "data-dc2", "--dc", "dc2", "--config", str(config))
    path = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("d")
    extra = ["--server", f"dc2={dc2.url}", *FAILOVER_FLAGS]
    for shipped in (100, 200):
        writer.append(path, 100)
        push = start_push(f"dc1={dc1.url}", state, path, extra=extra).wait_started(state)
        _wait(lambda n=shipped: _both(dc1, dc2)[0].count() == n, f"{shipped} lines in dc1", 20)
        assert push.stop() == 0, push.log()
        assert "installation dc2 refuses to say how far it holds it (HTTP 401" in push.log()
    assert_exactly_once_across([read_delivered(dc1.data_dir, "app", "dc1")], writer)


def test_with_one_installation_a_restored_state_ships_every_line_once(
    tmp_path: Path, start_gateway: Any, start_push: Any
) -> None:
    """The same restore with one installation (a guard, not a fix: it passed before): the
    session's last seqno moves the file past what the old state says, nothing is sent twice,
    and the file rotated after the snapshot is followed by its inode."""
    gateway = start_gateway(tmp_path / "data")
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("o")
    writer.append(path, 1_000)
    push = start_push(gateway.url, state, str(logs / "app.log*")).wait_started(state)
    _wait(lambda: read_delivered(gateway.data_dir, "app").count() == 1_000, "the first run")
    assert push.stop() == 0, push.log()
    snapshot = (state / "state.json").read_bytes()
    writer.append(path, 1_000)
    push = start_push(gateway.url, state, str(logs / "app.log*")).wait_started(state)
    _wait(lambda: read_delivered(gateway.data_dir, "app").count() == 2_000, "the second run")
    assert push.stop() == 0, push.log()
    path.rename(logs / "app.log.1")  # rotated after the snapshot, with lines not shipped yet
    writer.append(logs / "app.log.1", 200)
    writer.append(path, 300)
    (state / "state.json").write_bytes(snapshot)
    push = start_push(gateway.url, state, str(logs / "app.log*")).wait_started(state)
    _wait(lambda: read_delivered(gateway.data_dir, "app").count() >= 2_500, "every line")
    time.sleep(0.5)
    assert push.stop() == 0, push.log()
    assert_exactly_once_across([read_delivered(gateway.data_dir, "app")], writer)


def test_the_first_answer_of_an_installation_in_a_run_is_checked_against_where_data_went() -> None:
    """Units of the overlap check: an installation not asked yet in this run is asked plainly
    (no acked_elsewhere, which would hide what it holds), and an answer above the point from
    which the source went elsewhere is an overlap; one above everything sent elsewhere goes on
    there, so that nothing more is sent twice."""
    plan = SourceHandover(installation="dc1", frontier=1_000)  # a restored state: dc1, 1000
    # dc1 is down past the wait: the source goes to dc2 from 1000
    assert plan.session_fields("dc2", multi=True) == {"fence": True, "acked_elsewhere": 1_000}
    assert plan.on_session("dc2", 1_000, multi=True) == Step(resume_at=1_000)
    plan.on_acked(5_000)
    # dc1 is back: asked what it holds before any handover there
    assert plan.session_fields("dc1", multi=True) == {"fence": True}
    step = plan.on_session("dc1", 3_000, multi=True)
    assert step == Step(reopen=True, overlap=Overlap(1_000, 3_000, "dc1", "dc2"))
    assert plan.session_fields("dc1", multi=True)["acked_elsewhere"] == 5_000
    assert plan.on_session("dc1", 5_000, multi=True) == Step(resume_at=5_000)
    assert plan.overlaps == [Overlap(1_000, 3_000, "dc1", "dc2")]

    # dc1 holds more than dc2 was sent: the overlap ends where dc2's bytes end, and the
    # source goes on at dc1 from its answer (nothing beyond is sent twice)
    plan = SourceHandover(installation="dc1", frontier=1_000)
    plan.on_session("dc2", 1_000, multi=True)
    plan.on_acked(2_000)
    step = plan.on_session("dc1", 9_000, multi=True)
    assert step == Step(resume_at=9_000, overlap=Overlap(1_000, 2_000, "dc1", "dc2"))
    assert plan.installation == "dc1" and plan.frontier == 9_000

    # a file first seen in this run goes to dc2 (dc1 down): dc1 holding none of it is no
    # overlap; dc1 holding some of it (a state that did not know the file) is
    for held, overlap in ((0, None), (700, Overlap(0, 700, "dc1", "dc2"))):
        plan = SourceHandover()
        assert plan.session_fields("dc2", multi=True) == {"fence": True}
        plan.on_session("dc2", 0, multi=True)
        plan.on_acked(800)
        assert plan.session_fields("dc1", multi=True) == {"fence": True}
        assert plan.on_session("dc1", held, multi=True).overlap == overlap

    # the usual way there and back: dc2 holds only what it got before the source left it
    plan = SourceHandover(installation="dc1", frontier=1_000)
    plan.on_session("dc1", 1_000, multi=True)
    plan.on_acked(2_000)
    assert plan.session_fields("dc2", multi=True) == {"fence": True}
    assert plan.on_session("dc2", 400, multi=True) == Step(reopen=True)
    assert plan.on_session("dc2", 2_000, multi=True) == Step(resume_at=2_000)
    plan.on_acked(3_000)
    assert plan.session_fields("dc1", multi=True) == {"fence": True}
    assert plan.on_session("dc1", 2_000, multi=True) == Step(reopen=True)
    assert plan.overlaps == []
