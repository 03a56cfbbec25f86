"""``logbroker mirror`` refuses a destination that is the source's own installation, or the
installation of the DC whose topics it copies: exit 2, nothing copied."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from audit.publisher import INTERVAL_ENV
from delivery.mirror import Mirror, WrongDestination, encode_replica_body
from session_dedup.envelope import Envelope, encode
from tests.conftest import REPO, GatewayProcess, logbroker_cmd
from tests.delivery.conftest import Writer, wait_until
from tests.scripted_http import LoopbackServer, running


def _mirror(src: str, dst: str, prefix: str = "dc1.") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("mirror", "--from", src, "--to", dst, "--prefix", prefix, "--idle-exit", "1"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,  # the old mirror copied into itself for ever
    )


def _end_offsets(url: str) -> dict[str, list[int]]:
    """Each topic's partitions' end offsets, as the gateway at ``url`` lists them."""
    out = {}
    for t in httpx.get(f"{url}/v1/topics", params={"include_audit": "true"}).json()["topics"]:
        info = httpx.get(f"{url}/v1/topics/{t['name']}").json()
        out[t["name"]] = [p["end_offset"] for p in info["partitions"]]
    return out


def _settled(url: str) -> dict[str, list[int]]:
    """``_end_offsets`` once they stayed the same for three of the gateways' audit
    publication intervals (0.5 s here): a publication of the counts of writes made before
    the test must not be taken for a write of the mirror's."""
    last = _end_offsets(url)
    for _ in range(40):
        time.sleep(1.5)
        now = _end_offsets(url)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the topics of {url} kept growing: {last}")


def _replica_append(url: str, topic: str, source: str) -> httpx.Response:
    value = encode(Envelope("s", "h", "f", topic.split(".", 1)[1], "raw", 1, 0, 0, b"x\n"))
    return httpx.post(
        f"{url}/v1/replica/{topic}/partitions/0",
        params={"source": source, "partitions": 1, "start": 0},
        content=encode_replica_body([(0, value)]),
    )


def _installation(url: str) -> str:
    found = httpx.get(f"{url}/healthz").json()["installation"]
    assert isinstance(found, str) and len(found) == 32
    return found


@pytest.fixture(scope="module")
def dcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GatewayProcess]]:
    """Gateways of three installations, started at once: ``dc1``, ``dc2``, and ``also-dc1``
    (another installation with ``--dc dc1``); the first publishes its audit counts at once."""
    base = tmp_path_factory.mktemp("dcs")
    names = {"dc1": "dc1", "dc2": "dc2", "also-dc1": "dc1"}
    gateways = {
        name: GatewayProcess(base / name, ["--dc", dc], base / f"{name}.log")
        for name, dc in names.items()
    }
    os.environ[INTERVAL_ENV] = "0.5"  # read by the gateways as they start
    try:
        starts = [threading.Thread(target=g.start) for g in gateways.values()]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
    finally:
        del os.environ[INTERVAL_ENV]
    try:
        for g in gateways.values():
            assert httpx.get(f"{g.url}/healthz").status_code == 200, g.log()
        for name, source, seqnos in (("dc1", "src", range(1, 21)), ("also-dc1", "own", [1])):
            writer = Writer(gateways[name].url)  # also-dc1: its own push-clients' topic
            writer.write(source, list(seqnos))
            writer.close()
        yield gateways
    finally:
        for g in gateways.values():
            g.kill()


def test_a_mirror_between_two_urls_of_one_gateway_exits_2_and_copies_nothing(
    dcs: dict[str, GatewayProcess],
) -> None:
    # dc2's installation holds dc1.* copies, and a mirror of them is pointed at itself
    dc2 = dcs["dc2"]
    assert _replica_append(dc2.url, "dc1.selfcopy", "a-dc1-topic-id").status_code == 200
    before = _settled(dc2.url)
    done = _mirror(dc2.url, f"http://localhost:{dc2.port}")
    assert done.returncode == 2, done.stderr
    assert "--from and --to are the same installation" in done.stderr
    assert "copied" not in done.stderr
    assert _end_offsets(dc2.url) == before
    assert before["dc1.selfcopy"] == [1]


def test_a_mirror_into_the_installation_of_the_prefixes_dc_exits_2_and_writes_nothing(
    dcs: dict[str, GatewayProcess],
) -> None:
    dc1, also_dc1 = dcs["dc1"], dcs["also-dc1"]
    before = _settled(also_dc1.url)
    done = _mirror(dc1.url, also_dc1.url)
    assert done.returncode == 2, done.stderr
    assert f"the destination {also_dc1.url} is the installation of DC dc1" in done.stderr
    # the destination refuses by itself too (a mirror too old to ask, a prefix like "dc")
    source = httpx.get(f"{dc1.url}/v1/topics/dc1.app").json()["topic_id"]
    replica = f"{also_dc1.url}/v1/replica/dc1.app/partitions/0"
    for refused in (
        _replica_append(also_dc1.url, "dc1.app", source),
        _replica_append(also_dc1.url, "dc1.other", source),
        httpx.get(replica, params={"source": source}),
        httpx.post(f"{replica}/dropped", params={"source": source, "partitions": 1, "to": 3}),
    ):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "own_dc_topic"
        assert "own DC (dc1)" in refused.json()["reason"]
    done = _mirror(dc1.url, also_dc1.url, prefix="dc")
    assert done.returncode == 2, done.stderr
    assert f"the destination {also_dc1.url} refused: dc1.app is a topic of" in done.stderr
    assert _end_offsets(also_dc1.url) == before


def test_dc1_mirrored_into_dc2_is_copied_once_with_its_audit_topic(
    dcs: dict[str, GatewayProcess],
) -> None:
    dc1, dc2 = dcs["dc1"], dcs["dc2"]
    wait_until(lambda: "dc1.logbroker-audit" in _end_offsets(dc1.url), 20, "dc1's audit counts")
    assert _installation(dc1.url) != _installation(dc2.url)
    done = _mirror(dc1.url, dc2.url)
    assert done.returncode == 0, done.stderr
    copied = _end_offsets(dc2.url)
    assert copied["dc1.app"] == _end_offsets(dc1.url)["dc1.app"]
    assert sum(copied["dc1.app"]) == 20
    assert sum(copied["dc1.logbroker-audit"]) > 0


def test_an_installation_keeps_its_id_across_a_restart(dcs: dict[str, GatewayProcess]) -> None:
    also_dc1 = dcs["also-dc1"]
    first = _installation(also_dc1.url)
    also_dc1.stop()
    also_dc1.start()
    assert _installation(also_dc1.url) == first


class _MovedGateway(BaseHTTPRequestHandler):
    """A destination URL that answers 503 to everything but ``/healthz``, whose
    ``installation`` is ``answers[0]`` the first time and ``answers[1]`` after (the URL
    reaching another gateway once the outage is over)."""

    answers: list[str] = []
    asked: list[str] = []

    def do_GET(self) -> None:
        if self.path != "/healthz":
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        installation = self.answers[min(len(self.asked), 1)]
        self.asked.append(installation)
        body = json.dumps({"status": "ok", "dc": "dc2", "installation": installation}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        """Nothing on stderr for each request."""


def test_after_an_outage_the_mirror_asks_again_which_installation_the_destination_is(
    dcs: dict[str, GatewayProcess],
) -> None:
    _MovedGateway.answers = ["another-installation", _installation(dcs["dc1"].url)]
    with running(LoopbackServer(_MovedGateway)) as server:
        mirror = Mirror(dcs["dc1"].url, server.url, "dc1.")
        try:
            with pytest.raises(WrongDestination, match="the same installation"):
                mirror.run(threading.Event(), idle_exit_s=20)
        finally:
            mirror.close()
    assert len(_MovedGateway.asked) == 2
    assert mirror.stats.copied_messages == 0


class _OldGateway(BaseHTTPRequestHandler):
    """A gateway from before installations: ``/healthz`` without ``installation``."""

    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "dc": "dc2"}).encode()
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        """Nothing on stderr for each request."""


@pytest.fixture
def old_gateway() -> Iterator[str]:
    with running(LoopbackServer(_OldGateway)) as server:
        yield server.url


def test_a_gateway_that_does_not_name_its_installation_leaves_the_urls_to_compare(
    dcs: dict[str, GatewayProcess], old_gateway: str, caplog: Any
) -> None:
    mirror = Mirror(dcs["dc1"].url, old_gateway, "dc1.")
    try:
        mirror.check_ends()  # not refused: only the URLs differ, and the command compared them
    finally:
        mirror.close()
    assert "does not name its installation" in caplog.text
    assert "destination" in caplog.text
