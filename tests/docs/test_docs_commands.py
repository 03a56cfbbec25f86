"""Every shell command in the README and docs/ runs, against real processes.

Each Markdown file is one test: its ``sh`` blocks run in order in a scratch directory, with a
real gateway (embedded store, ``dc1``) behind the docs' gateway names, a second one (``dc2``)
when a block names it, and the session's Apache Kafka when a block names a Kafka bootstrap.
How blocks are picked and adapted is in :mod:`tests.docs.doc_blocks`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, GatewayProcess, free_port, kill_process_group
from tests.docs.doc_blocks import (
    HOST_URLS,
    OWN_PIDS_VARIABLE,
    ShellBlock,
    adapt,
    confine_pkill,
    needs_kafka,
    shell_blocks,
)

MARKDOWN = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
SAMPLE_FILES = ("var/log/app.log", "var/log/app/app.log", "var/log/nginx/access.log")


def documents() -> list[Path]:
    return [p for p in MARKDOWN if shell_blocks(p)]


class DocsWorld:
    """What one Markdown file's commands run against."""

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest, blocks: list[ShellBlock]):
        self.tmp = tmp_path
        self.sandbox = tmp_path / "root"
        for sub in ("var/lib", "var/log/app", "var/log/nginx", "etc/logbroker", "data", "shared"):
            (self.sandbox / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("srv",):
            (self.sandbox / sub).mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(SAMPLE_FILES):
            lines = "".join(f"sample line {n} of {name}\n" for n in range(5 + i))
            (self.sandbox / name).write_text(lines)
        self.gateways: dict[str, GatewayProcess] = {}
        self.daemons: list[tuple[ShellBlock, subprocess.Popen[bytes], Path]] = []
        runnable = [b for b in blocks if b.mode != "not-run"]
        wanted = {"dc1"}
        if any(re.search(rf"http://({'|'.join(HOST_URLS['dc2'])}):8080", b.text) for b in runnable):
            wanted.add("dc2")
        for dc in sorted(wanted):
            data = self.sandbox / "var/lib" / ("logbroker" if dc == "dc1" else f"logbroker-{dc}")
            gateway = GatewayProcess(data, ["--dc", dc], tmp_path / f"gateway-{dc}.log")
            self.gateways[dc] = gateway.start(timeout_s=60)
        self.kafka: str | None = None
        if needs_kafka(blocks):
            self.kafka = request.getfixturevalue("kafka_cluster").bootstrap
        self.ports: dict[str, int] = {}
        """Ports (other than 8080) of gateways the doc starts itself -> the free port used."""
        self.urls = {dc: g.url for dc, g in self.gateways.items()}
        self.urls.setdefault("dc2", self.urls["dc1"])

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            PORT=str(free_port()),
            DEMO_DIR=str(self.tmp / "demo"),
            LOGBROKER_PORT=str(free_port()),
        )
        return env

    def run(self, block: ShellBlock) -> None:
        text = confine_pkill(adapt(block.text, self.urls, self.sandbox, self.kafka))
        log = self.tmp / f"block-{block.line}.out"
        env = self.env()
        env[OWN_PIDS_VARIABLE] = " ".join(str(pid) for pid in self._own_pids())
        text = re.sub(r"--port 8080\b", f"--port {env['LOGBROKER_PORT']}", text)
        if block.mode == "background":
            for port in re.findall(r"--port (\d+)", text):
                if port != env["LOGBROKER_PORT"]:
                    self.ports.setdefault(port, free_port())
        for port, real in self.ports.items():
            text = re.sub(rf"(--port |127\.0\.0\.1:|localhost:){port}\b", rf"\g<1>{real}", text)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", "-c", text],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        shown = f"{block.where}:\n{text}"
        if block.mode == "background":
            self.daemons.append((block, proc, log))
            if "logbroker serve" in text:
                self._wait_healthy(proc, env["LOGBROKER_PORT"], text, log, shown)
            return
        if block.mode == "stop-after":
            self._follow(block, proc, log, shown)
            return
        try:
            proc.wait(block.seconds)
        except subprocess.TimeoutExpired:
            kill_process_group(proc)
            raise AssertionError(
                f"still running after {block.seconds} s: {shown}{_tail(log)}"
            ) from None
        finally:
            kill_process_group(proc)
        assert proc.returncode == block.exit_code, (
            f"exit {proc.returncode}, expected {block.exit_code}: {shown}{_tail(log)}"
        )

    def _own_pids(self) -> list[int]:
        """The processes of the daemons this page started (each in a session of its own)."""
        pids: list[int] = []
        for _block, proc, _log in self.daemons:
            if proc.poll() is None:
                found = subprocess.run(
                    ["pgrep", "-s", str(proc.pid)], capture_output=True, text=True, check=False
                )
                pids += [int(pid) for pid in found.stdout.split()]
        return pids

    def _wait_healthy(
        self, proc: subprocess.Popen[bytes], port: str, text: str, log: Path, shown: str
    ) -> None:
        found = re.search(r"--port (\d+)", text)
        url = f"http://127.0.0.1:{found.group(1) if found else port}/healthz"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited with {proc.returncode}: {shown}{_tail(log)}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"no healthy gateway at {url}: {shown}{_tail(log)}")

    def _follow(
        self, block: ShellBlock, proc: subprocess.Popen[bytes], log: Path, shown: str
    ) -> None:
        assert block.expect is not None
        deadline = time.monotonic() + block.seconds
        try:
            while block.expect not in log.read_text(errors="replace"):
                assert proc.poll() is None or block.expect in log.read_text(errors="replace"), (
                    f"exited with {proc.returncode} before printing {block.expect!r}: "
                    f"{shown}{_tail(log)}"
                )
                assert time.monotonic() < deadline, (
                    f"{block.expect!r} not printed within {block.seconds} s: {shown}{_tail(log)}"
                )
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        finally:
            kill_process_group(proc)

    def close(self) -> None:
        problems = []
        for block, proc, log in self.daemons:
            if proc.poll() is not None:
                problems.append(f"{block.where} exited early ({proc.returncode}){_tail(log)}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            kill_process_group(proc)
        for gateway in self.gateways.values():
            gateway.stop()
        assert not problems, "\n".join(problems)


def _tail(log: Path) -> str:
    return "\n--- output ---\n" + log.read_text(errors="replace")[-3000:]


@pytest.fixture
def world_for(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    worlds: list[DocsWorld] = []

    def _make(blocks: list[ShellBlock]) -> DocsWorld:
        worlds.append(DocsWorld(tmp_path, request, blocks))
        return worlds[-1]

    yield _make
    for world in worlds:
        world.close()


@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.timeout(1200)  # a page may start Spark or a Kafka broker, on a loaded machine
@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(doc, marks=[pytest.mark.kafka] if needs_kafka(shell_blocks(doc)) else [])
        for doc in documents()
    ],
    ids=lambda p: p.name,
)
def test_every_shell_block_of_the_doc_runs(doc: Path, world_for: Any) -> None:
    blocks = shell_blocks(doc)
    world = world_for(blocks)
    for block in blocks:
        if block.mode != "not-run":
            world.run(block)


def test_blocks_not_run_are_few_and_say_why() -> None:
    """The reasons, so a reviewer sees at once what the docs test does not cover."""
    skipped = [b for p in MARKDOWN for b in shell_blocks(p) if b.mode == "not-run"]
    run = [b for p in MARKDOWN for b in shell_blocks(p) if b.mode != "not-run"]
    assert all(b.reason for b in skipped)
    assert len(skipped) <= max(3, len(run) // 5), [f"{b.where}: {b.reason}" for b in skipped]


def test_the_block_parser_reads_directives(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "```sh\nlogbroker topics --help\n```\n"
        "```toml\nport = 1\n```\n"
        '<!-- docs-test: stop-after 9 expect "ready" -->\n```sh\nlogbroker read\n```\n'
        "<!-- docs-test: not run: needs a cluster -->\n```sh\nspark-submit\n```\n"
        "<!-- docs-test: exit 2 -->\n```sh\nlogbroker read --topic app\n```\n"
    )
    blocks = shell_blocks(doc)
    assert [(b.mode, b.line) for b in blocks] == [
        ("run", 1),
        ("stop-after", 8),
        ("not-run", 12),
        ("run", 16),
    ]
    assert blocks[1].seconds == 9 and blocks[1].expect == "ready"
    assert blocks[2].reason == "needs a cluster"
    assert blocks[3].exit_code == 2
    sandbox = tmp_path / "root"
    adapted = adapt(
        "logbroker push --server http://gw1:8080,http://c:8080 /var/log/a.log --x=/data/w\n",
        {"dc1": "http://127.0.0.1:1", "dc2": "http://127.0.0.1:2"},
        sandbox,
        None,
    )
    assert adapted == (
        f"logbroker push --server http://127.0.0.1:1,http://127.0.0.1:2 {sandbox}/var/log/a.log "
        f"--x={sandbox}/data/w\n"
    )


def test_a_pkill_of_the_docs_signals_only_the_pages_own_daemon_that_its_pattern_matches(
    tmp_path: Path,
) -> None:
    """``pkill -HUP -f '[l]ogbroker push --config'`` of push-client.md, run as it is, signalled
    every push-client of the host: in a parallel run, another test's client died of it (129)."""
    name = f"logbroker push --config {tmp_path}/push.toml"
    own, other = (
        subprocess.Popen(["bash", "-c", f"exec -a '{name}' sleep 60"], start_new_session=True)
        for _ in range(2)
    )
    try:
        time.sleep(0.3)  # both exec'd
        env = {**os.environ, OWN_PIDS_VARIABLE: str(own.pid)}
        block = "pkill -HUP -f '[l]ogbroker push --config'\n"
        done = subprocess.run(
            ["bash", "-e", "-c", confine_pkill(block)], env=env, capture_output=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        assert own.wait(10) == -signal.SIGHUP
        assert other.poll() is None  # not this page's: left alone
        # a pattern that misses the page's daemon fails the block, as a wrong doc must
        env[OWN_PIDS_VARIABLE] = str(other.pid)
        block = "pkill -HUP -f '[l]ogbroker push --config /etc/elsewhere.toml'\n"
        done = subprocess.run(
            ["bash", "-e", "-c", confine_pkill(block)], env=env, capture_output=True, timeout=30
        )
        assert done.returncode != 0 and b"matches none of the page's daemons" in done.stderr
        assert other.poll() is None
    finally:
        for proc in (own, other):
            proc.kill()
            proc.wait(10)
