"""Gateways on Apache Kafka: ingest against the raw producer, scaling, latency, takeover.

    python benchmarks/kafka_bench.py [--runs 3] [--seconds 8] [--chunk-bytes 65536]
        [--data lines|constant]
    python benchmarks/kafka_bench.py --ingest-only --runs 5     # the ingest ratios only
    python benchmarks/kafka_bench.py --ingest-only --cpus-each 0.5  # each gateway and the raw
        # producer capped at half a core, a cgroup each: as if each had a machine of its own

One local Kafka broker (``ops/local_kafka.py``), the same for every case of every run; each
run uses namespaces of its own.  Cases (medians of ``--runs``; ratios against the peer
measured in the same run; every case sends the same chunks, 200 B access-log lines unless
``--data constant``):

* raw confluent-kafka producer, ``acks=all``, idempotent, lz4, the same chunk sizes: MB/s,
  and the CPU seconds per MB of its process and of the broker;
* raw transactional producers, one per partition (each its own ``transactional.id``, as a
  partition owner has), committing transactions of the size the one-gateway case's group
  commit made in the same run, plus a small state record each: what Kafka's exactly-once
  writes cost without a gateway (MB/s, CPU per MB);
* one gateway on Kafka (exactly once: transactional writer, seqno table committed with the
  data), load processes posting binary write requests: MB/s, and its ratio to the raw producer;
* two gateways sharing the partitions (half the load sent to each; a gateway forwards the
  sources of partitions it does not own): MB/s and the ratio to one gateway;
* the same two gateways with owner-aware load processes (each learns its sources' partitions
  and the owners, ``GET /v1/owners``, and sends each request to the owner of its sources, as
  the push-client's ``direct_to_owner`` does): MB/s and the ratio to the forwarding case;
* file -> ``logbroker push`` -> gateway on Kafka -> reader: lines/s until a read_committed
  reader has every line;
* line -> reader latency at 5,000 lines/s through push-client, gateway and Kafka: p50, p99;
* takeover of a partition whose seqno table holds 100,000 sources: fencing plus rebuilding
  the table from the snapshot and the changelog's tail, seconds.

Prints a table; never fails on speed.  On a 2-core machine the client, the gateways, the load
generators and the broker share the CPUs, which caps the two-gateway figure unless
``--cpus-each`` gives each gateway (and the raw producer it is compared with) CPU of its own.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import cpu_cap  # noqa: E402
import e2e_bench  # noqa: E402
import gateway_bench  # noqa: E402

from log_store import PartitionState, TopicConfig, UnknownTopic  # noqa: E402
from log_store.kafka import KafkaSettings, open_kafka_store  # noqa: E402
from ops.local_kafka import LocalKafka  # noqa: E402
from session_dedup.chunk_codecs import decompress  # noqa: E402
from session_dedup.envelope import decode  # noqa: E402

PY = sys.executable
LINE_BYTES = 200
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` and its children (0 if gone)."""
    total = 0.0
    pids = [pid]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended since the listing
            continue
        if int(fields[1]) == pid:  # the parent's pid
            pids.append(int(entry))
    for one in pids:
        try:
            with open(f"/proc/{one}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
    return total


class KafkaGateway:
    def __init__(
        self,
        work: Path,
        bootstrap: str,
        namespace: str,
        name: str,
        repo: Path = REPO,
        partitions: int = 4,
        cpus: float | None = None,
    ) -> None:
        self.port = gateway_bench.free_port()
        # with a cap, the gateway (its threads, any workers it forks) has ``cpus`` cores alone
        self.cap = cpu_cap.CpuCap(name, cpus) if cpus else None
        self.url = f"http://127.0.0.1:{self.port}"
        config = work / f"{name}.toml"
        config.write_text(
            f'partitions = {partitions}\nstore = "kafka"\nkafka_bootstrap = "{bootstrap}"\n'
            f'kafka_namespace = "{namespace}"\n[kafka]\nsession_timeout_ms = 6000\n'
        )
        self.proc = subprocess.Popen(
            [PY, "-m", "ops", "serve", "--data-dir", str(work / f"{name}-data"),
             "--port", str(self.port), "--config", str(config)],
            cwd=repo, stdout=open(work / f"{name}.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            preexec_fn=functools.partial(cpu_cap.join, self.cap.procs) if self.cap else None,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"gateway {name} did not start")

    def metric(self, name: str) -> float | None:
        """The gateway's metric ``name`` (no labels), or None if it has none (older versions)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def owned(self) -> float:
        return self.metric("logbroker_kafka_owned_partitions") or 0.0

    def commit_counts(self) -> tuple[float, float, float, float] | None:
        """(Kafka commits, writes they carried, records they wrote, LSO looks to see them
        readable) so far, if it counts them (the looks are 0 for a gateway that does not)."""
        names = ("commits", "committed_transactions", "committed_records", "visibility_looks")
        values = [self.metric(f"logbroker_kafka_{name}") for name in names]
        if any(v is None for v in values[:3]):
            return None
        return (values[0] or 0.0, values[1] or 0.0, values[2] or 0.0, values[3] or 0.0)

    def stop(self) -> None:
        gateway_bench.stop_gateway(self.proc)
        if self.cap is not None:
            self.cap.remove()


def warm_up(gateways: list[KafkaGateway], sources: int = 64, partitions: int = 4) -> None:
    """Create the topic and wait until the group has given out every partition."""
    with httpx.Client(timeout=120) as client:
        body = gateway_bench.MAGIC + b"".join(
            gateway_bench.section(
                b'{"log_type":"bench","source_id":"warm-%d"}' % i, 1, 1, b"warm\n"
            )
            for i in range(sources)
        )
        for _ in range(60):
            r = client.post(
                gateways[0].url + "/v1/write",
                content=body,
                headers={"Content-Type": gateway_bench.BINARY},
            )
            if r.status_code == 200:
                break
            time.sleep(0.5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        owned = [g.owned() for g in gateways]
        if sum(owned) >= 4 + partitions and all(o > 0 for o in owned):  # 4 internal
            return
        time.sleep(0.5)


def log_chunks(chunk_bytes: int, kind: str, count: int = 64) -> list[bytes]:
    """``count`` distinct chunks of about ``chunk_bytes`` that the raw producer and the load
    processes send alike.  ``lines`` (the default): access-log lines of 200 B with a random
    trace id each, what hosts ship (lz4 compresses them about 3x).  ``constant``: one byte
    repeated, which lz4 compresses about 250x, so the raw producer then measures its memory
    copies more than Kafka (the figures before this option)."""
    if kind == "constant":
        return [(b"x" * (chunk_bytes - 1)) + b"\n"] * count
    rng = random.Random(7)
    lines_per_chunk = max(1, chunk_bytes // LINE_BYTES)
    return [
        "".join(
            e2e_bench.access_log_line(c * 100_000 + i, f"{rng.getrandbits(96):024x}")
            for i in range(lines_per_chunk)
        ).encode()
        for c in range(count)
    ]


def raw_producer(
    bootstrap: str,
    topic: str,
    seconds: float,
    chunk_bytes: int,
    data: str = "lines",
    partitions: int = 4,
) -> float:
    """MB/s of a plain idempotent producer, acks=all, into a topic of ``partitions``."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.max.bytes": 16 * 1024 * 1024,
        }
    )
    values = log_chunks(chunk_bytes, data)
    producer.list_topics(topic, timeout=30)
    sent = 0
    started = time.monotonic()
    stop_at = started + seconds
    i = 0
    while time.monotonic() < stop_at:
        try:
            value = values[i % len(values)]
            producer.produce(topic, value, partition=i % partitions)
            sent += len(value)
            i += 1
        except BufferError:
            producer.poll(0.01)
        if i % 64 == 0:
            producer.poll(0)
    producer.flush(60)
    return sent / (time.monotonic() - started) / 1e6


def raw_transactions(
    bootstrap: str,
    topic: str,
    seconds: float,
    chunk_bytes: int,
    data: str = "lines",
    partitions: int = 4,
    commit_bytes: float = 2.5e6,
) -> float:
    """MB/s of Kafka transactions shaped like a gateway's, without the gateway: one
    transactional producer per partition (its own ``transactional.id``, so each is fenced
    alone, as a partition owner is), each committing about ``commit_bytes`` of values plus
    one small record to a state topic's partition per transaction, back to back.

    What the exactly-once write costs Kafka itself, next to the raw idempotent producer: the
    gap between this case and a gateway is the gateway's own work (HTTP, the seqno table,
    waiting for each commit to be readable), not the transactions."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    state = f"{topic}-state"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(topic, partitions, 1), NewTopic(state, partitions, 1)]
    ).values():
        future.result()
    values = log_chunks(chunk_bytes, data)
    per_commit = max(1, round(commit_bytes / chunk_bytes))
    sent = [0] * partitions
    stop_at = time.monotonic() + seconds

    def write(partition: int) -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"{topic}-{partition}",
                "acks": "all",
                "compression.type": "lz4",
                "linger.ms": 0,
                "batch.size": 16 * 1024 * 1024,
                "message.max.bytes": 16 * 1024 * 1024,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        producer.init_transactions(30)
        i = partition
        while time.monotonic() < stop_at:
            producer.begin_transaction()
            for _ in range(per_commit):
                value = values[i % len(values)]
                producer.produce(topic, value, partition=partition)
                sent[partition] += len(value)
                i += 1
            producer.produce(state, b"d" * 64, partition=partition)
            producer.commit_transaction(60)

    started = time.monotonic()
    threads = [threading.Thread(target=write, args=(p,)) for p in range(partitions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(sent) / (time.monotonic() - started) / 1e6


def _run_connections(
    run: Callable[[int], None], connections: int, totals: list[int]
) -> tuple[int, int, float]:
    """Run ``run(i)`` on ``connections`` threads; (bytes acked, requests failed, CPU used)."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return totals[0], totals[1], time.process_time()


def _load_worker(
    port: int, worker: int, connections: int, chunk_bytes: int, seconds: float, data: str
) -> tuple[int, int, float]:
    """One load process: ``connections`` keep-alive connections posting write requests of 8
    sources x 4 chunks.  Returns (acknowledged data bytes, failed requests, CPU seconds)."""
    import http.client

    chunks = log_chunks(chunk_bytes, data)
    totals = [0, 0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def run(conn_id: int) -> None:
        metas = [
            b'{"log_type":"bench","source_id":"w%d-c%d-s%d","server":"h","file":"/f"}'
            % (worker, conn_id, i)
            for i in range(8)
        ]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        seqno = 1
        acked = failed = 0
        while time.monotonic() < stop_at:
            datas = [[chunks[(seqno + i + k) % len(chunks)] for k in range(4)] for i in range(8)]
            body = gateway_bench.MAGIC + b"".join(
                gateway_bench.section_of(m, seqno, d) for m, d in zip(metas, datas, strict=True)
            )
            try:
                conn.request(
                    "POST", "/v1/write", body=body, headers={"Content-Type": gateway_bench.BINARY}
                )
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    acked += sum(len(c) for d in datas for c in d)
                    seqno += 4
                else:
                    failed += 1
            except (OSError, http.client.HTTPException):
                failed += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()
        with lock:
            totals[0] += acked
            totals[1] += failed

    return _run_connections(run, connections, totals)


def _post_json(conn: Any, method: str, path: str, body: Any = None) -> Any:
    import json

    payload = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"{method} {path}: HTTP {response.status} {data[:200]!r}")
    return json.loads(data)


def _sources_by_owner(
    port: int, worker: int, conn_id: int, per_owner: int
) -> dict[str, list[bytes]]:
    """Sources of one connection grouped by their partition's owner URL, ``per_owner`` each:
    their sessions (through the load's gateway) pin them, ``GET /v1/owners`` names the owners."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    candidates = [f"o{worker}-c{conn_id}-s{i}" for i in range(16 * per_owner)]
    sessions = [
        {"log_type": "bench", "source_id": c, "server": "h", "file": "/f"} for c in candidates
    ]
    answers = _post_json(conn, "POST", "/v1/sessions", {"sessions": sessions})["sessions"]
    owners = _post_json(conn, "GET", "/v1/owners?log_type=bench")
    conn.close()
    owner_of = {p["partition"]: p["owner"] for p in owners["partitions"]}
    groups: dict[str, list[bytes]] = {}
    for answer in answers:
        url = owner_of.get(answer["partition"]) or f"http://127.0.0.1:{port}"
        group = groups.setdefault(url, [])
        if len(group) < per_owner:
            group.append(
                b'{"log_type":"bench","source_id":"%s","server":"h","file":"/f"}'
                % answer["source_id"].encode()
            )
    return groups


def _owner_load_worker(
    port: int, worker: int, connections: int, chunk_bytes: int, seconds: float, data: str
) -> tuple[int, int, float]:
    """Like :func:`_load_worker` (requests of 8 sources x 4 chunks), but owner-aware: each
    request carries sources of one owner and goes to that owner, owners taking turns."""
    import http.client
    from urllib.parse import urlsplit

    chunks = log_chunks(chunk_bytes, data)
    totals = [0, 0]
    lock = threading.Lock()
    groups_of = [_sources_by_owner(port, worker, i, 8) for i in range(connections)]
    stop_at = time.monotonic() + seconds

    def run(conn_id: int) -> None:
        groups = list(groups_of[conn_id].items())
        conns = {}
        for url, _metas in groups:
            parts = urlsplit(url)
            conns[url] = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        seqnos = {url: 1 for url, _metas in groups}
        acked = failed = turn = 0
        while time.monotonic() < stop_at:
            url, metas = groups[turn % len(groups)]
            turn += 1
            first = seqnos[url]
            datas = [
                [chunks[(first + i + k) % len(chunks)] for k in range(4)] for i in range(len(metas))
            ]
            body = gateway_bench.MAGIC + b"".join(
                gateway_bench.section_of(m, first, d) for m, d in zip(metas, datas, strict=True)
            )
            try:
                conns[url].request(
                    "POST", "/v1/write", body=body, headers={"Content-Type": gateway_bench.BINARY}
                )
                response = conns[url].getresponse()
                response.read()
                if response.status == 200:
                    acked += sum(len(c) for d in datas for c in d)
                    seqnos[url] += 4
                else:
                    failed += 1
            except (OSError, http.client.HTTPException):
                failed += 1
                conns[url].close()
        for conn in conns.values():
            conn.close()
        with lock:
            totals[0] += acked
            totals[1] += failed

    return _run_connections(run, connections, totals)


def gateway_ingest(
    gateways: list[KafkaGateway],
    seconds: float,
    chunk_bytes: int,
    clients: int,
    connections: int = 8,
    broker_pid: int | None = None,
    cpu: dict[str, float] | None = None,
    owner_aware: bool = False,
    data: str = "lines",
) -> float:
    """MB/s acknowledged by the gateways (load processes spread evenly among them; with
    ``owner_aware``, each sends every request to the owner of its sources).

    ``cpu``, if given, receives the CPU seconds per MB acknowledged of the gateways (all
    together), the broker and the load processes during the measurement, and, from gateways
    that count their commits, the writes (request sections of one partition) per Kafka commit
    (``writes_per_commit``), the MB per commit (``mb_per_commit``) and the requests for
    the last stable offset made to see a commit readable (``looks_per_commit``)."""
    import concurrent.futures
    import multiprocessing

    # spawned, not forked: this process holds librdkafka clients, whose threads a fork breaks
    context = multiprocessing.get_context("spawn")
    counts_before = [g.commit_counts() for g in gateways]
    gateway_cpu = sum(cpu_seconds(g.proc.pid) for g in gateways)
    broker_cpu = cpu_seconds(broker_pid) if broker_pid else 0.0
    with concurrent.futures.ProcessPoolExecutor(max_workers=clients, mp_context=context) as pool:
        futures = [
            pool.submit(
                _owner_load_worker if owner_aware else _load_worker,
                gateways[i % len(gateways)].port,
                i,
                connections,
                chunk_bytes,
                seconds,
                data,
            )
            for i in range(clients)
        ]
        results = [f.result() for f in futures]
        gateway_cpu = sum(cpu_seconds(g.proc.pid) for g in gateways) - gateway_cpu
        broker_cpu = (cpu_seconds(broker_pid) if broker_pid else 0.0) - broker_cpu
    counts_after = [g.commit_counts() for g in gateways]
    megabytes = sum(acked for acked, _failed, _cpu in results) / 1e6
    if cpu is not None and megabytes > 0:
        cpu["gateways"] = gateway_cpu / megabytes
        cpu["broker"] = broker_cpu / megabytes
        cpu["load"] = sum(c for _a, _f, c in results) / megabytes
        deltas = [
            [a - b for a, b in zip(after, before, strict=True)]
            for before, after in zip(counts_before, counts_after, strict=True)
            if before is not None and after is not None
        ]
        if len(deltas) == len(gateways):
            commits = sum(d[0] for d in deltas)
            if commits > 0:
                cpu["writes_per_commit"] = sum(d[1] for d in deltas) / commits
                cpu["mb_per_commit"] = megabytes / commits
                cpu["looks_per_commit"] = sum(d[3] for d in deltas) / commits
    return megabytes / seconds


def ingest_cases(
    work: Path,
    bootstrap: str,
    tag: str,
    repo: Path,
    args: argparse.Namespace,
    broker_pid: int | None = None,
    cpu: dict[str, list[float]] | None = None,
    owner_aware: bool = False,
    owner_first: bool = False,
) -> tuple[float, float, float]:
    """MB/s of one gateway, then of two, started from the checkout ``repo``; with
    ``owner_aware``, also of the same two gateways with owner-aware load processes (before
    the forwarding case with ``owner_first``; else after it, NaN without).  ``cpu`` collects
    CPU seconds per MB: ``one_gateways``, ``one_broker``, ``two_gateways``, ``owner_...``."""
    measured: dict[str, dict[str, float]] = {"one": {}, "two": {}, "owner": {}}
    parts = args.partitions
    cpus = args.cpus_each
    one = [KafkaGateway(work, bootstrap, f"one{tag}.", f"one{tag}", repo, parts, cpus)]
    try:
        warm_up(one, partitions=parts)
        single = gateway_ingest(
            one,
            args.seconds,
            args.chunk_bytes,
            args.clients,
            args.connections,
            broker_pid,
            measured["one"],
            data=args.data,
        )
    finally:
        for g in one:
            g.stop()
    two = [
        KafkaGateway(work, bootstrap, f"two{tag}.", f"two{tag}-{i}", repo, parts, cpus)
        for i in (0, 1)
    ]
    try:
        warm_up(two, partitions=parts)
        owner = float("nan")
        for case in ("owner", "two") if owner_first else ("two", "owner"):
            if case == "owner" and not owner_aware:
                continue
            mb_s = gateway_ingest(
                two,
                args.seconds,
                args.chunk_bytes,
                args.clients,
                args.connections,
                broker_pid,
                measured[case],
                owner_aware=case == "owner",
                data=args.data,
            )
            if case == "owner":
                owner = mb_s
            else:
                double = mb_s
    finally:
        for g in two:
            g.stop()
    if cpu is not None:
        for case, figures in measured.items():
            for name, value in figures.items():
                cpu.setdefault(f"{case}_{name}", []).append(value)
    return single, double, owner


def make_file(path: Path, lines: int) -> None:
    pad = "x" * (LINE_BYTES - 12)
    with open(path, "w") as f:
        for start in range(0, lines, 50_000):
            f.write("".join(f"{i:010d} {pad}\n" for i in range(start, min(lines, start + 50_000))))


def count_lines(bootstrap: str, namespace: str, topic: str, want: int, timeout_s: float) -> int:
    store = open_kafka_store(KafkaSettings(bootstrap, namespace=namespace))
    seen = 0
    offsets: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while seen < want and time.monotonic() < deadline:
            try:
                partitions = store.describe_topic(topic).partitions
            except UnknownTopic:
                time.sleep(0.05)
                continue
            got = False
            for part in partitions:
                result = store.read(topic, part.partition, offsets.get(part.partition, 0), 8 << 20)
                for record in result.records:
                    env = decode(record.value)
                    seen += decompress(env.codec, env.data).count(b"\n")
                got = got or bool(result.records)
                offsets[part.partition] = result.next_offset
            if not got:
                time.sleep(0.01)
    finally:
        store.close()
    return seen


def end_to_end(work: Path, bootstrap: str, namespace: str, lines: int) -> float:
    """Lines/s from starting the push-client until a reader has every line."""
    source = work / f"{namespace}source.log"
    make_file(source, lines)
    gateway = KafkaGateway(work, bootstrap, namespace, f"{namespace}e2e")
    try:
        warm_up([gateway])
        started = time.monotonic()
        push = subprocess.Popen(
            [PY, "-m", "ops", "push", "--server", gateway.url, "--log-type", "e2e",
             "--state-dir", str(work / f"{namespace}state"), "--no-progress",
             "--log-level", "WARNING", str(source)],
            cwd=REPO,
        )  # fmt: skip
        try:
            seen = count_lines(bootstrap, namespace, "dc1.e2e", lines, 600)
            elapsed = time.monotonic() - started
        finally:
            push.terminate()
            push.wait(30)
        if seen != lines:
            raise RuntimeError(f"the reader saw {seen} of {lines} lines")
        return lines / elapsed
    finally:
        gateway.stop()


def latency(work: Path, bootstrap: str, namespace: str, rate: int, seconds: float) -> list[float]:
    """Line-append to read_committed-reader latencies at ``rate`` lines/s, once the path is
    warm: a first line must reach the reader (through topic creation and the first takeover)
    before the timed lines are written."""
    log = work / f"{namespace}lines.log"
    log.write_bytes(b"")
    gateway = KafkaGateway(work, bootstrap, namespace, f"{namespace}lat")
    latencies: list[float] = []
    total = int(rate * seconds)
    try:
        warm_up([gateway])
        push = subprocess.Popen(
            [PY, "-m", "ops", "push", "--server", gateway.url, "--log-type", "lat",
             "--state-dir", str(work / f"{namespace}lat-state"), "--no-progress",
             "--log-level", "WARNING", str(log)],
            cwd=REPO,
        )  # fmt: skip
        store = open_kafka_store(KafkaSettings(bootstrap, namespace=namespace))
        warmed = threading.Event()

        def read() -> None:
            # The partitions are looked up once (a describe costs several Kafka round trips,
            # which would be counted as latency); the lines written before the timed ones (the
            # topic is created and its partitions given out by the first write) are not timed.
            offsets: dict[int, int] = {}
            deadline = time.monotonic() + seconds + 90
            partitions: list[int] = []
            while not partitions and time.monotonic() < deadline:
                try:
                    partitions = [p.partition for p in store.describe_topic("dc1.lat").partitions]
                except UnknownTopic:
                    time.sleep(0.01)
            while len(latencies) < total and time.monotonic() < deadline:
                got = False
                for p in partitions:
                    result = store.read("dc1.lat", p, offsets.get(p, 0), 8 << 20)
                    now = time.time()
                    for record in result.records:
                        env = decode(record.value)
                        for line in decompress(env.codec, env.data).splitlines():
                            if line.startswith(b"warm "):
                                warmed.set()
                                continue
                            latencies.append(now - int(line.split(b" ", 1)[0]) / 1e9)
                    got = got or bool(result.records)
                    offsets[p] = result.next_offset
                if not got:
                    time.sleep(0.001)

        reader = threading.Thread(target=read)
        reader.start()
        pad = b"x" * (LINE_BYTES - 21)
        with open(log, "ab", buffering=0) as f:
            f.write(b"warm %s\n" % pad)
            if not warmed.wait(120):
                raise RuntimeError("the first line never reached the reader")
            batch = max(1, rate // 1000)
            start = time.monotonic()
            for i in range(0, total, batch):
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                f.write(b"".join(b"%d %s\n" % (time.time_ns(), pad) for _ in range(batch)))
        reader.join(seconds + 90)
        push.terminate()
        push.wait(30)
        store.close()
    finally:
        gateway.stop()
    return sorted(latencies)


def takeover(bootstrap: str, namespace: str, sources: int, samples: int) -> list[float]:
    """Seconds a new writer of one partition takes to fence the old one and rebuild the
    seqno table of ``sources`` sources (snapshot plus tail), measured ``samples`` times."""
    settings = KafkaSettings(bootstrap, namespace=namespace, operation_timeout_s=60)
    first = open_kafka_store(settings)
    try:
        first.create_topic("dc1.tk", TopicConfig(partitions=1))
        batch = 10_000
        for start in range(0, sources, batch):

            def fn(state: PartitionState, start: int = start) -> list[bytes]:
                for i in range(start, start + batch):
                    state.put(f"seq/host-{i:06d}:/var/log/app.log:2049:{i}", (7).to_bytes(8, "big"))
                return [b"x"]

            first.transact("dc1.tk", 0, fn)
        # some traffic after the last snapshot: the tail a takeover replays
        for i in range(20):
            first.transact("dc1.tk", 0, lambda s, i=i: (s.put(f"seq/tail-{i}", b"\0" * 8), [])[1])
    finally:
        first.close()
    seconds = []
    for _ in range(samples):
        store = open_kafka_store(settings)
        try:
            store.transact("dc1.tk", 0, lambda _s: [b"after"])
            _topic, _p, took, entries = store.takeovers[-1]
            assert entries >= sources, entries
            seconds.append(took)
        finally:
            store.close()
    return seconds


def _capped_call(
    procs: str, measure: Callable[..., float], arguments: tuple[Any, ...]
) -> tuple[float, float]:
    """In a process of its own: join the cgroup ``procs``, run ``measure(*arguments)``;
    (its result, the CPU seconds it took)."""
    cpu_cap.join(procs)
    own = time.process_time()
    result = measure(*arguments)
    return result, time.process_time() - own


def in_process(
    case: str,
    measure: Callable[..., float],
    arguments: tuple[Any, ...],
    seconds: float,
    broker_pid: int | None,
    cpu: dict[str, list[float]],
    cpus: float | None = None,
) -> float:
    """Run a case whose producers are the load, ``measure(*arguments)``: in this process, or
    with ``cpus`` in a process of its own capped at that many cores, as each gateway is.
    Return its MB/s and add its CPU per MB sent (that process as the load, and the broker)
    to ``cpu`` under ``case``."""
    broker = cpu_seconds(broker_pid) if broker_pid else 0.0
    if cpus:
        import concurrent.futures
        import multiprocessing

        cap = cpu_cap.CpuCap(case, cpus)
        try:
            with concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn")
            ) as pool:
                mb_s, used = pool.submit(_capped_call, cap.procs, measure, arguments).result()
        finally:
            cap.remove()
    else:
        own = time.process_time()
        mb_s = measure(*arguments)
        used = time.process_time() - own
    sent_mb = mb_s * seconds
    cpu.setdefault(f"{case}_load", []).append(used / sent_mb)
    cpu.setdefault(f"{case}_broker", []).append(
        ((cpu_seconds(broker_pid) if broker_pid else 0.0) - broker) / sent_mb
    )
    cpu.setdefault(f"{case}_gateways", []).append(0.0)
    return mb_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--chunk-bytes", type=int, default=65536)
    parser.add_argument("--clients", type=int, default=2, help="load processes in all")
    parser.add_argument(
        "--connections",
        type=int,
        default=8,
        help="keep-alive connections of each load process, each with one 2 MiB write "
        "request in flight: how much a gateway's group commit can gather",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="partitions of the ingest cases' topics (the raw producer's and the gateways')",
    )
    parser.add_argument(
        "--data",
        choices=["lines", "constant"],
        default="lines",
        help="what every case sends: 200 B access-log lines (default) or one repeated byte",
    )
    parser.add_argument("--e2e-lines", type=int, default=200_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--takeover-sources", type=int, default=100_000)
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument(
        "--ingest-only",
        action="store_true",
        help="only the raw producer, one gateway and two gateways (the ingest ratios)",
    )
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="DIR",
        help="another checkout of logbroker (e.g. `git archive` of an older commit): its "
        "gateways are measured too, in the same runs, against the same raw producer",
    )
    parser.add_argument(
        "--cpus-each",
        type=float,
        metavar="CORES",
        help="cap each gateway, the raw producer and the raw transactional producers at this "
        "many cores (a cgroup each, as if each had a machine of its own; needs root and the "
        "cgroup cpu controller); the broker and the load processes use the rest",
    )
    args = parser.parse_args()
    if args.cpus_each is not None:
        try:
            cpu_cap.CpuCap("probe", args.cpus_each).remove()
        except (ValueError, cpu_cap.CapUnavailable) as exc:
            parser.error(f"--cpus-each: {exc}")
    rows: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp:
        work = Path(tmp)
        cluster = LocalKafka(work / "kafka", nodes_count=1)
        cluster.start()
        try:
            bootstrap = cluster.bootstrap
            broker = cluster.nodes[0].proc
            broker_pid = broker.pid if broker is not None else None
            for run in range(args.runs):
                raw = in_process(
                    "raw",
                    raw_producer,
                    (
                        bootstrap,
                        f"raw{run}",
                        args.seconds,
                        args.chunk_bytes,
                        args.data,
                        args.partitions,
                    ),
                    args.seconds,
                    broker_pid,
                    cpu,
                    args.cpus_each,
                )
                # the case measured right after the raw producer meets a broker still busy
                # with what the producer wrote: with --compare-with, the order alternates
                base_first = args.compare_with is not None and run % 2 == 1
                # the owner-aware case and the forwarding one take turns at going first
                owner_first = run % 2 == 1
                if not base_first:
                    single, double, owner = ingest_cases(
                        work, bootstrap, f"{run}", REPO, args, broker_pid, cpu, True, owner_first
                    )
                if args.compare_with is not None:
                    base_cpu: dict[str, list[float]] = {}
                    base_one, base_two, _ = ingest_cases(
                        work, bootstrap, f"base{run}", args.compare_with, args, broker_pid, base_cpu
                    )
                    for name, values in base_cpu.items():
                        cpu.setdefault(f"base_{name}", []).extend(values)
                    rows.setdefault("base_one", []).append(base_one)
                    rows.setdefault("base_two", []).append(base_two)
                    rows.setdefault("base_ratio_one", []).append(base_one / raw)
                    rows.setdefault("base_ratio_two", []).append(base_two / base_one)
                if base_first:
                    single, double, owner = ingest_cases(
                        work, bootstrap, f"{run}", REPO, args, broker_pid, cpu, True, owner_first
                    )
                # Kafka transactions of the size the gateway's group commit made just now
                made = cpu.get("one_mb_per_commit")
                commit_mb = made[-1] if made else 2.5
                txn = in_process(
                    "txn",
                    raw_transactions,
                    (
                        bootstrap,
                        f"txn{run}",
                        args.seconds,
                        args.chunk_bytes,
                        args.data,
                        args.partitions,
                        commit_mb * 1e6,
                    ),
                    args.seconds,
                    broker_pid,
                    cpu,
                    args.cpus_each,
                )
                cpu.setdefault("txn_commit_mb", []).append(commit_mb)
                if args.ingest_only:
                    e2e, lat, tk = float("nan"), [], [float("nan")]
                else:
                    e2e = end_to_end(work, bootstrap, f"e2e{run}.", args.e2e_lines)
                    lat = latency(work, bootstrap, f"lat{run}.", 5000, args.latency_seconds)
                    tk = takeover(bootstrap, f"tk{run}.", args.takeover_sources, 1)
                for name, value in (
                    ("raw", raw),
                    ("txn", txn),
                    ("ratio_txn", txn / raw),
                    ("one_vs_txn", single / txn),
                    ("one", single),
                    ("two", double),
                    ("owner", owner),
                    ("e2e", e2e),
                    ("p50", gateway_bench.percentile(lat, 50) * 1000 if lat else float("nan")),
                    ("p99", gateway_bench.percentile(lat, 99) * 1000 if lat else float("nan")),
                    ("takeover", tk[0]),
                    ("ratio_one", single / raw),
                    ("ratio_two", double / single),
                    ("ratio_owner", owner / single),
                    ("owner_vs_two", owner / double),
                ):
                    rows.setdefault(name, []).append(value)
                print(
                    f"run {run + 1}: raw {raw:.1f} MB/s, transactions {txn:.1f}, "
                    f"one gateway {single:.1f}, two "
                    f"{double:.1f}, two to the owner {owner:.1f}, e2e {e2e:,.0f} lines/s, "
                    f"p99 {rows['p99'][-1]:.1f} ms, "
                    f"takeover {tk[0]:.3f} s",
                    file=sys.stderr,
                )
        finally:
            cluster.stop()

    def med(name: str) -> float:
        return statistics.median(rows[name])

    kb = args.chunk_bytes // 1024
    capped = (
        f"; each gateway and raw producer capped at {args.cpus_each:g} cores"
        if args.cpus_each
        else ""
    )
    print(f"| case (median of {args.runs}; one broker, same run{capped}) | result | goal |")
    print("|---|---:|---|")
    print(f"| raw producer, acks=all, idempotent, {kb} KiB values | {med('raw'):.1f} MB/s | - |")
    commit_mb = statistics.median(cpu["txn_commit_mb"])
    print(
        f"| raw transactional producers, one per partition, {commit_mb:.1f} MB per commit "
        f"| {med('txn'):.1f} MB/s ({med('ratio_txn'):.0%} of raw) | - |"
    )
    print(
        f"| one gateway on Kafka, exactly once, {kb} KiB chunks | {med('one'):.1f} MB/s "
        f"({med('ratio_one'):.0%} of raw, {med('one_vs_txn'):.0%} of the transactions) "
        "| >= 70% of raw |"
    )
    print(
        f"| two gateways, load split between them | {med('two'):.1f} MB/s "
        f"({med('ratio_two'):.2f}x one) | >= 1.6x |"
    )
    print(
        f"| two gateways, clients sending each source to its owner | {med('owner'):.1f} MB/s "
        f"({med('ratio_owner'):.2f}x one, {med('owner_vs_two'):.2f}x forwarding) | >= 1.6x |"
    )
    if not args.ingest_only:  # the cases --ingest-only does not run
        print(
            f"| file -> push -> gateway -> Kafka -> reader, {LINE_BYTES} B lines | "
            f"{med('e2e'):,.0f} lines/s ({med('e2e') * LINE_BYTES / 1e6:.1f} MB/s) | - |"
        )
        print(
            f"| line -> reader at 5,000 lines/s | p50 {med('p50'):.1f} ms, p99 {med('p99'):.1f} ms "
            f"| p99 <= 50 ms |"
        )
        print(
            f"| takeover, {args.takeover_sources:,} sources in the partition | "
            f"{med('takeover'):.3f} s | < 1 s |"
        )
    if args.compare_with is not None:
        print(
            f"| one gateway of {args.compare_with} | {med('base_one'):.1f} MB/s "
            f"({med('base_ratio_one'):.0%} of raw) | - |"
        )
        print(
            f"| two gateways of {args.compare_with} | {med('base_two'):.1f} MB/s "
            f"({med('base_ratio_two'):.2f}x one) | - |"
        )
    if cpu:
        print()
        print("| CPU seconds per MB acknowledged (median) | gateways | broker | load processes |")
        print("|---|---:|---:|---:|")
        cases = [
            ("raw", "raw producer (its process as the load)"),
            ("txn", "raw transactional producers (their process as the load)"),
            ("one", "one gateway"),
            ("two", "two gateways"),
            ("owner", "two gateways, clients to the owner"),
        ]
        if args.compare_with is not None:
            cases += [
                ("base_one", f"one gateway of {args.compare_with}"),
                ("base_two", f"two gateways of {args.compare_with}"),
            ]
        for case, label in cases:
            if f"{case}_gateways" in cpu:
                print(
                    f"| {label} | {statistics.median(cpu[f'{case}_gateways']):.4f} | "
                    f"{statistics.median(cpu[f'{case}_broker']):.4f} | "
                    f"{statistics.median(cpu[f'{case}_load']):.4f} |"
                )
        grouped = [(case, label) for case, label in cases if f"{case}_mb_per_commit" in cpu]
        if grouped:
            print()
            print(
                "| group commit (median) | writes per Kafka commit | MB per commit "
                "| LSO looks per commit |"
            )
            print("|---|---:|---:|---:|")
            for case, label in grouped:
                print(
                    f"| {label} | {statistics.median(cpu[f'{case}_writes_per_commit']):.1f} | "
                    f"{statistics.median(cpu[f'{case}_mb_per_commit']):.2f} | "
                    f"{statistics.median(cpu[f'{case}_looks_per_commit']):.1f} |"
                )
    for name, values in [*rows.items(), *cpu.items()]:
        print(f"  {name}: {', '.join(f'{v:.3f}' for v in values)}", file=sys.stderr)
    write_json(args, rows)
    return 0


def write_json(args: argparse.Namespace, rows: dict[str, list[float]]) -> None:
    """The table's figures for ``logbroker bench all`` (see benchmarks/benchmark_results.py)."""
    from benchmark_results import Figure, write

    kb = args.chunk_bytes // 1024
    figures = [
        Figure.of_runs(f"raw producer, acks=all, idempotent, {kb} KiB values", rows["raw"], "MB/s"),
        Figure.of_runs(
            f"one gateway on Kafka, exactly once, {kb} KiB chunks", rows["one"], "MB/s"
        ).compared("raw producer", rows["ratio_one"], "percent"),
        Figure.of_runs("two gateways, load split between them", rows["two"], "MB/s").compared(
            "one gateway", rows["ratio_two"]
        ),
        Figure.of_runs(
            "two gateways, clients sending each source to its owner", rows["owner"], "MB/s"
        ).compared("two gateways, load split between them", rows["owner_vs_two"]),
    ]
    if args.ingest_only:  # the other cases did not run
        write(args.json, "kafka", args, figures)
        return
    figures += [
        Figure.of_runs(
            f"file -> push -> gateway -> Kafka -> reader, {LINE_BYTES} B lines",
            rows["e2e"],
            "lines/s",
        ),
        Figure.of_runs("line -> reader at 5,000 lines/s: p50", rows["p50"], "ms"),
        Figure.of_runs("line -> reader at 5,000 lines/s: p99", rows["p99"], "ms"),
        Figure.of_runs(
            f"takeover, {args.takeover_sources:,} sources in the partition", rows["takeover"], "s"
        ),
    ]
    write(args.json, "kafka", args, figures)


if __name__ == "__main__":
    sys.exit(main())
