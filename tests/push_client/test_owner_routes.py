"""The owners' map of the push-client: which owner URLs the token may go to, what a failure
does, and how the option is configured."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from push_client.config import ConfigError, build_config
from push_client.owner_routes import OwnerPolicy, OwnerRoutes
from tests.conftest import free_port, logbroker_cmd
from tests.metrics_text import samples
from tests.push_client.conftest import (
    LineWriter,
    assert_exactly_once,
    read_delivered,
    wait_for_lines,
)


def _answer(*owners: object, topic: str = "dc1.app") -> dict[str, object]:
    return {
        "topic": topic,
        "gateway": "http://gw1.example:8080",
        "partitions": [{"partition": p, "owner": o} for p, o in enumerate(owners)],
    }


def test_the_token_goes_only_to_owner_urls_the_operator_allowed() -> None:
    policy = OwnerPolicy.for_servers(["http://gw*.example:8080"], ["http://lb.example:8080"])
    assert policy.origin_of("http://gw2.example:8080") == "http://gw2.example:8080"
    assert policy.origin_of("http://GW2.example:8080/") == "http://gw2.example:8080"
    for refused in (
        "http://evil.example:8080",
        "http://gw2.example:9090",
        "http://user:pw@gw2.example:8080",
        "http://gw2.example:8080/elsewhere",
        "http://gw2.example:8080?x=1",
        "ftp://gw2.example:8080",
        "http://gw2.example:port",
        None,
        42,
    ):
        assert policy.origin_of(refused) is None, refused


def test_an_https_installation_never_sends_its_token_over_http() -> None:
    policy = OwnerPolicy.for_servers(["*"], ["https://lb.example"])
    assert policy.origin_of("http://gw1.example:8080") is None
    assert policy.origin_of("https://gw1.example") == "https://gw1.example"


def test_owners_are_used_until_one_fails_then_shunned_and_asked_for_again() -> None:
    routes = OwnerRoutes(OwnerPolicy.for_servers(["http://*"], ["http://lb"]), refresh_s=30.0)
    assert routes.due(["app"], 0.0) == ["app"]
    assert routes.owner("app", "dc1.app", 0, 0.0) is None  # unknown: the gateways
    routes.on_answer("app", _answer("http://gw1", None, "http://gw2", "https://x/y"), 1.0)
    assert routes.due(["app"], 2.0) == []
    assert routes.owner("app", "dc1.app", 0, 2.0) == "http://gw1"
    assert routes.owner("app", "dc1.app", 1, 2.0) is None  # none announced
    assert routes.owner("app", "dc1.app", 2, 2.0) == "http://gw2"
    assert routes.owner("app", "dc1.app", 3, 2.0) is None  # not allowed
    assert routes.untrusted == 1
    assert routes.owner("app", "dc1.other", 0, 2.0) is None  # another topic (another DC)
    routes.on_failed("http://gw1", 3.0)
    assert routes.owner("app", "dc1.app", 0, 3.0) is None
    assert routes.due(["app"], 3.0) == ["app"]  # asked for again at once
    routes.on_answer("app", _answer("http://gw1"), 4.0)
    assert routes.owner("app", "dc1.app", 0, 4.0) is None  # still shunned
    assert routes.owner("app", "dc1.app", 0, 33.5) == "http://gw1"
    routes.on_answer("app", None, 40.0)  # a failed ask keeps what is known
    assert routes.owner("app", "dc1.app", 0, 40.0) == "http://gw1"
    assert routes.due(["app"], 69.0) == [] and routes.due(["app"], 70.0) == ["app"]


def test_direct_to_owner_is_off_by_default_and_configured_by_file_or_flag(tmp_path: Path) -> None:
    base = {"servers": ["http://gw1:8080"], "state_dir": str(tmp_path), "log_type": "app"}
    off = build_config(paths=["/var/log/a.log"], **base)  # type: ignore[arg-type]
    assert off.direct_to_owner == ()
    flag = build_config(
        paths=["/var/log/a.log"],
        overrides={"direct_to_owner": "http://gw*:8080, https://gw*.example"},
        **base,  # type: ignore[arg-type]
    )
    assert flag.direct_to_owner == ("http://gw*:8080", "https://gw*.example")
    config = tmp_path / "push.toml"
    config.write_text(
        '[push]\nservers = ["http://gw1:8080"]\nstate_dir = "/tmp/s"\n'
        'direct_to_owner = ["http://gw*:8080"]\nowner_refresh_s = 5\n'
        '[[entry]]\npath = "/var/log/a.log"\nlog_type = "app"\n'
    )
    loaded = build_config(file=config)
    assert loaded.direct_to_owner == ("http://gw*:8080",) and loaded.owner_refresh_s == 5.0
    for bad in ("gw*:8080", "http://gw*/path", "http://u@gw*"):
        with pytest.raises(ConfigError, match="direct_to_owner"):
            build_config(
                paths=["/var/log/a.log"],
                overrides={"direct_to_owner": bad},
                **base,  # type: ignore[arg-type]
            )


def test_a_bad_direct_to_owner_flag_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        logbroker_cmd(
            "push",
            "--server",
            "http://127.0.0.1:9",
            "--log-type",
            "app",
            "--state-dir",
            str(tmp_path / "state"),
            "--direct-to-owner",
            "not a url",
            str(tmp_path / "a.log"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "direct_to_owner" in done.stderr


@pytest.mark.fault
def test_an_owner_that_accepts_and_never_answers_holds_a_request_only_owner_timeout_s(
    tmp_path: Path, start_gateway, start_push
) -> None:
    """The gateway names as every partition's owner a socket that accepts connections and
    never answers (a frozen owner, or one behind a dead proxy).  Each request sent there
    goes to the configured gateway after ``--owner-timeout`` (1 s), not after the
    60 s request timeout, and every line arrives once."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        owner = f"http://127.0.0.1:{silent.getsockname()[1]}"
        gateway = start_gateway(None, "--advertised-url", owner)
        path = tmp_path / "app.log"
        writer = LineWriter("own")
        writer.append(path, 200)
        metrics_port = free_port()
        flags = ["--direct-to-owner", "http://127.0.0.1:*", "--owner-refresh", "0.5"]
        push = start_push(
            gateway.url,
            tmp_path / "state",
            path,
            extra=[*flags, "--owner-timeout", "1", "--metrics-port", str(metrics_port)],
        )
        wait_for_lines(gateway.data_dir, "app", 200)  # no topic yet: sent to the gateway

        def push_metric(name: str, **labels: str) -> float:
            text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            return sum(
                value
                for (n, found), value in samples(text).items()
                if n == name and labels.items() <= dict(found).items()
            )

        deadline = time.monotonic() + 30
        while push_metric("logbroker_push_owner_partitions") < 1:
            assert time.monotonic() < deadline, "the owners' map never named the owner"
            time.sleep(0.1)
        started = time.monotonic()
        writer.append(path, 200)
        wait_for_lines(gateway.data_dir, "app", 400, timeout_s=40)
        assert time.monotonic() - started < 40
        assert push_metric("logbroker_push_owner_writes_total", outcome="fallback") >= 1
        assert push.stop() == 0, push.log()
    assert_exactly_once(read_delivered(gateway.data_dir, "app"), writer)
