"""Fixtures shared by every test group: free ports and real gateway processes."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent


_PORTS = range(10_000, 20_000)
"""Ports the tests' gateways get: below Linux's ephemeral ports (32768 on), which outgoing
connections and binds to port 0 take, and below the 12,000 under them that a local Kafka
keeps for listeners it starts later (``ops.local_kafka._port_left_unbound``)."""
_next_port: int | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that no other test of
    the session was given.

    Each pytest-xdist worker hands out its own slice of :data:`_PORTS` in turn.  Ports the
    kernel picked (binding port 0) could be given to two workers at once, or to a test while
    another test's killed gateway was still being retried at it: a gateway that then lost the
    bind exited, but its test had already seen ``/healthz`` answered by the other test's
    gateway, and the two tests wrote into each other's logs.  A run in one process (``-n 0``)
    takes one of ten slices by its pid, so that two such runs side by side rarely meet.

    Two sessions on one machine (two checkouts tested at once) hand out the same slices: a
    port is also held by a lock file (``_held_by_this_process``) for as long as this process
    lives, so that the other session passes it by."""
    global _next_port
    if "PYTEST_XDIST_WORKER" in os.environ:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        worker = os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")
        index = int(worker) if worker.isdigit() else 0
    else:  # one process (-n 0): a slice by pid, so that two such runs side by side differ
        workers, index = 10, os.getpid() % 10
    size = len(_PORTS) // max(1, workers)
    mine = range(_PORTS.start + index * size, _PORTS.start + (index + 1) * size)
    for _ in range(len(mine)):
        if _next_port is None or _next_port not in mine:
            _next_port = mine.start
        port, _next_port = _next_port, _next_port + 1
        if not _held_by_this_process(port):
            continue  # another test session's
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # something of this machine's: the next one
            return port
    raise RuntimeError(f"no free port in {mine.start}..{mine.stop - 1}")


_PORT_LOCKS = Path(tempfile.gettempdir()) / "logbroker-test-ports"
_held_ports: dict[int, int] = {}
"""Lock files' descriptors of the ports this process was given, kept open until it ends."""


def _held_by_this_process(port: int) -> bool:
    """Whether this process holds ``port``'s lock file (taking it if no other process does):
    the lock goes with the process, also when it is killed."""
    if port in _held_ports:
        return True
    _PORT_LOCKS.mkdir(exist_ok=True)
    fd = os.open(_PORT_LOCKS / str(port), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held_ports[port] = fd
    return True


def openapi_operation(schema: Any, operation: str) -> Any:
    """The schemathesis operation ``"METHOD /path"`` of a loaded schema; fails if absent."""
    method, path = operation.split(" ")
    found = [
        op.ok()
        for op in schema.get_all_operations()
        if op.ok().method.upper() == method and op.ok().path == path
    ]
    assert found, f"{operation} is not in /openapi.json"
    return found[0]


def logbroker_cmd(*args: str) -> list[str]:
    """The ``logbroker`` command line run with this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "ops", *args]


def kill_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of ``proc``'s group (it was started with a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


class GatewayProcess:
    """A real ``logbroker serve`` process on a free loopback port."""

    def __init__(
        self,
        data_dir: Path,
        extra_args: list[str],
        log_path: Path,
        *,
        max_open_files: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args
        self.log_path = log_path
        self.max_open_files = max_open_files
        """``ulimit -n`` of the gateway process (None: inherited)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> GatewayProcess:
        cmd = logbroker_cmd(
            "serve", "--data-dir", str(self.data_dir), "--port", str(self.port), *self.extra_args
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        # Its own process group, so that a kill reaches uvicorn's worker processes too.
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=None if self.max_open_files is None else self._limit_open_files,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    if self.proc.poll() is not None:  # answered by another process
                        continue
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway did not become healthy: {self.log()}")

    def _limit_open_files(self) -> None:
        assert self.max_open_files is not None
        limit = self.max_open_files
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL of the gateway and its workers: a crash, no chance to flush or clean up."""
        if self.proc is not None:
            kill_process_group(self.proc)

    def stop(self) -> int:
        """SIGTERM and wait: the graceful stop (then anything left of the group is killed)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        kill_process_group(self.proc)
        return int(self.proc.returncode)


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a real file system that fills up and can be made read-only (needs root)."""
    mount_point = tmp_path / "smallfs"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[object]:
    """Factory: ``start_gateway(data_dir=None, *extra_args)`` starts a gateway and returns it."""
    started: list[GatewayProcess] = []

    def _start(data_dir: Path | None = None, *extra_args: str) -> GatewayProcess:
        dd = data_dir or (tmp_path / "data")
        gw = GatewayProcess(dd, list(extra_args), tmp_path / f"gateway-{len(started)}.log")
        started.append(gw)
        return gw.start()

    yield _start
    for gw in started:
        gw.kill()


@pytest.fixture
def gateway(start_gateway: object) -> GatewayProcess:
    """One gateway on the embedded store in a fresh data dir."""
    return start_gateway()  # type: ignore[operator]


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Apache Kafka broker (KRaft) per test session (per xdist worker), shared by its
    Kafka tests.

    Tests keep out of each other's way by a namespace of their own (``kafka_namespace``).
    Fetched through Maven on first use; stopped (its process group) at the end, also when
    the session fails, and at interpreter exit as a last resort.
    """
    from ops.local_kafka import LocalKafka

    cluster = LocalKafka(tmp_path_factory.mktemp("kafka"), nodes_count=1)
    atexit.register(cluster.stop)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_namespace() -> str:
    """A namespace no other test uses: topics, groups and transactional ids are its own."""
    import uuid

    return f"t{uuid.uuid4().hex[:10]}."


os.environ.setdefault("PYTHONUNBUFFERED", "1")

# The Spark drivers the tests start (each `logbroker load` child and `spark-submit`, and the
# workers' own Spark sessions) run for seconds to minutes on little data: on two shared cores
# the JIT's optimizing compiler (C2) spends more CPU compiling Spark than its code saves in
# that time.  They compile with C1 only (the Spark tests and the loader's docs took 328 s
# instead of 484 s on two workers, 8.7 CPU minutes instead of 14.2).  Only the tests do this:
# a user's long loads want C2.  A SPARK_SUBMIT_OPTS of the caller's own is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session", autouse=True)
def spark_drivers_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """The ``java.io.tmpdir`` of every Spark driver the tests start: in this run's own temp
    directory, not /tmp.

    A driver keeps its temporary files there (Spark's ``artifacts-<uuid>``, ``spark-<uuid>``,
    ``blockmgr-<uuid>``, the native libraries it unpacks) and deletes them in shutdown hooks,
    which a JVM never runs when a test SIGKILLs it (the loader's crash and streaming tests do,
    by design): each such driver left an ``artifacts-``, a ``blockmgr-`` and two ``spark-``
    directories and two ``liblz4-java-*.so`` in /tmp.  None if the caller's SPARK_SUBMIT_OPTS
    names a java.io.tmpdir of its own.
    """
    opts = os.environ["SPARK_SUBMIT_OPTS"]
    if "-Djava.io.tmpdir=" in opts:
        yield None
        return
    tmpdir = tmp_path_factory.mktemp("spark-drivers-tmp", numbered=False)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} -Djava.io.tmpdir={tmpdir}"
    try:
        yield tmpdir
    finally:
        os.environ["SPARK_SUBMIT_OPTS"] = opts


# -- five workers -------------------------------------------------------------------------------
# The README's test command runs the suite on five pytest-xdist workers, each test on whichever
# worker is free.  Most tests spend their time waiting (for a gateway to start, a timeout to
# pass, Kafka to commit), so more workers than cores fill the waits: a third worker on two
# cores took the suite from 19-21 minutes to 15 (an earlier round), and with three the suite
# later left a fifth of two cores idle in CI (37 CPU-minutes in 24).  Session- and
# module-scoped fixtures (the Kafka broker, the Spark session, a module's gateway or Spark
# cluster) are made once per worker, by the first test there that needs one: at most five of
# each, for a balance no grouping of tests onto one worker could give (the Spark tests alone
# would keep one worker busy for most of the run).  The exception is a module whose
# module-scoped fixture costs more than the spread of its tests is worth: its tests all run on
# one worker, so the fixture is made once.

ONE_WORKER_MODULES = ("tests/yt_loader/test_cluster.py",)
"""Modules run whole on one worker (``--dist loadgroup``): the Spark standalone cluster of
test_cluster.py, three JVMs, would otherwise start on each worker its tests land on."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with each module of :data:`ONE_WORKER_MODULES` as one group.

    The groups are named here, by module, not with ``xdist_group`` marks: xdist puts a mark's
    group into the test's node id, which pytest 9.2 no longer lets it change.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModulesOnOneWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else super()._split_scope(nodeid)

    return ModulesOnOneWorker(config, log)


# -- no process outlives the run ----------------------------------------------------------------
# pytest becomes a child subreaper: every process a test starts, and every process those start
# (uvicorn workers, JVMs, Spark executors), is re-parented to pytest when its parent dies.  So
# what is still alive among pytest's children once every fixture is torn down was left behind
# by a test: it is listed, killed, and the run fails.

_PR_SET_CHILD_SUBREAPER = 36
_OWN_BASETEMP = pytest.StashKey[Path]()
_PASSED = pytest.StashKey[bool]()
_WORKERS_LEFT = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started as a background command of a script (`./scripts/test.sh &`): SIGINT is
        # ignored, and every process the tests start would inherit that.  A shell cannot
        # trap a signal ignored when it started, so the tests' Ctrl-C of the quick start
        # would stop nothing.  The tests run as if started from a terminal.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if config.option.basetemp is None:
        # pytest's shared /tmp/pytest-of-USER keeps only the 3 newest runs' directories and
        # deletes older ones, also those of a run still going on the same machine: each run
        # gets a directory of its own instead, removed when the run passes.
        config.option.basetemp = tempfile.mkdtemp(prefix="logbroker-tests-")
        config.stash[_OWN_BASETEMP] = Path(config.option.basetemp)


def _live_children() -> dict[int, str]:
    """pid -> command line of this process's children that are alive (zombies reaped)."""
    me = os.getpid()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, ppid = fields[0], int(fields[1])
        if ppid != me:
            continue
        if state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(entry.name), os.WNOHANG)
            continue
        found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
    return found


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_BASETEMP, None)
    if own is not None and config.stash.get(_PASSED, False):
        shutil.rmtree(own, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if config.pluginmanager.has_plugin("dsession"):
        # the controller of xdist workers: it starts no test's process; each worker checks its
        # own and reports what it found (``pytest_testnodedown``)
        left = config.stash.get(_WORKERS_LEFT, [])
    else:
        left = _stop_what_is_left()
        workeroutput = getattr(config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller reports and fails the run
            workeroutput["left_running"] = left
            left = []
    if left:
        message = "processes started by the tests were left running:\n" + "\n".join(left)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config.stash[_PASSED] = session.exitstatus == 0


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """An xdist worker ended: keep what it found left running, for the controller's report."""
    workeroutput = getattr(node, "workeroutput", None) or {}
    left = node.config.stash.setdefault(_WORKERS_LEFT, [])
    left.extend(workeroutput.get("left_running", []))


def _stop_what_is_left() -> list[str]:
    """Kill this process's children still alive at the end; one line per process killed."""
    left = _live_children()
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:  # a graceful stop may still be finishing
        time.sleep(0.2)
        left = _live_children()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"  pid {pid}: {cmd}" for pid, cmd in sorted(left.items())]
