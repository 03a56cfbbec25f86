"""Bad usage of the client commands exits 2 with one line saying what is wrong, at once: no
traceback, no run that ignores the mistake (a misspelt log level, ``--idle-exit nan``), no
gateway blamed for a client-side error.

Every case is a real ``logbroker`` process; they run side by side (none needs a gateway: each
is refused before the first request) so the file stays quick.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from log_store import TopicConfig, open_store
from tests.conftest import REPO, free_port, logbroker_cmd

NOWHERE = f"http://127.0.0.1:{free_port()}"
ELSEWHERE = f"http://127.0.0.1:{free_port()}"
MIRROR = ["mirror", "--from", NOWHERE, "--to", ELSEWHERE, "--prefix", "dc1."]
READ = ["read", "--server", NOWHERE, "--topic", "dc1.app"]


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Each case: the command line, and the one line it must print."""
    store, a_file = tmp / "store", tmp / "a-file"
    not_a_db = tmp / "notes.db"
    return {
        "alter-nothing": (
            ["topics", "--data-dir", str(store), "alter", "dc1.app"],
            "logbroker topics: nothing to change; name one of --partitions, --retention-hours, "
            "--retention-bytes, --segment-bytes",
        ),
        "alter-huge-retention-bytes": (
            ["topics", "--data-dir", str(store), "alter", "dc1.app",
             "--retention-bytes", "99999999999999999999999"],
            "argument --retention-bytes: '99999999999999999999999': bytes must be in "
            "0..9223372036854775807, or 'unlimited'",
        ),
        "create-huge-segment-bytes": (
            ["topics", "--data-dir", str(store), "create", "dc1.q9",
             "--segment-bytes", "99999999999999999999"],
            "argument --segment-bytes: '99999999999999999999': bytes must be in "
            "0..9223372036854775807",
        ),
        "push-log-level": (
            ["push", "--server", NOWHERE, "--log-type", "app", "--state-dir",
             str(tmp / "push-state"), str(tmp / "app.log"), "--idle-exit", "1",
             "--log-level", "LOUD"],
            "argument --log-level: invalid choice: 'loud'",
        ),
        "push-idle-exit-nan": (
            ["push", "--server", NOWHERE, "--log-type", "app", "--state-dir",
             str(tmp / "push-state2"), str(tmp / "app.log"), "--idle-exit", "nan"],
            "logbroker push: error: argument --idle-exit: must be a finite number of seconds, 0 or "
            "more, not nan",
        ),
        "mirror-metrics-port": (
            [*MIRROR, "--metrics-port", "99999", "--idle-exit", "1"],
            "logbroker mirror: --metrics-port must be a TCP port (1-65535), not 99999",
        ),
        "mirror-state-dir-file": (
            [*MIRROR, "--state-dir", str(a_file), "--idle-exit", "1"],
            f"logbroker mirror: cannot use state dir {a_file}: it is not a directory",
        ),
        "mirror-state-dir-under-file": (
            [*MIRROR, "--state-dir", str(a_file / "sub"), "--idle-exit", "1"],
            f"logbroker mirror: cannot use state dir {a_file / 'sub'}: Not a directory",
        ),
        "mirror-idle-exit-nan": (
            [*MIRROR, "--idle-exit", "nan"],
            "logbroker mirror: error: argument --idle-exit: must be a finite number of seconds, "
            "0 or more, not nan",
        ),
        "audit-db-missing-dir": (
            ["audit", "--windows", "--server", NOWHERE, "--db", str(tmp / "no" / "x.db")],
            f"logbroker audit: --db {tmp / 'no' / 'x.db'}: no directory {tmp / 'no'}",
        ),
        "audit-db-not-a-database": (
            ["audit", "--windows", "--server", NOWHERE, "--db", str(not_a_db)],
            f"logbroker audit: --db {not_a_db}: file is not a database (give another file)",
        ),
        "read-idle-exit-inf": (
            [*READ, "--idle-exit", "inf"],
            "logbroker read: error: argument --idle-exit: must be a finite number of seconds, 0 or "
            "more, not inf",
        ),
        "read-session-timeout": (
            [*READ, "--group", "g", "--session-timeout-ms", "99999999999999999999",
             "--idle-exit", "1"],
            "logbroker read: --session-timeout-ms must be in 500..300000, not "
            "99999999999999999999",
        ),
        "read-token-with-line-end": (
            [*READ, "--token", "s3cr3t\r", "--idle-exit", "1"],
            "logbroker read: --token holds whitespace or a control character (a line end of "
            "the file it came from?); a bearer token has none",
        ),
        "load-warehouse-under-a-file": (
            ["load", "--data-dir", str(store), "--warehouse", str(a_file / "table")],
            f"logbroker load: --warehouse {a_file / 'table'}: {a_file} is not a directory",
        ),
    }  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    """Every case run at once: name -> (exit status, stderr, expected line)."""
    tmp = tmp_path_factory.mktemp("usage")
    store = open_store(tmp / "store")
    store.create_topic("dc1.app", TopicConfig(partitions=1))
    store.close()
    (tmp / "a-file").write_text("a file\n")
    (tmp / "notes.db").write_text("not a database\n")
    (tmp / "app.log").write_text("a line\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LOGBROKER_TOKEN", None)
    started = {
        name: (
            subprocess.Popen(
                logbroker_cmd(*argv), cwd=tmp, env=env, text=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            ),
            expected,
        )
        for name, (argv, expected) in _cases(tmp).items()
    }  # fmt: skip
    deadline = time.monotonic() + 90
    done: dict[str, tuple[int, str, str]] = {}
    for name, (proc, expected) in started.items():
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += "\n(still running: killed)"
        done[name] = (proc.returncode, err, expected)
    return done


@pytest.mark.parametrize("case", sorted(_cases(Path("/t"))))
def test_bad_usage_exits_2_with_one_line_saying_what_is_wrong(
    runs: dict[str, tuple[int, str, str]], case: str
) -> None:
    code, err, expected = runs[case]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert expected in err, err


def test_topics_create_refused_leaves_no_topic(
    runs: dict[str, tuple[int, str, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert runs["create-huge-segment-bytes"][0] == 2
    store_dir = next(tmp_path_factory.getbasetemp().glob("usage*")) / "store"
    store = open_store(store_dir, read_only=True)
    try:
        assert [t.name for t in store.list_topics()] == ["dc1.app"]
    finally:
        store.close()


@pytest.mark.parametrize("command", ["serve", "push", "mirror"])
@pytest.mark.parametrize("given", ["error", "INFO", "Warning", "debug"])
def test_every_command_takes_the_same_log_levels_in_any_case(command: str, given: str) -> None:
    """``mirror --log-level error`` was refused and ``serve --log-level INFO`` too, while
    ``push`` took both: one set of levels, in any case, for every command."""
    from ops.cli import build_parser

    required = {"mirror": MIRROR[1:], "push": [], "serve": []}[command]
    parser, _modules = build_parser(command)
    args = parser.parse_args([command, *required, "--log-level", given])
    assert args.log_level == given.lower()
