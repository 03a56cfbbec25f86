"""``logbroker mirror`` given wrong inputs says what is wrong and exits 2 (1 for a gateway
that stays unreachable), at once: it does not retry what no retry can mend."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port, logbroker_cmd
from tests.delivery.conftest import Writer

QUICK_S = 20.0


def _mirror(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            logbroker_cmd("mirror", *args),
            cwd=REPO, capture_output=True, text=True, timeout=QUICK_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mirror {' '.join(args)} still ran after {QUICK_S:g} s: {exc.stderr!r}")


@pytest.mark.parametrize(
    ("source", "dest", "said"),
    [
        ("dc1-gw:8080", "http://127.0.0.1:9", "--from 'dc1-gw:8080' is not an http:// or https://"),
        ("http://127.0.0.1:9", "ftp://dc2-gw", "--to 'ftp://dc2-gw' is not an http:// or https://"),
        ("http://dc1-gw.invalid:8080", "http://127.0.0.1:9", "no such host: dc1-gw.invalid"),
        ("http://127.0.0.1:9", "http://dc2-gw.invalid", "no such host: dc2-gw.invalid"),
    ],
    ids=["no-scheme", "ftp", "source-host-unknown", "destination-host-unknown"],
)
def test_a_gateway_url_that_cannot_work_exits_2_naming_it(
    source: str, dest: str, said: str
) -> None:
    done = _mirror("--from", source, "--to", dest, "--prefix", "dc1.")
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr


def test_a_prefix_no_topic_name_can_start_with_exits_2() -> None:
    done = _mirror(
        "--from", "http://127.0.0.1:9", "--to", "http://127.0.0.1:10", "--prefix", "DC1."
    )
    assert done.returncode == 2, done.stderr
    assert "no topic can start with prefix 'DC1.'" in done.stderr, done.stderr


@pytest.mark.parametrize("max_bytes", ["0", str(64 * 1024 * 1024 + 1)])
def test_a_max_bytes_out_of_range_exits_2(max_bytes: str) -> None:
    done = _mirror(
        "--from", f"http://127.0.0.1:{free_port()}", "--to", f"http://127.0.0.1:{free_port()}",
        "--prefix", "dc1.", "--max-bytes", max_bytes,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--max-bytes must be in 1..67108864" in done.stderr, done.stderr


def test_a_source_that_stays_unreachable_ends_an_idle_exit_run_with_status_1() -> None:
    started = time.monotonic()
    done = _mirror(
        "--from", f"http://127.0.0.1:{free_port()}", "--to", f"http://127.0.0.1:{free_port()}",
        "--prefix", "dc1.", "--idle-exit", "1",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "still unavailable after 1 s" in done.stderr, done.stderr
    assert time.monotonic() - started < 10


def test_refusals_name_the_side_and_an_unknown_prefix_names_the_topics_there(
    start_gateway: Any, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[tokens.mirror-secret]\nread = ["dc1.*"]\nreplicate = ["dc1.*"]\n'
        '[tokens.reader-secret]\nread = ["*"]\n'
        '[tokens.writer-secret]\nwrite = ["app"]\n'
    )
    config.chmod(0o600)
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1", "--config", str(config))
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2", "--config", str(config))
    writer = Writer(dc1.url, token="writer-secret")
    writer.write("s", [1, 2, 3])
    writer.close()
    between = ("--from", dc1.url, "--to", dc2.url, "--idle-exit", "1")

    no_token = _mirror(*between, "--prefix", "dc1.")
    assert no_token.returncode == 2, no_token.stderr
    assert f"the source {dc1.url} refused: missing 'Authorization" in no_token.stderr
    assert "--token-file" in no_token.stderr

    no_replicate = _mirror(*between, "--prefix", "dc1.", "--token", "reader-secret")
    assert no_replicate.returncode == 2, no_replicate.stderr
    assert f"the destination {dc2.url} refused: this token may not replicate" in (
        no_replicate.stderr
    )

    unknown = _mirror(*between, "--prefix", "dc9.", "--token", "mirror-secret")
    assert unknown.returncode == 2, unknown.stderr
    assert f"no topic at the source {dc1.url} starts with 'dc9.'" in unknown.stderr
    assert "topics there: dc1.app" in unknown.stderr
