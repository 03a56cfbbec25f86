"""A local Apache Kafka (KRaft) for tests, benchmarks and trying logbroker out.

Apache Kafka itself, not a look-alike: ``org.apache.kafka:kafka_2.13`` and its runtime
dependencies are fetched once through Maven into ``~/.cache/logbroker/kafka-<version>/libs``
(or taken from ``$KAFKA_HOME/libs`` when a user has an unpacked release), each node's storage
is formatted with ``kafka.tools.StorageTool``, and ``kafka.Kafka`` runs with a generated
``server.properties`` on free loopback ports and a log4j2 config writing to a file.

One node, or three (each broker and controller, replication factor 3 possible).  Every node
also has a second listener, ``PROXIED``, advertised at a port nobody listens on until a test
puts a TCP proxy there: clients bootstrapped through it reach the node only through the proxy,
so a test can cut and restore one client's connection to Kafka while others keep theirs.

    python -m ops.local_kafka start --dir /tmp/kafka [--nodes 3]   # prints the bootstrap
    python -m ops.local_kafka restart --dir /tmp/kafka   # same ports and storage: an outage
    python -m ops.local_kafka stop --dir /tmp/kafka      # restart starts it again on them
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

KAFKA_VERSION = "4.1.1"
_LOG4J_API_VERSION = "2.24.3"
_SLF4J_VERSION = "2.0.17"
HEAP = "-Xmx768m"
_STATE_FILE = "cluster.json"


class KafkaUnavailable(RuntimeError):
    """Kafka could not be fetched or started."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_left_unbound() -> int:
    """A free port for a listener that starts much later or again (a test's TCP proxy in front
    of the broker, a node's listeners after a restart): outside the kernel's ephemeral range,
    which outgoing connections and every ``bind(0)`` draw from, so none of them takes it
    meanwhile.  (A node on ephemeral ports failed to restart: while it was down, an outgoing
    connection's local port was its controller port, "Address already in use".)"""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _free_port()
    for _ in range(100):
        port = random.randrange(max(1024, low - 12_000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return _free_port()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "logbroker"


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>logbroker</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """The directory of Kafka's jars: ``$KAFKA_HOME/libs``, or fetched once through Maven."""
    home = os.environ.get("KAFKA_HOME")
    if home:
        libs = Path(home) / "libs"
        if not list(libs.glob("kafka_2.13-*.jar")):
            raise KafkaUnavailable(f"KAFKA_HOME={home} has no libs/kafka_2.13-*.jar")
        return libs
    target = cache_dir() / f"kafka-{version}"
    libs = target / "libs"
    done = target / ".complete"
    if done.exists():
        return libs
    if shutil.which("mvn") is None:
        raise KafkaUnavailable("Maven (mvn) is needed to fetch Apache Kafka; or set KAFKA_HOME")
    work = target.with_name(f".kafka-{version}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_text(
        _POM.format(kafka=version, slf4j=_SLF4J_VERSION, log4j=_LOG4J_API_VERSION)
    )
    print(f"local_kafka: fetching Apache Kafka {version} through Maven", file=sys.stderr)
    result = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={work / 'libs'}",
            "-DincludeScope=runtime",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise KafkaUnavailable(f"mvn failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    (work / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    # Another process may have finished the same fetch first; either copy is whole.
    with contextlib.suppress(OSError):
        os.rename(work, target)
    shutil.rmtree(work, ignore_errors=True)
    return libs


_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{path}">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.controller" level="INFO"/>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


@dataclass
class KafkaNode:
    """One KRaft node (broker and controller) of a local cluster."""

    node_id: int
    directory: Path
    port: int
    controller_port: int
    proxied_port: int
    proxied_advertised_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def proxied_bootstrap(self) -> str:
        """Where a client must connect to be served through the test's proxy."""
        return f"127.0.0.1:{self.proxied_advertised_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class LocalKafka:
    """A local KRaft cluster of one or three nodes.  Use :meth:`start` and :meth:`stop`."""

    base_dir: Path
    nodes_count: int = 1
    extra_config: dict[str, str] = field(default_factory=dict)
    version: str = KAFKA_VERSION
    nodes: list[KafkaNode] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def proxied_bootstrap(self) -> str:
        return ",".join(n.proxied_bootstrap for n in self.nodes)

    # -- set-up -------------------------------------------------------------------------------
    def _plan(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # every listener is bound again on the same port when a node restarts
        ports: list[int] = []
        while len(ports) < 4 * self.nodes_count:
            port = _port_left_unbound()
            if port not in ports:
                ports.append(port)
        self.nodes = [
            KafkaNode(
                node_id=i + 1,
                directory=self.base_dir / f"node{i + 1}",
                port=ports[4 * i],
                controller_port=ports[4 * i + 1],
                proxied_port=ports[4 * i + 2],
                proxied_advertised_port=ports[4 * i + 3],
            )
            for i in range(self.nodes_count)
        ]

    def _properties(self, node: KafkaNode) -> str:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        replicas = min(3, self.nodes_count)
        config = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{node.port},PROXIED://127.0.0.1:{node.proxied_port},"
                f"CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://127.0.0.1:{node.port},"
                f"PROXIED://127.0.0.1:{node.proxied_advertised_port}"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "log.dirs": str(node.directory / "data"),
            "num.partitions": "1",
            "default.replication.factor": str(replicas),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": str(min(2, replicas)),
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # the gateways' group (KIP-848) may take a dead gateway's partitions in seconds
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.min.heartbeat.interval.ms": "100",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "2",
            "num.replica.fetchers": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "message.max.bytes": str(32 * 1024 * 1024),
            "replica.fetch.max.bytes": str(32 * 1024 * 1024),
            # a killed node is noticed (fenced, out of the ISR, leaders moved) in seconds
            "replica.lag.time.max.ms": "3000",
            "broker.session.timeout.ms": "3000",
            "broker.heartbeat.interval.ms": "500",
        }
        config.update(self.extra_config)
        return "".join(f"{k}={v}\n" for k, v in config.items())

    def _java(self, libs: Path) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise KafkaUnavailable("java is needed to run Apache Kafka (Java 17 or newer)")
        return [java, "-cp", f"{libs}/*"]

    def _format(self, libs: Path, cluster_id: str) -> None:
        for node in self.nodes:
            shutil.rmtree(node.directory, ignore_errors=True)  # fresh storage every start
            node.directory.mkdir(parents=True, exist_ok=True)
            (node.directory / "server.properties").write_text(self._properties(node))
            (node.directory / "log4j2.xml").write_text(_LOG4J2.format(path=node.log_path))
            result = subprocess.run(
                [
                    *self._java(libs),
                    "-Xmx256m",
                    f"-Dlog4j2.configurationFile={node.directory / 'log4j2.xml'}",
                    "kafka.tools.StorageTool",
                    "format",
                    # "=": a cluster id may begin with "-"
                    f"--cluster-id={cluster_id}",
                    "-c",
                    str(node.directory / "server.properties"),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if result.returncode != 0:
                raise KafkaUnavailable(f"formatting node {node.node_id}: {result.stderr[-2000:]}")

    def start(self, timeout_s: float = 180.0) -> LocalKafka:
        """Fetch Kafka if needed, format fresh storage, start every node, wait until ready."""
        libs = kafka_libs(self.version)
        self._libs = libs
        self._plan()
        # A KRaft cluster id is 16 random bytes in URL-safe base64 without padding.
        import base64

        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self._format(libs, cluster_id)
        return self._run(timeout_s)

    def _run(self, timeout_s: float) -> LocalKafka:
        """Start every node on its storage, wait until ready, note how to stop them."""
        try:
            for node in self.nodes:
                self._spawn(node)
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        self._save_state()
        return self

    def _spawn(self, node: KafkaNode) -> None:
        out = open(node.directory / "stdout.log", "ab")  # noqa: SIM115 - the child keeps it
        cmd = [
            *self._java(self._libs),
            HEAP,
            "-Xss512k",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.xml'}",
            "kafka.Kafka",
            str(node.directory / "server.properties"),
        ]
        # Its own process group: stop() signals the JVM and anything it started, at once.
        node.proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()

    def wait_ready(self, timeout_s: float = 180.0, nodes: list[KafkaNode] | None = None) -> None:
        """Wait until every (or the given) node serves admin requests as a broker.

        Each look is a child process (:func:`_probe`): librdkafka can abort the whole process
        when an admin request times out while brokers come and go (its issue #4605,
        ``eonce->refcnt > 0``), and a look at a cluster that is starting is exactly that.
        """
        wanted = sorted({n.node_id for n in (nodes or self.nodes)})
        deadline = time.monotonic() + timeout_s
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise KafkaUnavailable(
                        f"node {node.node_id} exited with {node.proc.returncode}: "
                        f"{self.log_tail(node)}"
                    )
            try:
                look = subprocess.run(
                    [sys.executable, "-m", "ops.local_kafka", "probe", self.bootstrap]
                    + [str(n) for n in wanted],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    cwd=Path(__file__).resolve().parent.parent,
                )
            except subprocess.TimeoutExpired:
                last_error = "the readiness probe did not answer in 30 s"
                continue
            if look.returncode == 0:
                return
            last_error = (look.stdout.strip() or look.stderr.strip()[-500:]) or (
                f"the readiness probe ended with {look.returncode}"
            )
            time.sleep(0.2)
        raise KafkaUnavailable(f"Kafka did not become ready in {timeout_s:.0f} s: {last_error}")

    def log_tail(self, node: KafkaNode, chars: int = 3000) -> str:
        texts = []
        for path in (node.directory / "stdout.log", node.log_path):
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace")[-chars:])
        return "\n".join(texts)

    # -- faults -------------------------------------------------------------------------------
    def kill_node(self, index: int) -> None:
        """SIGKILL one node's JVM (and its process group)."""
        node = self.nodes[index]
        if node.alive():
            assert node.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(30)

    def restart_node(self, index: int, timeout_s: float = 180.0) -> None:
        node = self.nodes[index]
        self._spawn(node)
        self.wait_ready(timeout_s)

    # -- stop ---------------------------------------------------------------------------------
    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM every node's process group; SIGKILL what is left after ``grace_s``."""
        running = [n for n in self.nodes if n.alive()]
        for node in running:
            assert node.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for node in running:
            assert node.proc is not None
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                node.proc.wait(30)
        with contextlib.suppress(FileNotFoundError):
            (self.base_dir / _STATE_FILE).unlink()

    def _save_state(self) -> None:
        state = {
            "bootstrap": self.bootstrap,
            "proxied_bootstrap": self.proxied_bootstrap,
            "pgids": [n.proc.pid for n in self.nodes if n.proc is not None],
            "version": self.version,
            "nodes": [
                {
                    "node_id": n.node_id,
                    "directory": str(n.directory),
                    "port": n.port,
                    "controller_port": n.controller_port,
                    "proxied_port": n.proxied_port,
                    "proxied_advertised_port": n.proxied_advertised_port,
                }
                for n in self.nodes
            ],
        }
        (self.base_dir / _STATE_FILE).write_text(json.dumps(state))


def _stop_pgids(pgids: list[int], grace_s: float = 20.0) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pgid in pgids:
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def restart_by_state(
    base_dir: Path, timeout_s: float = 180.0, *, down_for_s: float = 0.0
) -> LocalKafka:
    """Stop a cluster that ``start`` of the command line runs and start it again on the same
    ports and storage, ``down_for_s`` seconds later (a broker outage and its end, for trying
    out the gateways)."""
    path = base_dir / _STATE_FILE
    state = json.loads(path.read_text())
    if "nodes" not in state:
        raise KafkaUnavailable(f"the cluster in {base_dir} was started by an older version")
    _stop_pgids(state["pgids"])
    time.sleep(down_for_s)
    cluster = LocalKafka(base_dir, len(state["nodes"]), version=state["version"])
    cluster.nodes = [
        KafkaNode(**{**node, "directory": Path(node["directory"])}) for node in state["nodes"]
    ]
    cluster._libs = kafka_libs(cluster.version)
    try:
        return cluster._run(timeout_s)
    except BaseException:
        # The storage and the ports are still this cluster's: once the cause is mended,
        # ``restart`` can be asked again (without the file it said "no cluster runs").
        path.write_text(json.dumps({**state, "pgids": []}))
        raise


def _running(base_dir: Path) -> bool:
    """Whether ``start`` or ``restart`` of the command line left a cluster running in
    ``base_dir`` (a ``stop`` keeps its state, with no process, for ``restart``)."""
    path = base_dir / _STATE_FILE
    if not path.exists():
        return False
    for pgid in json.loads(path.read_text()).get("pgids", []):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            return True  # there, though another user's
        return True
    return False


def stop_by_state(base_dir: Path) -> bool:
    """Stop a cluster started by another process (``start`` of the command line).

    Its ports and storage stay recorded: ``restart`` starts it again on them, so that
    gateways left running reconnect (``start`` begins afresh, on other ports)."""
    path = base_dir / _STATE_FILE
    if not _running(base_dir):
        return False
    state = json.loads(path.read_text())
    _stop_pgids(state["pgids"])
    path.write_text(json.dumps({**state, "pgids": []}))
    return True


def _probe(bootstrap: str, wanted: set[int]) -> int:
    """One look at a cluster: 0 when the wanted nodes are brokers and group coordination
    answers (a group listing needs the coordinators' internal topics), else 1 with why."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        cluster = admin.describe_cluster(request_timeout=5).result(timeout=10)
        seen = {n.id for n in cluster.nodes}
        if not wanted <= seen:
            print(f"brokers up: {sorted(seen)}, waiting for {sorted(wanted)}")
            return 1
        admin.list_consumer_groups(request_timeout=5).result(timeout=10)
    except Exception as exc:
        print(str(exc))
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"] and len(argv) >= 2:  # wait_ready's look, in a process of its own
        return _probe(argv[1], {int(node) for node in argv[2:]})
    parser = argparse.ArgumentParser(prog="local_kafka", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("fetch", "start", "stop", "restart"))
    parser.add_argument("--dir", type=Path, default=Path("kafka-local"))
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    parser.add_argument(
        "--down-for",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="restart: keep the cluster stopped this long before starting it again",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.down_for <= 3600 or (args.down_for and args.action != "restart"):
        parser.error("--down-for takes 0 to 3600 seconds, with restart only")
    try:
        if args.action == "fetch":
            print(kafka_libs())
        elif args.action == "start":
            if _running(args.dir):
                print(f"a cluster runs in {args.dir}; stop it first", file=sys.stderr)
                return 2
            if (args.dir / _STATE_FILE).exists():
                print(
                    f"the cluster stopped in {args.dir} is wiped: a new one starts on other "
                    f"ports, which gateways of the old one never find (`restart --dir "
                    f"{args.dir}` starts a stopped cluster again on its ports and storage)",
                    file=sys.stderr,
                )
            cluster = LocalKafka(args.dir, args.nodes).start()
            print(cluster.bootstrap)
        elif args.action == "restart":
            if not (args.dir / _STATE_FILE).exists():
                print(f"no cluster was started in {args.dir}", file=sys.stderr)
                return 1
            print(restart_by_state(args.dir, down_for_s=args.down_for).bootstrap)
        else:
            if not stop_by_state(args.dir):
                print(f"no cluster runs in {args.dir}", file=sys.stderr)
                return 1
    except KafkaUnavailable as exc:
        print(f"local_kafka: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
