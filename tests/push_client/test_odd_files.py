"""Files a real host has beside its logs: names that are not UTF-8, and the like."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, logbroker_cmd
from tests.metrics_text import sample
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


def test_a_file_whose_name_is_not_utf8_ships_once_beside_the_others(
    tmp_path: Path, gateway, start_push
) -> None:
    """A Latin-1 file name in the glob's directory must not stop the client: it once died
    writing its status (JSON holds no undecodable bytes), and nothing at all was shipped."""
    logs = tmp_path / "logs"
    logs.mkdir()
    plain, odd = LineWriter("plain"), LineWriter("odd")
    plain.append(logs / "plain.log", 500)
    odd_path = Path(os.fsdecode(bytes(logs) + b"/caf\xe9.log"))
    odd.append(odd_path, 500)
    state = tmp_path / "state"
    first = start_push(gateway.url, state, logs / "*.log").wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 1_000)
    status = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        cwd=REPO,
        timeout=30,
    )
    assert status.returncode == 0, status.stderr
    assert b"caf\\xe9.log" in status.stdout
    assert b"caf\\\\xe9.log" in (state / "metrics.prom").read_bytes()
    assert first.stop() == 0, first.log()
    plain.append(logs / "plain.log", 300)
    odd.append(odd_path, 300)
    # The positions of the odd file survive the restart: nothing is asked of the gateway
    # twice, and the state file is not taken for corrupt.
    second = start_push(gateway.url, state, logs / "*.log")
    delivered = wait_for_lines(gateway.data_dir, "app", 1_600)
    assert second.stop() == 0, second.log()
    assert_exactly_once(delivered, plain, odd)
    assert "corrupt" not in second.log()
    assert not list(state.glob("state.json.corrupt-*"))


_DROP = "-dac_override,-dac_read_search"
_WITHOUT_ROOT_RIGHTS = (
    ["setpriv", f"--inh-caps={_DROP}", f"--bounding-set={_DROP}"] if os.geteuid() == 0 else []
)
"""As root, run without the rights to read any file (util-linux's ``setpriv``, in every
Debian), as the packaged unit's ``logbroker`` user meets a log it has no permission on; any
other user meets ``chmod 0`` as it is."""


def _push_without_root_rights(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_WITHOUT_ROOT_RIGHTS, *logbroker_cmd("push", *args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_a_file_the_client_may_not_read_is_named_and_a_one_shot_run_exits_1(
    tmp_path: Path, gateway
) -> None:
    """A matched file that cannot be opened was skipped without a word: not in the log, not
    in --status, and a one-shot run exited 0 as if everything had been shipped."""
    logs = tmp_path / "logs"
    logs.mkdir()
    readable, secret = LineWriter("readable"), LineWriter("secret")
    readable.append(logs / "readable.log", 300)
    secret.append(logs / "secret.log", 300)
    (logs / "secret.log").chmod(0)
    state = tmp_path / "state"
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state)]
    args += [*FAST_FLAGS, "--idle-exit", "3", str(logs / "*.log")]
    first = _push_without_root_rights(*args)
    assert first.returncode == 1, first.stderr
    # said once, not at every rescan (one a second)
    assert first.stderr.count(f"cannot read {logs / 'secret.log'}: Permission denied") == 1
    assert f"{logs / 'secret.log'} was not shipped: cannot read it" in first.stderr
    status = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert f"UNREADABLE {logs / 'secret.log'}" in status.stdout, status.stdout
    metrics = (state / "metrics.prom").read_text()
    assert sample(metrics, "logbroker_push_unreadable_files") == 1
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), readable)

    (logs / "secret.log").chmod(0o644)
    second = _push_without_root_rights(*args)
    assert second.returncode == 0, second.stderr
    assert_exactly_once(wait_for_lines(gateway.data_dir, "app", 600), readable, secret)


def test_a_file_unreadable_at_a_restart_is_resumed_where_it_was_not_shipped_again(
    tmp_path: Path, gateway
) -> None:
    """A file of the state that could not be opened at a restart was taken for gone: its
    position retired, and once readable again it was a new source (``#g1``) shipped again
    from its start, every line twice."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    writer = LineWriter("held")
    writer.append(log, 300)
    state = tmp_path / "state"
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    assert _push_without_root_rights(*args, "--idle-exit", "1", str(logs / "*.log")).returncode == 0
    log.chmod(0)
    held = _push_without_root_rights(*args, "--idle-exit", "1", str(logs / "*.log"))
    assert held.returncode == 1, held.stderr
    assert "its position (" in held.stderr and "is kept" in held.stderr, held.stderr
    assert "gone since the last run" not in held.stderr
    # A daemon that starts while the file cannot be read, and it becomes readable meanwhile.
    daemon = PushProcess([], tmp_path / "push.log")
    daemon.proc = subprocess.Popen(
        [*_WITHOUT_ROOT_RIGHTS, *logbroker_cmd("push", *args, str(logs / "*.log"))],
        stdout=open(daemon.log_path, "ab"),  # noqa: SIM115 - the child's log
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    try:
        daemon.wait_started(state)
        writer.append(log, 200)
        log.chmod(0o644)
        delivered = wait_for_lines(gateway.data_dir, "app", 500)
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.kill()
    assert "#g1" not in daemon.log()
    assert_exactly_once(delivered, writer)
    writer.append(log, 100)
    last = _push_without_root_rights(*args, "--idle-exit", "1", str(logs / "*.log"))
    assert last.returncode == 0, last.stderr
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)


def test_more_files_than_descriptors_ships_those_it_can_open_and_names_the_rest(
    tmp_path: Path, gateway
) -> None:
    """With more matched files than open descriptors, the client opened files until none was
    left for its own connections: every request failed (Too many open files) and nothing at
    all was shipped, forever."""
    logs = tmp_path / "logs"
    logs.mkdir()
    writers = [LineWriter(f"f{i:03d}") for i in range(120)]
    for i, writer in enumerate(writers):
        writer.append(logs / f"{i:03d}.log", 5)
    state = tmp_path / "state"

    def limit_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    out = subprocess.run(
        logbroker_cmd("push", *args, "--idle-exit", "2", str(logs / "*.log")),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        preexec_fn=limit_descriptors,
    )
    assert out.returncode == 1, out.stderr
    assert "Too many open files" not in out.stderr, out.stderr[-3000:]
    assert "the most this process may hold" in out.stderr
    delivered = read_delivered(gateway.data_dir, "app")
    shipped = {line_id.split(":")[0] for line_id in delivered.ids()}
    assert len(shipped) >= 50, f"only {len(shipped)} files shipped"
    assert_exactly_once(delivered, *[w for w in writers if w.tag in shipped])


def _start_without_root_rights(args: list[str], log_path: Path) -> PushProcess:
    daemon = PushProcess(args, log_path)
    daemon.proc = subprocess.Popen(
        [*_WITHOUT_ROOT_RIGHTS, *logbroker_cmd("push", *args)],
        stdout=open(log_path, "ab"),  # noqa: SIM115 - the child's log
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    return daemon


def _push_status(state: Path) -> str:
    out = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _reported_files(
    gateway: Any, path_prefix: str, timeout_s: float = 20.0
) -> dict[str, dict[str, Any]]:
    """The files of this client's last lag report as the gateway's dashboard shows them,
    once it names a file under ``path_prefix`` as not being shipped normally."""
    deadline = time.monotonic() + timeout_s
    rows: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        doc = httpx.get(gateway.url + "/v1/ui/overview", timeout=30).json()
        rows = {
            f["path"]: f
            for c in doc["push_clients"]
            for f in c["files"]
            if f["path"].startswith(path_prefix)
        }
        if any(f["phase"] != "active" for f in rows.values()):
            return rows
        time.sleep(0.5)
    return rows


def test_an_unreadable_file_is_in_the_lag_report_status_and_metrics_with_its_bytes_behind(
    tmp_path: Path, gateway
) -> None:
    """A file the client may not open was only a line of --status and a count: the gateway's
    dashboard (the lag report) did not list it at all, and nothing said how much of it was
    waiting, so an operator watching lag saw every host caught up."""
    logs = tmp_path / "logs"
    logs.mkdir()
    readable, secret = LineWriter("readable"), LineWriter("secret")
    readable.append(logs / "readable.log", 100)
    secret.append(logs / "secret.log", 100)
    secret_size = (logs / "secret.log").stat().st_size
    (logs / "secret.log").chmod(0)
    state = tmp_path / "state"
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    daemon = _start_without_root_rights([*args, str(logs / "*.log")], tmp_path / "push.log")
    try:
        daemon.wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 100)
        reported = _reported_files(gateway, str(logs))
        row = reported.get(str(logs / "secret.log"))
        assert row is not None, reported
        assert (row["phase"], row["errno"]) == ("unreadable: Permission denied", "EACCES"), row
        assert (row["acked"], row["size"], row["lag_bytes"]) == (0, secret_size, secret_size)
        assert reported[str(logs / "readable.log")]["phase"] == "active"
        status = _push_status(state)
        assert f"UNREADABLE {logs / 'secret.log'} since " in status, status
        assert f": Permission denied [EACCES] (not shipped; {secret_size} bytes behind)" in status
        # the total counts what it owes (it said "total lag 0 bytes" beside that line)
        owed = f"total lag {secret_size} bytes ({secret_size} of them in 1 unreadable file)"
        assert owed in status, status
        doc = json.loads((state / "status.json").read_bytes())
        (miss,) = doc["unreadable"]
        assert (miss["error"], miss["errno"]) == ("Permission denied", "EACCES"), miss
        metrics = (state / "metrics.prom").read_text()
        labels = {"file": str(logs / "secret.log"), "source": ""}
        assert sample(metrics, "logbroker_push_lag_bytes", **labels) == secret_size
        unreadable = {**labels, "what": "unreadable", "error": "Permission denied"}
        unreadable["errno"] = "EACCES"
        assert sample(metrics, "logbroker_push_file_unreadable", **unreadable) == 1
        assert daemon.stop() == 0, daemon.log()
    finally:
        daemon.kill()


def test_a_directory_that_loses_search_permission_is_shown_and_said_once_each_way(
    tmp_path: Path, gateway
) -> None:
    """A directory that lost its search permission (x) under a running client: "cannot
    stat" was logged at every poll (ten lines a second) for each tailed file in it, --status
    and the lag report showed the file as an ordinary active one, and a file created in it
    meanwhile was in none of them (it cannot even be stat'ed to be matched)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    old, new = LineWriter("old"), LineWriter("new")
    old.append(logs / "app.log", 100)
    state = tmp_path / "state"
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    daemon = _start_without_root_rights([*args, str(logs / "*.log")], tmp_path / "push.log")
    try:
        daemon.wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 100)
        logs.chmod(0o644)  # listed, but no file in it can be looked at
        new.append(logs / "new.log", 50)
        old.append(logs / "app.log", 100)  # read through the descriptor the client holds
        assert wait_for_lines(gateway.data_dir, "app", 200).count() == 200
        reported = _reported_files(gateway, str(logs))
        assert reported[str(logs / "app.log")]["phase"] == (
            "active; cannot stat its path: Permission denied"
        ), reported
        assert reported[str(logs / "new.log")]["phase"] == "unreadable: Permission denied"
        status = _push_status(state)
        assert f"CANNOT STAT {logs / 'app.log'} since " in status, status
        assert f"UNREADABLE {logs / 'new.log'} since " in status, status
        assert "(not shipped; size unknown)" in status, status
        metrics = (state / "metrics.prom").read_text()
        assert sample(metrics, "logbroker_push_unreadable_files") == 1
        logs.chmod(0o755)
        delivered = wait_for_lines(gateway.data_dir, "app", 250)
        assert daemon.stop() == 0, daemon.log()
    finally:
        logs.chmod(0o755)
        daemon.kill()
    assert_exactly_once(delivered, old, new)
    text = (tmp_path / "push.log").read_text()
    assert text.count(f"cannot stat {logs / 'app.log'}") == 1, text[-3000:]
    assert text.count(f"{logs / 'app.log'} can be looked at again") == 1, text[-3000:]
    assert text.count(f"cannot read {logs / 'new.log'}") == 1, text[-3000:]


def test_a_directory_a_glob_may_not_enter_is_named_like_an_unreadable_file(
    tmp_path: Path, gateway
) -> None:
    """``logs/*/app.log`` passed over a directory the client may not enter without a word:
    glob skips what it cannot list, so its files were never shipped, nothing named them, and
    a one-shot run exited 0."""
    logs = tmp_path / "logs"
    (logs / "open").mkdir(parents=True)
    (logs / "closed").mkdir()
    shown, hidden = LineWriter("shown"), LineWriter("hidden")
    shown.append(logs / "open" / "app.log", 100)
    hidden.append(logs / "closed" / "app.log", 50)
    (logs / "closed").chmod(0)
    closed = str(logs / "closed")
    state = tmp_path / "state"
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state), *FAST_FLAGS]
    # idle long enough for a lag report (every 5 s) to reach the gateway
    daemon = _start_without_root_rights(
        [*args, "--idle-exit", "7", str(logs / "*" / "app.log")], tmp_path / "push.log"
    )
    try:
        daemon.wait_started(state)
        reported = _reported_files(gateway, str(logs))
        assert reported.get(closed, {}).get("phase") == "unreadable: Permission denied", reported
        assert daemon.wait() == 1, daemon.log()
    finally:
        (logs / "closed").chmod(0o755)
        daemon.kill()
    text = daemon.log()
    assert text.count(f"cannot read {closed}: Permission denied") == 1, text[-3000:]
    assert f"{closed} was not shipped: cannot read it" in text, text[-3000:]
    status = _push_status(state)
    assert f"UNREADABLE {closed} since " in status, status
    metrics = (state / "metrics.prom").read_text()
    assert sample(metrics, "logbroker_push_unreadable_files") == 1
    labels = {"file": closed, "source": "", "what": "unreadable", "error": "Permission denied"}
    labels["errno"] = "EACCES"
    assert sample(metrics, "logbroker_push_file_unreadable", **labels) == 1
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), shown)
    again = _push_without_root_rights(*args, "--idle-exit", "1", str(logs / "*" / "app.log"))
    assert again.returncode == 0, again.stderr
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), shown, hidden)


def test_every_file_name_is_sent_as_a_file_the_gateway_takes() -> None:
    """The client escapes in a file's name exactly what the gateway refuses in ``file``:
    no name on disk can get its file refused for its characters."""
    from log_store.errors import BadRequest
    from push_client.identity import display_path
    from session_dedup.source import source_meta

    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        name = f"/var/log/a{chr(code)}b.log"
        shown = display_path(name)
        try:
            source_meta(log_type="app", source_id="s", file=shown)
        except BadRequest as exc:
            raise AssertionError(f"U+{code:04X}: {shown!r} refused: {exc}") from None
        if shown != name:  # escaped only what the gateway would refuse
            with pytest.raises(BadRequest):
                source_meta(log_type="app", source_id="s", file=name)


def test_files_named_with_control_and_bidi_characters_ship_under_escaped_names(
    tmp_path: Path, gateway
) -> None:
    """A newline, a C1 control or a right-to-left override in a file's name: the gateway
    refuses such a ``file`` (400 bad_meta), so the client sends the name escaped and the
    file ships with the others.  A name too long once escaped is refused: that file alone is
    named as not shipped, the run exits 1 and does not retry it for ever."""
    logs = tmp_path / "logs"
    logs.mkdir()
    names = {
        "newline": "a\nb.log",
        "nel": "a\x85b.log",
        "rlo": "gol.\u202eexe.log",
        "zwnj": "\u0645\u06cc\u200c\u062e.log",
        "plain": "plain.log",
    }
    writers = {tag: LineWriter(tag) for tag in names}
    for tag, name in names.items():
        writers[tag].append(logs / name, 200)
    deep = logs
    for _ in range(5):  # 1,250 newlines: 5,000 characters escaped, over the 4,096 of `file`
        deep = deep / ("\n" * 250)
    deep.mkdir(parents=True)
    too_long = LineWriter("too-long")
    too_long.append(deep / "x.log", 50)
    state = tmp_path / "state"
    args = ["--server", gateway.url, "--log-type", "app", "--state-dir", str(state)]
    args += [*FAST_FLAGS, "--idle-exit", "2", str(logs / "*.log"), str(deep / "x.log")]
    run = subprocess.run(
        logbroker_cmd("push", *args), capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert run.returncode == 1, run.stderr[-3000:]
    assert "was not shipped: parked, the gateway refused it: HTTP 400 bad_meta" in run.stderr
    assert "file is 50" in run.stderr  # the reason names the field and its length
    assert run.stderr.count("was not shipped") == 1, run.stderr[-3000:]

    delivered = read_delivered(gateway.data_dir, "app")
    assert_exactly_once(delivered, *writers.values())
    store_files = {env.file for env in _envelopes(gateway.data_dir)}
    assert store_files == {
        f"{logs}/a\\x0ab.log",
        f"{logs}/a\\x85b.log",
        f"{logs}/gol.\\u202eexe.log",
        f"{logs}/\u0645\u06cc\u200c\u062e.log",
        f"{logs}/plain.log",
    }


def _envelopes(data_dir: Path) -> list[Any]:
    from log_store import open_store
    from session_dedup.envelope import decode

    found = []
    with open_store(data_dir) as store:
        for part in store.describe_topic("dc1.app").partitions:
            offset = part.start_offset
            while True:
                result = store.read("dc1.app", part.partition, offset, 8 << 20)
                if not result.records:
                    break
                found.extend(decode(r.value) for r in result.records)
                offset = result.next_offset
    return found
