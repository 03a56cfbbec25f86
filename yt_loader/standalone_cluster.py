"""A Spark standalone cluster on this machine, started from the installed PySpark.

One master and N workers, each a separate JVM in its own process group, all on loopback; each
worker gets its own loopback address (127.0.0.2, 127.0.0.3, ...) so that Spark sees N hosts,
as it would on a real cluster (a speculative copy of a task, for one, never runs on the host
of the attempt it races).  The tests and ``benchmarks/load_bench.py`` use it; it is also the
quickest way to try ``spark-submit --master spark://...`` by hand::

    with StandaloneCluster(Path("/tmp/spark"), workers=2) as cluster:
        print(cluster.master_url)          # spark://127.0.0.1:PORT

``stop()`` SIGKILLs every process group it started (executors and their Python workers are
children of their worker), also when a test fails half-way.  A JVM killed so runs none of its
shutdown hooks, which delete its temporary files: the daemons keep theirs (a worker's
``spark-<uuid>/executor-<uuid>`` directories, with the block managers' files of its executors)
in ``work_dir/tmp``, not in ``/tmp``.  An application's executors take their ``java.io.tmpdir``
from the application (:meth:`StandaloneCluster.executor_java_options`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pyspark

MASTER_HOST = "127.0.0.1"
DAEMON_MEMORY = "256m"
"""Heap of the master and worker daemons themselves (executors have their own)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed PySpark package (bin/, jars/)."""
    return Path(pyspark.__file__).resolve().parent


def spark_bin(name: str) -> str:
    """``spark-class``, ``spark-submit``, ... of the installed PySpark."""
    return str(spark_home() / "bin" / name)


def free_port(host: str = MASTER_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class _Daemon:
    name: str
    host: str
    log_path: Path
    proc: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the daemon's process group: the JVM and every executor it launched."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""


_MASTER_PORT = re.compile(r"Successfully started service 'sparkMaster' on port (\d+)")
_MASTER_WEBUI_PORT = re.compile(r"Bound MasterWebUI to \S+, and started at http://[^:\s]+:(\d+)")


class ClusterNotReady(RuntimeError):
    """The master or a worker did not come up in time."""


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each."""

    def __init__(
        self,
        work_dir: Path,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        start_timeout_s: float = 120.0,
    ) -> None:
        self.work_dir = work_dir
        self.cores = cores
        self.memory = memory
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.webui_port = free_port()
        self.master_url = f"spark://{MASTER_HOST}:{self.port}"
        self.worker_hosts = [f"127.0.0.{2 + i}" for i in range(workers)]
        self.tmp_dir = work_dir / "tmp"
        """The daemons' ``java.io.tmpdir`` and the workers' local directories."""
        self._master: _Daemon | None = None
        self._workers: dict[str, _Daemon] = {}

    # -- starting ---------------------------------------------------------------------------
    def start(self) -> StandaloneCluster:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._master = self._launch(
                "master",
                MASTER_HOST,
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    MASTER_HOST,
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.webui_port),
                ],
            )
            self._wait_for_master_ports()
            for host in self.worker_hosts:
                self.start_worker(host, wait=False)
            self.wait_for_workers(len(self.worker_hosts))
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_master_ports(self) -> None:
        """The ports the master really listens on, from its log.

        A port found free a moment earlier may be taken by another process before the master
        binds it; Spark then takes the next one and says so only in its log.
        """
        assert self._master is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                log = self._master.log_path.read_text(errors="replace")
            except FileNotFoundError:
                log = ""
            rpc = _MASTER_PORT.search(log)
            ui = _MASTER_WEBUI_PORT.search(log)
            if rpc and ui:
                self.port, self.webui_port = int(rpc.group(1)), int(ui.group(1))
                self.master_url = f"spark://{MASTER_HOST}:{self.port}"
                return
            if not self._master.alive():
                raise ClusterNotReady(f"the master exited: {self._master.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterNotReady(
                    f"the master did not start within {self.start_timeout_s} s: "
                    + self._master.log_tail()
                )
            time.sleep(0.2)

    def executor_java_options(self) -> str:
        """``spark.executor.extraJavaOptions`` that keep an application's executors'
        temporary files (native libraries they unpack, for one) in :attr:`tmp_dir`."""
        return f"-Djava.io.tmpdir={self.tmp_dir}"

    def _daemon_env(self, host: str) -> dict[str, str]:
        """The environment of the master or a worker at ``host``."""
        # A worker makes its executors' directories under SPARK_LOCAL_DIRS, else java.io.tmpdir
        daemon_opts = os.environ.get("SPARK_DAEMON_JAVA_OPTS", "")
        if "-Djava.io.tmpdir=" not in daemon_opts:
            daemon_opts = f"{daemon_opts} -Djava.io.tmpdir={self.tmp_dir}".strip()
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": daemon_opts,
            "SPARK_NO_DAEMONIZE": "1",
        }

    def _launch(self, name: str, host: str, args: list[str]) -> _Daemon:
        log_path = self.work_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [spark_bin("spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._daemon_env(host),
                cwd=self.work_dir,
                start_new_session=True,
            )
        return _Daemon(name, host, log_path, proc)

    def start_worker(self, host: str, wait: bool = True) -> None:
        """Start (or start again, after :meth:`kill_worker`) the worker at ``host``."""
        name = f"worker-{host}"
        work = self.work_dir / name
        work.mkdir(exist_ok=True)
        self._workers[host] = self._launch(
            name,
            host,
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                host,
                "--webui-port",
                str(free_port(host)),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.master_url,
            ],
        )
        if wait:
            self.wait_for_workers(len(self._workers))

    # -- state ------------------------------------------------------------------------------
    def master_state(self) -> dict[str, object]:
        """The master's JSON status page (``/json/``): workers, applications."""
        url = f"http://{MASTER_HOST}:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            state: dict[str, object] = json.load(response)
        if state.get("url") != self.master_url:
            raise ClusterNotReady(f"{url} is not the status page of {self.master_url}")
        return state

    def alive_workers(self) -> set[str]:
        try:
            state = self.master_state()
        except (OSError, ValueError):  # not answering yet, or not JSON yet
            return set()
        workers = state.get("workers", [])
        assert isinstance(workers, list)
        return {str(w["host"]) for w in workers if w.get("state") == "ALIVE"}

    def wait_for_workers(self, count: int) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while len(self.alive_workers() & set(self.worker_hosts)) < count:
            for daemon in [self._master, *self._workers.values()]:
                if daemon is not None and not daemon.alive():
                    raise ClusterNotReady(f"{daemon.name} exited: {daemon.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterNotReady(
                    f"{count} workers not alive within {self.start_timeout_s} s; master log: "
                    + (self._master.log_tail() if self._master else "")
                )
            time.sleep(0.2)

    def ensure_workers(self) -> None:
        """Start again every worker that was killed; wait until all are registered."""
        for host in self.worker_hosts:
            daemon = self._workers.get(host)
            if daemon is None or not daemon.alive():
                self.start_worker(host, wait=False)
        self.wait_for_workers(len(self.worker_hosts))

    # -- faults and stopping ----------------------------------------------------------------
    def kill_worker(self, host: str) -> None:
        """SIGKILL one worker with its executors, as a machine failure would."""
        self._workers[host].kill()

    def stop(self) -> None:
        for daemon in [*self._workers.values(), self._master]:
            if daemon is not None:
                daemon.kill()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
