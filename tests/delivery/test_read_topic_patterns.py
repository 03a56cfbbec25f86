"""``logbroker read --topic``/``--where`` patterns: what takes a glob, what is a prefix, and
what a reader of a prefix that matches no topic yet says.

``--topic`` takes a name or a name ending in ``*`` (a prefix; ``*`` alone is every topic), no
other glob; ``--where`` takes globs in ``file=`` only.  A pattern that would silently match
nothing is refused (exit 2) with the rule.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import REPO, free_port, logbroker_cmd
from tests.delivery.conftest import ReaderProcess, Writer, line_for, wait_until


def _read(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("read", *args), capture_output=True, text=True, cwd=REPO, timeout=timeout_s
    )


def _nowhere() -> str:
    """A gateway URL nothing answers at: what is refused is refused before it is asked."""
    return f"http://127.0.0.1:{free_port()}"


def test_star_reads_every_topic(gateway: Any, writer_for: Callable[[str], Writer]) -> None:
    writer = writer_for(gateway.url)
    writer.write("host1:a", [4], log_type="app")
    writer.write("host2:b", [6], log_type="web")
    done = _read(
        "--server", gateway.url, "--topic", "*", "--from-beginning", "--idle-exit", "1"
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines(keepends=True)) == [
        line_for("host1:a", 4),
        line_for("host2:b", 6),
    ]
    assert done.stderr == ""


def test_a_glob_that_is_not_a_trailing_star_is_refused_with_the_rule() -> None:
    for topic in ("*.app", "dc1.**", "dc1.a?p", "dc[12].app"):
        done = _read("--server", _nowhere(), "--topic", topic, "--idle-exit", "0")
        assert done.returncode == 2, (topic, done.stderr)
        assert f"--topic {topic!r}: only a trailing '*' is supported" in done.stderr, done.stderr


def test_star_with_a_group_reads_every_topic_once(
    gateway: Any, writer_for: Callable[[str], Writer]
) -> None:
    """A group of every topic (the prefix ''): it was refused, "prefix must not be empty"."""
    writer = writer_for(gateway.url)
    writer.write("host1:a", [4], log_type="app")
    writer.write("host2:b", [6], log_type="web")
    group = ("--server", gateway.url, "--topic", "*", "--group", "all", "--idle-exit", "1")
    done = _read(*group, "--from-beginning")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines(keepends=True)) == [
        line_for("host1:a", 4),
        line_for("host2:b", 6),
    ]
    writer.write("host1:a", [5], log_type="app")
    again = _read(*group)  # the group's offsets: only what came since
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines(keepends=True) == [line_for("host1:a", 5)]


def test_a_glob_in_a_where_field_that_takes_none_is_refused() -> None:
    for where in ("server=host*", "server=host?", "server=[ab]host", "log_type=app*"):
        done = _read(
            "--server", _nowhere(), "--topic", "dc1.app", "--where", where, "--idle-exit", "0"
        )  # fmt: skip
        assert done.returncode == 2, (where, done.stderr)
        assert f"--where {where!r}: only file= takes globs" in done.stderr, done.stderr


def test_source_id_matches_exactly_also_with_glob_characters(
    gateway: Any, writer_for: Callable[[str], Writer]
) -> None:
    """A source_id may hold '*' (protocol.md): it is matched as written, not refused."""
    writer = writer_for(gateway.url)
    writer.write("host1:*", [4])
    writer.write("host1:a", [6])
    done = _read(
        "--server", gateway.url, "--topic", "dc1.app", "--from-beginning", "--idle-exit", "1",
        "--where", "source_id=host1:*",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == line_for("host1:*", 4)


def test_help_says_what_takes_a_glob() -> None:
    done = _read("--help")
    text = " ".join(done.stdout.split())
    assert "a name ending in '*'" in text
    assert "TOPIC|PREFIX*" in text
    assert "source_id=, server=, log_type= match exactly; file= also takes globs" in text


def test_a_prefix_that_matches_no_topic_says_once_that_it_waits_and_when_it_gives_up(
    gateway: Any, writer_for: Callable[[str], Writer]
) -> None:
    writer_for(gateway.url).write("host1:a", [4], log_type="app")
    for group in ((), ("--group", "g1")):
        done = _read(
            "--server", gateway.url, "--topic", "dc9.*", "--from-beginning", "--idle-exit", "1",
            *group,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert len(lines) == 2, done.stderr
        assert lines[0].startswith(
            f"logbroker read: no topic matches 'dc9.*' on {gateway.url} yet; waiting for one "
            "to appear; topics there: dc1.app"
        ), done.stderr
        assert lines[1] == "logbroker read: no topic matching 'dc9.*' appeared within 1 s"


def test_a_prefix_without_its_dc_is_told_what_it_may_have_meant(gateway: Any) -> None:
    Writer(gateway.url).write("host1:a", [4], log_type="app")
    done = _read("--server", gateway.url, "--topic", "app*", "--idle-exit", "0")
    assert done.returncode == 0, done.stderr
    assert "topics are named <dc>.<log_type>: did you mean dc1.app*?" in done.stderr


def test_a_prefix_reader_reads_the_first_topic_that_appears_after_it_said_it_waits(
    gateway: Any,
    writer_for: Callable[[str], Writer],
    start_reader: Callable[..., ReaderProcess],
) -> None:
    # idle-exit leaves the write time to arrive on a loaded machine (3 s was too little once)
    reader = start_reader("--server", gateway.url, "--topic", "dc1.late*", "--idle-exit", "8")
    wait_until(lambda: "waiting for one to appear" in reader.stderr(), 20, "the waiting notice")
    writer_for(gateway.url).write("host1:a", [4], log_type="late")
    assert reader.wait(30) == 0
    assert reader.out_path.read_text() == line_for("host1:a", 4)
    assert "appeared within" not in reader.stderr(), reader.stderr()
    assert reader.stderr().count("waiting") == 1, reader.stderr()


def test_a_prefix_reader_whose_token_reads_none_of_its_topics_is_told_so(
    start_gateway: Any, tmp_path: Path
) -> None:
    """Before: "there are no topics yet", while dc1.app existed: the gateway lists only the
    topics a token may read, so a mis-scoped token looked like an empty gateway."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[tokens.writer-secret]\nname = "w"\nwrite = ["app"]\nread = ["dc1.*"]\n'
        '[tokens.other-secret]\nname = "other"\nread = ["dc1.other"]\n'
    )
    gateway = start_gateway(tmp_path / "data", "--config", str(config))
    Writer(gateway.url, token="writer-secret").write("host1:a", [4], log_type="app")
    done = _read(
        "--server", gateway.url, "--topic", "dc1.*", "--idle-exit", "1",
        "--token", "other-secret",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "there are no topics this token may read" in done.stderr, done.stderr
    assert "no topics yet" not in done.stderr
