"""``logbroker read --server A,B`` goes on through B when A fails only if B is a gateway of
A's installation: a list naming two installations is refused (exit 2, one line) at the start,
or, if the second did not answer then, before anything is read from it, whose offsets belong
to another log.

Before, the reader went on at A's offsets in B's log: it skipped B's first messages and
printed the rest as if they came after A's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import GatewayProcess
from tests.delivery.conftest import ReaderProcess, wait_until
from tests.gateway.conftest import Client


def _write(url: str, source: str, count: int) -> None:
    writer = Client(url)
    try:
        for seqno in range(1, count + 1):
            assert writer.write(source, [seqno]).status_code == 200
    finally:
        writer.close()


def _read(start_reader: Callable[..., ReaderProcess], first: str, second: str) -> ReaderProcess:
    return start_reader(
        "--server", f"{first},{second}", "--topic", "dc1.app", "--from-beginning",
        "--format", "jsonl", "--idle-exit", "30",
    )  # fmt: skip


def _sources(reader: ReaderProcess) -> list[tuple[str, int]]:
    return [(r["source_id"], r["seqno"]) for r in reader.records()]


def test_a_reader_refuses_a_second_gateway_of_another_installation_at_its_start(
    start_gateway: Callable[..., GatewayProcess],
    start_reader: Callable[..., ReaderProcess],
    tmp_path: Path,
) -> None:
    """Every URL is asked its installation at the start: a wrong second one is refused at
    once, with the first healthy (before, the reader read on through the first, and the
    wrong one was found only once the first failed)."""
    first = start_gateway(tmp_path / "dc1-a")
    other = start_gateway(tmp_path / "dc1-b")  # another data dir: another installation
    _write(first.url, "first", 3)
    reader = _read(start_reader, first.url, other.url)

    assert reader.wait(20) == 2, reader.stderr()
    last = reader.stderr().strip().splitlines()[-1]
    assert last.startswith(f"logbroker read: {other.url} belongs to installation "), last
    assert f"{first.url} to " in last, last
    assert _sources(reader) == []


def test_a_reader_refuses_a_second_gateway_of_another_installation_down_at_its_start(
    start_gateway: Callable[..., GatewayProcess],
    start_reader: Callable[..., ReaderProcess],
    tmp_path: Path,
) -> None:
    """A URL that did not answer at the start is checked when the reader first reaches it."""
    first = start_gateway(tmp_path / "dc1-a")
    other = start_gateway(tmp_path / "dc1-b")  # another data dir: another installation
    _write(first.url, "first", 3)
    _write(other.url, "other", 12)
    other.kill()
    reader = _read(start_reader, first.url, other.url)
    wait_until(lambda: len(_sources(reader)) == 3, 30, "the first gateway's messages")
    other.start()
    first.kill()

    assert reader.wait(60) == 2, reader.stderr()
    last = reader.stderr().strip().splitlines()[-1]
    assert "installation" in last and other.url in last and first.url in last, last
    # nothing of the other installation's log was printed (its offsets 3.. are not ours)
    assert _sources(reader) == [("first", n) for n in (1, 2, 3)]


def test_a_reader_goes_on_through_a_second_gateway_of_its_installation(
    start_gateway: Callable[..., GatewayProcess],
    start_reader: Callable[..., ReaderProcess],
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    first = start_gateway(data_dir)
    second: Any = start_gateway(data_dir)  # two gateways of one store
    _write(first.url, "src", 3)
    reader = _read(start_reader, first.url, second.url)
    wait_until(lambda: len(_sources(reader)) == 3, 30, "the first messages")
    first.kill()
    writer = Client(second.url)
    assert writer.write("src", [4]).status_code == 200
    writer.close()
    wait_until(lambda: len(_sources(reader)) == 4, 30, "the message written through the second")
    assert _sources(reader) == [("src", n) for n in (1, 2, 3, 4)]
    assert reader.proc.poll() is None, reader.stderr()


def test_a_reader_refuses_its_one_url_once_it_reaches_another_installation(
    start_gateway: Callable[..., GatewayProcess],
    start_reader: Callable[..., ReaderProcess],
    tmp_path: Path,
) -> None:
    """One URL can reach another installation after an outage (a load balancer or a name
    moved to another DC): the reader's positions are offsets of the first log, so it stops
    (exit 2, one line) instead of going on at them in the other's."""
    gw = start_gateway(tmp_path / "dc1-a")
    other = start_gateway(tmp_path / "dc1-b")
    _write(gw.url, "first", 3)
    _write(other.url, "other", 12)
    other.kill()
    reader = start_reader(
        "--server", gw.url, "--topic", "dc1.app", "--from-beginning", "--format", "jsonl",
        "--idle-exit", "30",
    )  # fmt: skip
    wait_until(lambda: len(_sources(reader)) == 3, 30, "the first installation's messages")
    gw.kill()
    gw.data_dir = other.data_dir  # the same URL, now a gateway of the other installation
    gw.start()

    assert reader.wait(60) == 2, reader.stderr()
    last = reader.stderr().strip().splitlines()[-1]
    assert f"{gw.url} belongs to installation" in last and "now" in last, last
    assert _sources(reader) == [("first", n) for n in (1, 2, 3)]
