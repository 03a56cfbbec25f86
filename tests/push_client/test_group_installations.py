"""The push-client checks which installation each ``--server`` group's gateways belong to: a
group naming two installations, or two groups naming one, is refused at the start (exit 2);
a gateway down then is checked when first reached, and nothing is written to it if it turns
out to be of another installation than its group (or of another group's).

Before, the client never asked: it wrote a group's data into whichever log a URL reached,
and two groups of one log failed over into that log, writing handovers into it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import GatewayProcess
from tests.push_client.conftest import (
    LineWriter,
    PushProcess,
    assert_exactly_once,
    assert_exactly_once_across,
    read_delivered,
    until,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]

FLAGS = ["--failover-after", "1", "--probe-interval", "0.3", "--probe-max-interval", "1"]


def _last_line(push: PushProcess) -> str:
    return push.log().strip().splitlines()[-1]


def test_a_group_naming_two_installations_is_refused_at_the_start(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    first = start_gateway(tmp_path / "data-a")
    other = start_gateway(tmp_path / "data-b")  # another data dir: another installation
    path = tmp_path / "app.log"
    LineWriter("m").append(path, 10)
    push = start_push(
        f"{first.url},{other.url}", tmp_path / "state", path, extra=["--idle-exit", "3"]
    )

    assert push.wait(30) == 2, push.log()
    last = _last_line(push)
    assert last.startswith(f"logbroker push: {other.url} belongs to installation "), last
    assert f"{first.url} to " in last and "one installation" in last, last
    assert read_delivered(first.data_dir, "app").count() == 0
    assert read_delivered(other.data_dir, "app").count() == 0


def test_two_groups_of_one_installation_are_refused_at_the_start(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    data_dir = tmp_path / "data"
    dc1 = start_gateway(data_dir)
    dc2 = start_gateway(data_dir)  # two gateways of one store: one installation
    path = tmp_path / "app.log"
    LineWriter("m").append(path, 10)
    extra = ["--server", f"dc2={dc2.url}", "--idle-exit", "3", *FLAGS]
    push = start_push(f"dc1={dc1.url}", tmp_path / "state", path, extra=extra)

    assert push.wait(30) == 2, push.log()
    last = _last_line(push)
    assert last.startswith(f"logbroker push: {dc2.url} of dc2 belongs to installation "), last
    assert f"as {dc1.url} of dc1 does" in last and "separate installations" in last, last
    assert read_delivered(data_dir, "app").count() == 0


def test_a_gateway_down_at_the_start_and_of_another_installation_is_never_written_to(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    """The daemon goes on (it does not crash), writes nothing to the wrong gateway, and ships
    every line to its own installation once that is back."""
    first = start_gateway(tmp_path / "data-a")
    other = start_gateway(tmp_path / "data-b")
    other.kill()  # down at the client's start: not checked then
    path = tmp_path / "app.log"
    writer = LineWriter("m")
    writer.append(path, 20)
    state = tmp_path / "state"
    push = start_push(f"{first.url},{other.url}", state, path, extra=FLAGS)
    push.wait_started(state)
    assert until(lambda: read_delivered(first.data_dir, "app").count() == 20, 30), push.log()
    other.start()
    first.kill()
    writer.append(path, 20)
    assert until(lambda: "nothing is written there" in push.log(), 30), push.log()
    refusal = next(line for line in push.log().splitlines() if "nothing is written there" in line)
    assert " ERROR " in refusal, refusal
    assert f"{other.url} belongs to installation " in refusal, refusal
    assert f"{first.url} to " in refusal, refusal
    time.sleep(2)  # retries meanwhile go nowhere
    assert push.proc is not None and push.proc.poll() is None, push.log()
    assert read_delivered(other.data_dir, "app").count() == 0
    first.start()
    assert until(lambda: read_delivered(first.data_dir, "app").count() == 40, 40), push.log()
    delivered = read_delivered(first.data_dir, "app")
    assert_exactly_once(delivered, writer)
    assert read_delivered(other.data_dir, "app").count() == 0
    assert push.stop() == 0, push.log()


def test_a_group_down_at_the_start_and_of_another_groups_installation_gets_no_failover(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    """dc2 turns out to be dc1's log once dc1 fails: no handover is written into it, nothing
    goes there; dc1's lines wait for dc1."""
    data_dir = tmp_path / "data"
    dc1 = start_gateway(data_dir)
    dc2 = start_gateway(data_dir)  # one store: one installation
    dc2.kill()
    path = tmp_path / "app.log"
    writer = LineWriter("m")
    writer.append(path, 20)
    state = tmp_path / "state"
    # a fresh state asks every installation its positions: dc2's are waited for 1 s only
    extra = ["--server", f"dc2={dc2.url}", "--position-wait", "1", *FLAGS]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra)
    push.wait_started(state)
    assert until(lambda: read_delivered(data_dir, "app").count() == 20, 30), push.log()
    dc2.start()
    dc1.kill()
    writer.append(path, 20)
    assert until(lambda: "nothing is written there" in push.log(), 30), push.log()
    refusal = next(line for line in push.log().splitlines() if "nothing is written there" in line)
    assert f"{dc2.url} of dc2 belongs to installation " in refusal, refusal
    assert f"as {dc1.url} of dc1 does" in refusal, refusal
    time.sleep(3)  # dc1 down for longer than failover_after_s: dc2 is not written to
    assert push.proc is not None and push.proc.poll() is None, push.log()
    delivered = read_delivered(data_dir, "app")
    assert delivered.count() == 20 and not delivered.handovers, delivered.handovers
    dc1.start()
    assert until(lambda: read_delivered(data_dir, "app").count() == 40, 40), push.log()
    delivered = read_delivered(data_dir, "app")
    assert_exactly_once(delivered, writer)
    assert not delivered.handovers, delivered.handovers
    assert push.stop() == 0, push.log()


def test_a_one_shot_run_that_could_reach_only_another_installation_exits_2(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    first = start_gateway(tmp_path / "data-a")
    other = start_gateway(tmp_path / "data-b")
    other.kill()
    path = tmp_path / "app.log"
    state = tmp_path / "state"
    push = start_push(f"{first.url},{other.url}", state, path, extra=["--idle-exit", "8"])
    push.wait_started(state)  # the start's check is done: first named its installation
    first.kill()
    other.start()
    writer = LineWriter("m")
    writer.append(path, 10)

    assert push.wait(60) == 2, push.log()
    assert "Refused: " in push.log() and "exiting with status 2" in push.log(), push.log()
    assert f"{other.url} belongs to installation " in push.log(), push.log()
    assert read_delivered(other.data_dir, "app").count() == 0


def _failing_kinds(state: Path, group: str) -> list[str]:
    """The kinds of the failing gateways of ``group`` in the client's ``status.json``."""
    try:
        status = json.loads((state / "status.json").read_bytes())
    except (OSError, ValueError):
        return []
    return [
        gateway["error"]
        for installation in status.get("installations", [])
        if installation["name"] == group
        for gateway in installation["failing_gateways"]
    ]


def _repoint(gateway: GatewayProcess, data_dir: Path) -> None:
    """The gateway's URL reaches another log from now on (a name or a balancer moved)."""
    gateway.kill()
    gateway.data_dir = data_dir
    gateway.start()


def test_a_gateway_that_comes_back_as_another_installation_is_written_nothing(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    """The one URL of the client fails, then answers again from another log (its name moved
    while it was down): the client asked its installation only once, at its start, and
    wrote the next lines into the other log, whose seqnos it took for its own.  Now it asks
    again before sending anything, refuses it, and ships on once the URL reaches its own
    log again: every line once, in the client's own log."""
    own, other = tmp_path / "data-own", tmp_path / "data-other"
    gateway = start_gateway(own)
    path = tmp_path / "app.log"
    writer = LineWriter("m")
    writer.append(path, 20)
    state = tmp_path / "state"
    push = start_push(gateway.url, state, path, extra=FLAGS)
    push.wait_started(state)
    assert until(lambda: read_delivered(own, "app").count() == 20, 30), push.log()
    gateway.kill()
    writer.append(path, 20)
    assert until(lambda: "request failed, retrying" in push.log(), 30), push.log()
    _repoint(gateway, other)
    assert until(lambda: "nothing is written there" in push.log(), 30), push.log()
    refusal = next(line for line in push.log().splitlines() if "nothing is written there" in line)
    assert " ERROR " in refusal, refusal
    assert f"{gateway.url} belongs to installation " in refusal, refusal
    assert " now, and belonged to " in refusal, refusal
    assert until(lambda: "OtherInstallation" in _failing_kinds(state, "default"), 20), push.log()
    time.sleep(2)  # retries meanwhile go nowhere
    assert push.proc is not None and push.proc.poll() is None, push.log()
    assert read_delivered(other, "app").count() == 0

    _repoint(gateway, own)  # the name moves back
    assert until(lambda: read_delivered(own, "app").count() == 40, 40), push.log()
    assert "written to again" in push.log(), push.log()
    assert_exactly_once(read_delivered(own, "app"), writer)
    assert read_delivered(other, "app").count() == 0
    assert push.stop() == 0, push.log()


def test_a_dc_whose_gateway_comes_back_as_another_installation_stays_down(
    tmp_path: Path, start_gateway: Callable[..., GatewayProcess], start_push
) -> None:
    """dc1 fails over to dc2; dc1's URL then answers from a third log (its balancer now
    points elsewhere): the prober found it up and the client wrote dc1's next lines, and a
    handover, into that log.  Now the prober asks its installation again: dc1 stays down,
    its lines go to dc2, nothing to the third log; once dc1's URL reaches dc1's log again,
    lines go back there, each in exactly one installation."""
    data1, data2, stray = tmp_path / "data-dc1", tmp_path / "data-dc2", tmp_path / "data-x"
    dc1, dc2 = start_gateway(data1), start_gateway(data2)
    path = tmp_path / "app.log"
    writer = LineWriter("m")
    writer.append(path, 20)
    state = tmp_path / "state"
    extra = ["--server", f"dc2={dc2.url}", *FLAGS]
    push = start_push(f"dc1={dc1.url}", state, path, extra=extra)
    push.wait_started(state)
    assert until(lambda: read_delivered(data1, "app").count() == 20, 30), push.log()
    dc1.kill()
    writer.append(path, 20)
    assert until(lambda: read_delivered(data2, "app").count() == 20, 30), push.log()
    _repoint(dc1, stray)
    assert until(lambda: "nothing is written there" in push.log(), 30), push.log()
    refusal = next(line for line in push.log().splitlines() if "nothing is written there" in line)
    assert " ERROR " in refusal and f"{dc1.url} belongs to installation " in refusal, refusal
    writer.append(path, 20)
    assert until(lambda: read_delivered(data2, "app").count() == 40, 30), push.log()
    time.sleep(2)  # probes meanwhile find dc1's URL of another installation
    assert read_delivered(stray, "app").count() == 0
    assert not read_delivered(stray, "app").handovers
    status = json.loads((state / "status.json").read_bytes())
    assert [i["up"] for i in status["installations"]] == [False, True], status["installations"]

    _repoint(dc1, data1)
    assert until(lambda: "installation dc1 is up again" in push.log(), 30), push.log()
    writer.append(path, 20)

    def delivered() -> int:
        return read_delivered(data1, "app").count() + read_delivered(data2, "app").count()

    assert until(lambda: delivered() == 80, 30), push.log()
    assert push.stop() == 0, push.log()
    assert_exactly_once_across([read_delivered(data1, "app"), read_delivered(data2, "app")], writer)
    assert read_delivered(data1, "app").count() > 20  # new data went back to dc1
    assert read_delivered(stray, "app").count() == 0
