"""The alert rules in ops/alerts/ name only metrics the daemons export, and promtool accepts them.

A push-client ships a file to a gateway, a consumer group commits, a push subscription
cannot deliver, a mirror copies the topic to a second gateway; each daemon's ``/metrics`` is
scraped, and every metric an alert's expression names must be among what they export, so a
renamed metric breaks this test instead of silently disarming an alert.  promtool (from
Debian's ``prometheus`` package, unpacked, not installed) checks the rules' syntax and runs
their unit tests (``ops/alerts/logbroker.rules.test.yml``): each alert fires on the series it
is meant for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, free_port, logbroker_cmd
from tests.metrics_text import sample
from tests.push_client.conftest import FAST_FLAGS, LineWriter, PushProcess, wait_for_lines

pytestmark = pytest.mark.slow

RULES = REPO / "ops" / "alerts" / "logbroker.rules.yml"
RULE_TESTS = REPO / "ops" / "alerts" / "logbroker.rules.test.yml"
_METRIC = re.compile(r"\blogbroker_[A-Za-z0-9_]+")
LINES = 200


def _exported(url: str) -> set[str]:
    """Metric family names and sample names (``_bucket``, ``_count``...) of one scrape."""
    return _names(httpx.get(f"{url}/metrics", timeout=30).text)


def _names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        names.update(s.name for s in family.samples)
    return names


def _expressions() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    ]


def _wait(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _lag(url: str, name: str, **labels: str) -> float | None:
    return sample(httpx.get(f"{url}/metrics", timeout=30).text, name, **labels)


def test_every_metric_an_alert_names_is_exported_by_a_daemon_and_every_one_is_documented(
    start_gateway: Any, tmp_path: Path
) -> None:
    dc1 = start_gateway(tmp_path / "dc1", "--dc", "dc1", "--push-allow", "127.0.0.1")
    dc2 = start_gateway(tmp_path / "dc2", "--dc", "dc2")
    logs = tmp_path / "logs"
    logs.mkdir()
    LineWriter("alerts").append(logs / "app.log", LINES)
    push_port, mirror_port = free_port(), free_port()
    push = PushProcess(
        [
            "--server",
            dc1.url,
            "--log-type",
            "app",
            "--state-dir",
            str(tmp_path / "push-state"),
            "--metrics-port",
            str(push_port),
            *FAST_FLAGS,
            str(logs / "app.log"),
        ],
        tmp_path / "push.log",
    ).start()
    mirror = subprocess.Popen(
        logbroker_cmd(
            "mirror",
            "--from",
            dc1.url,
            "--to",
            dc2.url,
            "--prefix",
            "dc1.",
            "--metrics-port",
            str(mirror_port),
        ),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "mirror.log", "wb"),  # noqa: SIM115 - the child's
        start_new_session=True,
    )
    try:
        wait_for_lines(dc1.data_dir, "app", LINES, timeout_s=60)
        push_url = f"http://127.0.0.1:{push_port}"
        mirror_url = f"http://127.0.0.1:{mirror_port}"
        _wait("the push-client's metrics", lambda: _lag(push_url, "logbroker_push_files") == 1)

        # a consumer group that committed offset 0 everywhere lags by the whole topic
        http = httpx.Client(base_url=dc1.url, timeout=30)
        member = http.post("/v1/groups/g1/members", json={"topics": ["dc1.app"]}).json()
        ends = {
            p["partition"]: p["end_offset"]
            for p in http.get("/v1/topics/dc1.app").json()["partitions"]
        }
        committed = http.post(
            "/v1/groups/g1/offsets",
            json={
                "member_id": member["member_id"],
                "offsets": [{"topic": "dc1.app", "partition": p, "offset": 0} for p in ends],
            },
        )
        assert committed.status_code == 200, committed.text
        lag = _lag(dc1.url, "logbroker_consumer_group_lag_messages", group="g1", topic="dc1.app")
        assert lag == sum(ends.values()) > 0
        # a push subscription whose endpoint refuses every connection lags by the whole topic
        nobody = f"http://127.0.0.1:{free_port()}/push"
        created = http.post(
            "/v1/subscriptions", json={"name": "s1", "endpoint": nobody, "topics": ["dc1.app"]}
        )
        assert created.status_code == 201, created.text
        _wait(
            "the subscription's lag",
            lambda: (
                _lag(
                    dc1.url,
                    "logbroker_push_subscription_lag_messages",
                    subscription="s1",
                    topic="dc1.app",
                )
                == sum(ends.values())
            ),
        )
        http.close()

        # the mirror catches up: its lag falls to zero with every message copied
        def mirrored() -> bool:
            text = httpx.get(f"{mirror_url}/metrics", timeout=30).text
            copied = sample(text, "logbroker_mirror_copied_messages_total", topic="dc1.app")
            lags = [
                sample(text, "logbroker_mirror_lag_messages", topic="dc1.app", partition=str(p))
                for p in ends
            ]
            return copied == sum(ends.values()) and lags == [0.0] * len(ends)

        _wait("the mirror to catch up", mirrored)

        exported = set().union(*(_exported(u) for u in (dc1.url, dc2.url, push_url, mirror_url)))
        # the end-to-end audit's verdict, left for node_exporter's textfile collector
        prom = tmp_path / "logbroker-audit.prom"

        def audited() -> bool:
            # the tiers publish their counts every 10 s: until the first are in, the audit
            # finds no window and says so (exit 2), writing no file
            subprocess.run(
                logbroker_cmd(
                    "audit",
                    "--windows",
                    "--data-dir",
                    str(dc1.data_dir),
                    "--db",
                    str(tmp_path / "audit.db"),
                    "--metrics-file",
                    str(prom),
                ),
                cwd=REPO,
                capture_output=True,
                timeout=60,
            )
            return prom.exists()

        _wait("the audit to find its first windows", audited)
        exported |= _names(prom.read_text())
        documented = (REPO / "docs" / "metrics.md").read_text()
        undocumented = {
            name
            for name in exported
            if name.startswith("logbroker_")
            and not name.endswith(("_bucket", "_count", "_sum", "_created"))
            and not re.search(f"`{name.removesuffix('_total')}(_total)?[`{{]", documented)
        }
        assert undocumented == set(), "exported, not in docs/metrics.md"
        missing = {
            alert: sorted(set(_METRIC.findall(expr)) - exported) for alert, expr in _expressions()
        }
        assert {alert: names for alert, names in missing.items() if names} == {}
        assert len(missing) >= 10
    finally:
        mirror.terminate()
        mirror.wait(30)
        push.kill()


def _promtool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """promtool from Debian's ``prometheus`` package, unpacked into a cache (not installed)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "logbroker"
    binary = cache / "prometheus-deb" / "usr" / "bin" / "promtool"
    if binary.exists():
        return binary
    download = tmp_path_factory.mktemp("prometheus-deb")
    fetch = ["apt-get", "download", "prometheus"]
    if subprocess.run(fetch, cwd=download, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(fetch, cwd=download, check=True, capture_output=True)
    deb = next(download.glob("prometheus_*.deb"))
    unpacked = download / "x"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    target = cache / "prometheus-deb"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        # copied beside the cache first, then renamed: the cache is another file system
        staging = cache / f"prometheus-deb.{os.getpid()}"
        shutil.copytree(unpacked, staging, symlinks=True)
        os.replace(staging, target)
    return binary


def test_promtool_accepts_the_rules_and_each_alert_fires_on_its_series(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    promtool = _promtool(tmp_path_factory)
    checked = subprocess.run(
        [str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [str(promtool), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {name for name, _ in _expressions()}
    covered = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert covered == alerts, f"alerts without a promtool test: {sorted(alerts - covered)}"
