"""``logbroker read --server A,B``: a group member whose gateway is SIGKILLed goes on through
the other gateway of the installation, keeps its partitions and prints each line once.

Before, ``read`` took one gateway: a member whose gateway was down longer than its session
was expired by the others, and the lines it had printed but not committed were read again by
whoever got its partitions (a chaos run printed 0.55% of its lines twice)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.gateway.conftest import Client

pytestmark = pytest.mark.kafka


def test_a_group_reader_goes_on_through_the_next_gateway_when_its_own_is_killed(
    start_kafka_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    first, second = start_kafka_gateway(), start_kafka_gateway()
    writer = Client(second.url)
    assert writer.write("first", [1]).status_code == 200  # the topic exists
    out_path, err_path = tmp_path / "reader.jsonl", tmp_path / "reader.err"
    with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
        reader = subprocess.Popen(
            logbroker_cmd(
                "read", "--server", f"{first.url},{second.url}", "--topic", "dc1.app",
                "--group", "across", "--from-beginning", "--format", "jsonl",
                "--session-timeout-ms", "4000",
            ),
            stdout=out_file, stderr=err_file, cwd=REPO,
        )  # fmt: skip
    stop = threading.Event()
    written: list[tuple[str, int]] = []

    def write() -> None:
        seqno = 0
        while not stop.is_set():
            seqno += 1
            for source in ("s1", "s2", "s3", "s4"):
                # a partition of the killed gateway is 503 until the other takes it over
                while writer.write(source, [seqno]).status_code != 200:
                    time.sleep(0.2)
                written.append((source, seqno))
            time.sleep(0.05)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while out_path.read_bytes().count(b"\n") < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        first.kill()
        time.sleep(10)  # well past the member's 4 s session
    finally:
        stop.set()
        thread.join()
    expected = len(written) + 1
    deadline = time.monotonic() + 60
    while out_path.read_bytes().count(b"\n") < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    reader.terminate()
    assert reader.wait(60) == 0, err_path.read_text()
    out, err = out_path.read_bytes(), err_path.read_bytes()
    assert b"dropped from group" not in err, err.decode()
    printed = [(r["source_id"], r["seqno"]) for r in map(json.loads, out.splitlines())]
    assert len(printed) == len(set(printed)), "a line was printed twice"
    assert sorted(printed) == sorted([("first", 1), *written])
    writer.close()
