"""Shipping files to a real gateway: codecs, restarts, lost and torn state, partial lines."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from log_store import open_store
from tests.conftest import REPO, free_port, logbroker_cmd
from tests.metrics_text import samples
from tests.push_client.conftest import (
    FAST_FLAGS,
    LineWriter,
    PushProcess,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("codec", ["raw", "gzip", "zstd"])
def test_every_line_arrives_once_with_each_codec(
    tmp_path: Path, gateway, start_push, codec: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    writer = LineWriter("a")
    writer.append(logs / "a.log", 20_000)
    push = start_push(gateway.url, tmp_path / "state", logs / "*.log", extra=["--codec", codec])
    for _ in range(5):
        writer.append(logs / "a.log", 1_000)
        time.sleep(0.05)
    delivered = wait_for_lines(gateway.data_dir, "app", len(writer.ids))
    assert push.stop() == 0
    assert_exactly_once(delivered, writer)
    assert delivered.codecs == {codec}


def test_restart_resumes_without_loss_or_duplicates(tmp_path: Path, gateway, start_push) -> None:
    log = tmp_path / "app.log"
    writer = LineWriter("r")
    writer.append(log, 5_000)
    state = tmp_path / "state"
    first = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 5_000)
    assert first.stop() == 0
    writer.append(log, 5_000)
    second = start_push(gateway.url, state, log)
    delivered = wait_for_lines(gateway.data_dir, "app", 10_000)
    assert second.stop() == 0
    assert_exactly_once(delivered, writer)


def test_deleted_state_dir_resumes_from_the_gateways_last_seqno(
    tmp_path: Path, gateway, start_push
) -> None:
    log = tmp_path / "app.log"
    writer = LineWriter("s")
    writer.append(log, 8_000)
    first = start_push(gateway.url, tmp_path / "state-1", log)
    wait_for_lines(gateway.data_dir, "app", 8_000)
    assert first.stop() == 0
    writer.append(log, 3_000)
    # A new, empty state dir: only the gateway knows how far this file was shipped.
    second = start_push(gateway.url, tmp_path / "state-2", log)
    delivered = wait_for_lines(gateway.data_dir, "app", 11_000)
    time.sleep(0.5)
    delivered = read_delivered(gateway.data_dir, "app")
    assert second.stop() == 0
    assert_exactly_once(delivered, writer)


@pytest.mark.fault
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], id="torn"),
        pytest.param(lambda raw: b"", id="empty"),
        pytest.param(lambda raw: raw.replace(b'"acked":', b'"acked":1'), id="bit-flipped"),
    ],
)
def test_damaged_state_file_is_detected_and_costs_nothing(
    tmp_path: Path, gateway, start_push, damage
) -> None:
    log = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("t")
    writer.append(log, 6_000)
    first = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 6_000)
    assert first.stop() == 0
    state_file = state / "state.json"
    state_file.write_bytes(damage(state_file.read_bytes()))
    writer.append(log, 2_000)
    second = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 8_000)
    time.sleep(0.5)
    assert second.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
    assert list(state.glob("state.json.corrupt-*")), "the damaged file was not set aside"
    assert "corrupt" in second.log()


@pytest.mark.fault
@pytest.mark.parametrize(
    ("field", "value"),
    [("acked", "480000"), ("acked", 5.5), ("generation", -1)],
    ids=["offset-string", "offset-float", "generation-negative"],
)
def test_a_state_file_with_a_wrong_field_type_is_set_aside_and_costs_nothing(
    tmp_path: Path, gateway, start_push, field: str, value: object
) -> None:
    """A state file whose checksum matches but whose fields have the wrong types (written by
    hand, or by a bug) was taken as it was: it is corrupt, set aside with the field named,
    and the client resumes from the gateway's last seqnos."""
    log = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("w")
    writer.append(log, 6_000)
    first = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 6_000)
    assert first.stop() == 0
    state_file = state / "state.json"
    body = state_file.read_bytes().split(b"\nsha256:")[0]
    payload = json.loads(body)
    payload["sources"][0][field] = value
    body = json.dumps(payload).encode()
    state_file.write_bytes(body + b"\nsha256:" + hashlib.sha256(body).hexdigest().encode() + b"\n")
    writer.append(log, 2_000)
    second = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 8_000)
    time.sleep(0.5)
    assert second.stop() == 0, second.log()
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
    assert list(state.glob("state.json.corrupt-*")), "the wrong file was not set aside"
    assert f"sources[0].{field} must be" in second.log(), second.log()


def test_partial_last_line_is_held_across_shutdown(tmp_path: Path, gateway, start_push) -> None:
    log = tmp_path / "app.log"
    state = tmp_path / "state"
    writer = LineWriter("p")
    body = writer.lines(1_000)
    last_line = body[body.rindex(b"\n", 0, len(body) - 1) + 1 :]
    log.write_bytes(body[: -len(last_line)] + last_line[:10])
    first = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 999)
    time.sleep(0.5)
    assert first.stop() == 0
    assert read_delivered(gateway.data_dir, "app").count() == 999
    with open(log, "ab") as f:
        f.write(last_line[10:])
    second = start_push(gateway.url, state, log)
    delivered = wait_for_lines(gateway.data_dir, "app", 1_000)
    assert second.stop() == 0
    assert_exactly_once(delivered, writer)
    assert delivered.lines[next(iter(delivered.lines))][-1] + b"\n" == last_line


def test_multiline_records_are_never_split_between_chunks(
    tmp_path: Path, gateway, start_push
) -> None:
    log = tmp_path / "app.log"
    records = []
    for i in range(3_000):
        records.append(f"2026-01-01 m:{i:09d} start\n  at frame {i}\n  at frame end\n")
    push = start_push(gateway.url, tmp_path / "state", log, extra=["--multiline", r"^\d{4}-"])
    with open(log, "w") as f:
        for i in range(0, 3_000, 100):
            f.write("".join(records[i : i + 100]))
            f.flush()
            time.sleep(0.01)
    delivered = wait_for_lines(gateway.data_dir, "app", 9_000)
    assert push.stop() == 0
    chunks_text = b"\n".join(b"\n".join(v) for v in delivered.lines.values())
    assert chunks_text.count(b" start") == 3_000
    store_chunks = delivered.lines[next(iter(delivered.lines))]
    assert store_chunks[0].startswith(b"2026-01-01 m:000000000")
    # Each chunk begins with a record's first line: check via the raw envelopes.
    from session_dedup.envelope import decode

    store = open_store(gateway.data_dir)
    try:
        for part in store.describe_topic("dc1.app").partitions:
            for record in store.read("dc1.app", part.partition, 0, 64 << 20).records:
                data = decode(record.value).data
                assert data.startswith(b"2026-01-01 ") and data.endswith(b"frame end\n")
    finally:
        store.close()


def test_status_reports_lag_per_file_and_metrics_are_exported(tmp_path: Path, start_push) -> None:
    log = tmp_path / "app.log"
    writer = LineWriter("st")
    writer.append(log, 2_000)
    state = tmp_path / "state"
    # No gateway listens: everything stays lag.
    metrics_port = free_port()
    push = start_push(
        f"http://127.0.0.1:{free_port()}",
        state,
        log,
        extra=["--metrics-port", str(metrics_port)],
    )
    deadline = time.monotonic() + 15
    while not (state / "status.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)
    out = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "running" in out.stdout
    row = next(line for line in out.stdout.splitlines() if str(log) in line)
    assert str(log.stat().st_size) in row.split()
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    lags = [
        (dict(labels), value)
        for (name, labels), value in samples(metrics).items()
        if name == "logbroker_push_lag_bytes"
    ]
    assert len(lags) == 1 and lags[0][0]["file"] == str(log) and lags[0][0]["source"]
    assert lags[0][1] == log.stat().st_size
    assert "logbroker_push_retries_total" in metrics
    status = httpx.get(f"http://127.0.0.1:{metrics_port}/status", timeout=5).json()
    assert status["files"][0]["path"] == str(log) and status["files"][0]["acked"] == 0
    assert 0 <= time.time() - status["checked_at"] < 3, status
    assert (state / "metrics.prom").read_text().startswith("# HELP")
    assert push.stop() == 0


def test_an_idle_client_touches_its_status_and_metrics_and_rewrites_them_on_change(
    tmp_path: Path, gateway, start_push
) -> None:
    """An idle client rebuilt and rewrote status.json and metrics.prom every second, for a
    thousand idle files most of its CPU.  They are rewritten when what they show changes;
    in between their modification time moves every second, so that it still says the
    client is alive (node_exporter exports it for the textfile collector's alerts)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    writers = [LineWriter(f"i{i}") for i in range(3)]
    for i, writer in enumerate(writers):
        writer.append(logs / f"{i}.log", 10)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, logs / "*.log")
    push.wait_started(state)
    wait_for_lines(gateway.data_dir, "app", 30)
    status, metrics = state / "status.json", state / "metrics.prom"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        doc = json.loads(status.read_bytes())
        if sum(r["acked"] for r in doc["files"]) == sum(r["size"] for r in doc["files"]) > 0:
            break
        time.sleep(0.2)
    time.sleep(1.5)  # the last acks' status and the lag report's first offer
    before = {p: p.stat() for p in (status, metrics)}
    time.sleep(2.5)
    for path, st in before.items():
        now = path.stat()
        assert now.st_ino == st.st_ino, f"{path.name} was rewritten with nothing changed"
        assert now.st_mtime >= st.st_mtime + 1.5, f"{path.name} was not touched"
    shown = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    ).stdout
    checked, changed = re.search(
        r"status checked ([\d.]+) s ago, changed ([\d.]+) s ago", shown
    ).groups()
    assert float(checked) < 1.5 and float(changed) >= 2.5, shown
    writers[0].append(logs / "0.log", 5)
    wait_for_lines(gateway.data_dir, "app", 35)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        doc = json.loads(status.read_bytes())
        if {r["acked"] for r in doc["files"]} == {
            (logs / f"{i}.log").stat().st_size for i in range(3)
        }:
            break
        time.sleep(0.2)
    assert doc["changed_at"] > before[status].st_mtime, doc
    assert status.stat().st_ino != before[status].st_ino
    assert metrics.stat().st_ino != before[metrics].st_ino
    acked = [
        v
        for (name, _), v in samples(metrics.read_text()).items()
        if name == "logbroker_push_acked_bytes_total"
    ]
    assert acked == [sum((logs / f"{i}.log").stat().st_size for i in range(3))]
    assert push.stop() == 0


def test_status_without_a_client_says_so(tmp_path: Path) -> None:
    out = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 1
    assert "no status" in out.stderr


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(
            lambda state: (state / "status.json").write_text("{torn"), "damaged", id="torn"
        ),
        pytest.param(
            lambda state: (state / "status.json").write_text("[]"), "not a status", id="list"
        ),
        pytest.param(lambda state: (state / "status.json").mkdir(), "cannot read", id="directory"),
    ],
)
def test_status_that_cannot_be_read_says_why_without_a_traceback(
    tmp_path: Path, damage, message: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    damage(state)
    out = subprocess.run(
        logbroker_cmd("push", "--status", "--state-dir", str(state)),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 1
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-type", "app", "--state-dir", "S", "x.log"], "no gateway"),
        (["--server", "http://h:1", "--state-dir", "S", "x.log"], "--log-type"),
        (["--server", "http://h:1", "--log-type", "app", "x.log"], "state"),
        (["--server", "ftp://h", "--log-type", "app", "--state-dir", "S", "x"], "http"),
        (["--server", "http://h:1", "--log-type", "A B", "--state-dir", "S", "x"], "log type"),
        (
            [
                "--server",
                "http://h:1",
                "--log-type",
                "a",
                "--state-dir",
                "S",
                "--multiline",
                "(",
                "x",
            ],
            "multiline",
        ),
        (
            [
                "--server",
                "http://h:1",
                "--log-type",
                "a",
                "--state-dir",
                "S",
                "--idle-exit",
                "-1",
                "x",
            ],
            "idle-exit",
        ),
        (
            [
                "--server",
                "http://h:1",
                "--log-type",
                "a",
                "--state-dir",
                "S",
                "--metrics-port",
                "70000",
                "x",
            ],
            "metrics_port",
        ),
    ],
)
def test_bad_usage_exits_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(tmp_path / "S") if a == "S" else a for a in args]
    out = subprocess.run(
        logbroker_cmd("push", *args), capture_output=True, text=True, cwd=REPO, timeout=30
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert not (tmp_path / "S").exists()


def test_config_file_ships_many_entries_with_their_own_log_types(
    tmp_path: Path, gateway, start_push
) -> None:
    (tmp_path / "web").mkdir()
    (tmp_path / "db").mkdir()
    config = tmp_path / "push.toml"
    config.write_text(
        f"""
[push]
servers = ["{gateway.url}"]
state_dir = "{tmp_path / "state"}"
rotate_wait_s = 0.5

[[entry]]
path = "{tmp_path / "web" / "*.log"}"
log_type = "web"
codec = "zstd"

[[entry]]
path = "{tmp_path / "db" / "db.log"}"
log_type = "db"
codec = "gzip"
"""
    )
    web, db = LineWriter("w"), LineWriter("d")
    web.append(tmp_path / "web" / "1.log", 1_000)
    db.append(tmp_path / "db" / "db.log", 1_000)
    proc = subprocess.Popen(
        logbroker_cmd("push", "--config", str(config), "--no-progress"),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        web.append(tmp_path / "web" / "2.log", 500)  # a new file matching the glob
        wait_for_lines(gateway.data_dir, "web", 1_500)
        wait_for_lines(gateway.data_dir, "db", 1_000)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "web"), web)
    assert_exactly_once(read_delivered(gateway.data_dir, "db"), db)
    assert read_delivered(gateway.data_dir, "web").codecs == {"zstd"}
    assert read_delivered(gateway.data_dir, "db").codecs == {"gzip"}


def test_an_entry_matching_no_file_is_named_at_start_and_shipped_once_a_file_appears(
    tmp_path: Path, gateway
) -> None:
    (tmp_path / "web").mkdir()
    (tmp_path / "db").mkdir()
    db = LineWriter("d")
    db.append(tmp_path / "db" / "db.log", 100)
    config = tmp_path / "push.toml"
    config.write_text(
        f"""
[push]
servers = ["{gateway.url}"]
state_dir = "{tmp_path / "state"}"

[[entry]]
path = "{tmp_path / "web" / "*.log"}"
log_type = "web"

[[entry]]
path = "{tmp_path / "db" / "db.log"}"
log_type = "db"
"""
    )
    log_path = tmp_path / "push.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            logbroker_cmd("push", "--config", str(config), "--no-progress"),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    try:
        wait_for_lines(gateway.data_dir, "db", 100)
        said = f"entry {tmp_path / 'web' / '*.log'} (log type web) matches no file yet"
        assert said in log_path.read_text()
        assert "db.log (log type db) matches no file" not in log_path.read_text()
        web = LineWriter("w")
        web.append(tmp_path / "web" / "1.log", 200)
        wait_for_lines(gateway.data_dir, "web", 200)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "web"), web)


def test_an_entry_that_is_a_directory_is_named_as_one(tmp_path: Path) -> None:
    """A directory given for its files matched nothing, and was said to match "no file
    yet", as if one could still appear under that path."""
    logs = tmp_path / "logs"
    logs.mkdir()
    done = subprocess.run(
        logbroker_cmd(
            "push", "--server", f"http://127.0.0.1:{free_port()}", "--log-type", "web",
            "--state-dir", str(tmp_path / "state"), "--idle-exit", "1", "--no-progress", str(logs),
        ),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    said = f"entry {logs} (log type web) is a directory, and an entry names files: ship the"
    assert said in done.stderr, done.stderr
    assert f"such as {logs / '*.log'}" in done.stderr
    assert "matches no file yet" not in done.stderr


@pytest.mark.fault
def test_sigterm_mid_backlog_flushes_and_saves_only_acknowledged_positions(
    tmp_path: Path, gateway, start_push
) -> None:
    import orjson

    log = tmp_path / "app.log"
    writer = LineWriter("term", pad=180)
    writer.append(log, 600_000)  # about 120 MB: still being shipped when SIGTERM comes
    state = tmp_path / "state"
    push = start_push(gateway.url, state, log, extra=["--memory-bytes", "16777216"])
    # SIGTERM right after the first chunks are in the log: shipping is under way, far from
    # done, however fast this machine ships today.
    deadline = time.monotonic() + 20
    with httpx.Client(base_url=gateway.url) as http:
        while time.monotonic() < deadline:
            answer = http.get("/v1/topics/dc1.app")
            if answer.status_code == 200 and any(
                p["end_offset"] for p in answer.json()["partitions"]
            ):
                break
            time.sleep(0.002)
    started = time.monotonic()
    assert push.stop() == 0
    assert time.monotonic() - started < 10
    saved = orjson.loads((state / "state.json").read_bytes().split(b"\n")[0])
    (position,) = saved["sources"]
    delivered = read_delivered(gateway.data_dir, "app")
    (seqnos,) = delivered.seqnos.values()
    # Everything in flight was acknowledged before exit, and the file says exactly that.
    assert position["acked"] == seqnos[-1]
    assert position["acked"] < log.stat().st_size
    second = start_push(gateway.url, state, log)
    wait_for_lines(gateway.data_dir, "app", 600_000, timeout_s=60)
    assert second.stop() == 0
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)


def test_refused_requests_keep_the_data_and_say_why(
    tmp_path: Path, start_gateway, start_push
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[tokens.right-token]\nwrite = ["app"]\nread = ["dc1.*"]\n')
    gateway = start_gateway(tmp_path / "data", "--config", str(config))
    log = tmp_path / "app.log"
    writer = LineWriter("auth")
    writer.append(log, 2_000)
    state = tmp_path / "state"
    wrong = start_push(gateway.url, state, log, extra=["--token", "wrong-token"])
    # The words looked for are the message's own, not any that the log's paths (named after
    # this test) contain.
    said = "the gateway refused it: HTTP 401"
    deadline = time.monotonic() + 60  # the event comes in a second; a loaded machine is slow
    while said not in wrong.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert said in wrong.log()
    assert wrong.stop() == 0
    assert read_delivered(gateway.data_dir, "app").count() == 0
    right = start_push(gateway.url, state, log, extra=["--token", "right-token"])
    delivered = wait_for_lines(gateway.data_dir, "app", 2_000)
    assert right.stop() == 0
    assert_exactly_once(delivered, writer)


def test_sighup_names_the_settings_that_change_only_with_a_restart(tmp_path: Path, gateway) -> None:
    """A reload took a new metrics_port (or max_in_flight, inotify, graphite, ...) without a
    word and went on with the old one: the operator's change was silently not applied."""
    state = tmp_path / "state"
    log = tmp_path / "app.log"
    writer = LineWriter("hup")
    writer.append(log, 100)
    config = tmp_path / "push.toml"
    first_port, second_port = free_port(), free_port()

    def write_config(metrics_port: int, max_in_flight: int) -> None:
        config.write_text(
            f'[push]\nservers = ["{gateway.url}"]\nstate_dir = "{state}"\n'
            f"metrics_port = {metrics_port}\nmax_in_flight = {max_in_flight}\n"
            f'[[entry]]\npath = "{log}"\nlog_type = "app"\n'
        )

    write_config(first_port, 4)
    push = PushProcess(["--config", str(config), *FAST_FLAGS], tmp_path / "push.log").start()
    try:
        push.wait_started(state)
        wait_for_lines(gateway.data_dir, "app", 100)
        write_config(second_port, 8)
        assert push.proc is not None
        push.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while "configuration reloaded" not in push.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "SIGHUP: max_in_flight, metrics_port change only with a restart" in push.log()
        assert httpx.get(f"http://127.0.0.1:{first_port}/metrics", timeout=5).status_code == 200
        writer.append(log, 100)
        delivered = wait_for_lines(gateway.data_dir, "app", 200)
        assert push.stop() == 0
    finally:
        push.kill()
    assert_exactly_once(delivered, writer)


def test_a_one_shot_run_names_the_incomplete_lines_it_leaves(tmp_path: Path, gateway) -> None:
    """A one-shot run left a last line without newline (and a file whose only line has none)
    unsent and exited 0 without a word: a batch job thought the files were shipped."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tail.log").write_bytes(b"one\ntwo\nthree without newline")
    (logs / "head.log").write_bytes(b"a first line without newline")
    (logs / "empty.log").write_bytes(b"")
    out = subprocess.run(
        logbroker_cmd(
            "push",
            "--server",
            gateway.url,
            "--log-type",
            "app",
            "--state-dir",
            str(tmp_path / "state"),
            "--idle-exit",
            "1",
            str(logs / "*.log"),
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"{logs / 'tail.log'}: its last 21 bytes were not sent" in out.stderr, out.stderr
    assert f"{logs / 'head.log'}: not sent: its first line has no newline yet" in out.stderr
    assert "empty.log" not in out.stderr.split("exiting")[-1]
    assert sorted(read_delivered(gateway.data_dir, "app").lines.popitem()[1]) == [b"one", b"two"]
