"""Every benchmark in one run: the list of them, how to run each, and the one table of results.

``logbroker bench all`` (``ops/commands/bench.py``) is a thin layer over :func:`run_suite`.
Each benchmark runs as its own process (``python benchmarks/NAME_bench.py ... --json PATH``)
in a process group of its own, one after the other, so that no two compete for the CPUs; its
table goes to stderr as it runs, and its JSON result (``benchmark_results.py``) is collected.
A benchmark that fails to run (a peer that cannot be installed, a crash) is reported as failed
in the table and the others still run; a slow one is never a failure.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmark_results import Comparison, Figure, read
from machine import Machine, describe_machine

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO = BENCHMARKS_DIR.parent
FORMAT = 1


@dataclass(frozen=True)
class Benchmark:
    name: str
    measures: str
    peers: str
    quick_args: tuple[str, ...]
    # whether the script takes --runs itself; otherwise the suite runs it --runs times
    takes_runs: bool = True
    needs: str = ""

    @property
    def script(self) -> Path:
        return BENCHMARKS_DIR / f"{self.name}_bench.py"


# In the order they run: cheapest first, so a short --only or an early failure costs little.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "store",
        "durable appends and page-cache reads of the embedded log store",
        "dd conv=fdatasync on the same file system",
        ("--seconds", "0.3", "--dd-mib", "128", "--read-mib", "32"),
    ),
    Benchmark(
        "partition_handles",
        "appends and reads over many partitions with a bounded cache of open partitions",
        "the same with every partition kept open",
        ("--partitions", "50", "--rounds", "2"),
    ),
    Benchmark(
        "new_sources",
        "first writes of many new sources into one partition through a gateway",
        "-",
        ("--requests", "4", "--sources", "500"),
    ),
    Benchmark(
        "gateway",
        "gateway ingest (64 KiB and 4 KiB chunks), ack latency, session opens",
        "-",
        ("--seconds", "1.5", "--session-sources", "5000"),
        takes_runs=False,
    ),
    Benchmark(
        "audit",
        "what the end-to-end audit's hook costs the gateway per written chunk",
        "encoding the same chunks' envelopes (every written chunk's work anyway)",
        ("--chunks", "200"),
    ),
    Benchmark(
        "codec_cpu",
        "the gateway's CPU per MB of zstd chunks (each checked, and counted, once)",
        "-",
        ("--mb", "20"),
    ),
    Benchmark(
        "metrics",
        "what the gateway's metrics cost one write request; the gateway's CPU per request",
        "a hand-written dict registry (the design before prometheus_client)",
        ("--requests", "20000", "--gateway-requests", "300"),
    ),
    Benchmark(
        "long_poll",
        "another tenant's requests while one read token long-polls many-position fetches",
        "the same requests before the long-polls",
        ("--fetches", "5", "--positions", "200", "--wait-ms", "3000", "--quiet-s", "2"),
        takes_runs=False,
    ),
    Benchmark(
        "pull",
        "pull reads by 1, 4, 16 readers, binary and JSON framing",
        "the ingest rate of the same gateway",
        ("--mb", "16", "--readers", "1,4"),
    ),
    Benchmark(
        "e2e",
        "file -> logbroker push -> gateway -> log; logbroker read; latency",
        "rsyslog imfile -> omkafka and a raw confluent-kafka producer into tansu, same file",
        ("--lines", "100000", "--latency-seconds", "3"),
        needs="rsyslog and rsyslog-kafka (apt-get, installed when missing), the bench extra",
    ),
    Benchmark(
        "kafka",
        "gateways on Apache Kafka: ingest, two gateways, end to end, latency, takeover",
        "a raw confluent-kafka producer into the same broker",
        (
            *("--seconds", "2", "--e2e-lines", "20000"),
            *("--latency-seconds", "3", "--takeover-sources", "10000"),
        ),
        needs="Java; Apache Kafka's jars (fetched through Maven once)",
    ),
    Benchmark(
        "append_tail",
        "what following busy partitions costs a Kafka gateway: the append tail's CPU per MB",
        "the same process not following them",
        ("--mb", "20"),
        needs="Java; Apache Kafka's jars (fetched through Maven once)",
    ),
    Benchmark(
        "kafka_fetch",
        "a Kafka gateway's /v1/fetch of 132 partitions no write made",
        "a fetch of one partition",
        ("--fetches", "10", "--runs", "1"),
        needs="Java; Apache Kafka's jars (fetched through Maven once)",
    ),
    Benchmark(
        "kafka_expiry",
        "one idle-source expiry pass over a partition on Kafka; a new source's first write",
        "the same pass on the embedded store; the first write without the pin deletion count",
        ("--sources", "5000", "--new-sources", "30"),
        needs="Java; Apache Kafka's jars (fetched through Maven once)",
    ),
    Benchmark(
        "load",
        "logbroker load into Delta and Parquet with Spark, local[2] and a 2-worker cluster",
        "Spark's own Parquet read + write of the same rows",
        ("--mb", "32", "--masters", "local"),
        needs="Java, the spark extra",
    ),
)

BY_NAME = {b.name: b for b in BENCHMARKS}


@dataclass
class Outcome:
    """What one benchmark gave: its figures, or why it failed."""

    name: str
    seconds: float
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None


@dataclass
class SuiteReport:
    started: datetime.datetime
    machine: Machine
    command: str
    runs: int | None
    quick: bool
    outcomes: list[Outcome]
    load_average_after: str

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "date": self.started.isoformat(timespec="seconds"),
            "machine": self.machine.as_dict(),
            "load_average_after": self.load_average_after,
            "command": self.command,
            "runs": self.runs,
            "quick": self.quick,
            "benchmarks": [
                {
                    "name": o.name,
                    "seconds": round(o.seconds, 1),
                    "error": o.error,
                    "figures": [
                        {
                            "name": f.name,
                            "value": f.value,
                            "unit": f.unit,
                            "runs": f.runs,
                            "against": [
                                {"peer": c.peer, "ratio": c.ratio, "style": c.style}
                                for c in f.against
                            ],
                        }
                        for f in o.figures
                    ],
                }
                for o in self.outcomes
            ],
        }


def markdown(report: SuiteReport) -> str:
    """The report as Markdown: a head naming the date and machine, then one table."""
    runs = "the scripts' own number of runs" if report.runs is None else f"{report.runs}"
    lines = [
        f"`{report.command}` on {report.started:%Y-%m-%d %H:%M} UTC"
        + (" (quick: small workloads, not for quoting)" if report.quick else ""),
        "",
        f"Machine: {report.machine.describe()} at the start, "
        f"{report.load_average_after} at the end.",
        "",
        f"Runs per figure: {runs}; each value is the median of its runs, each ratio the median "
        "of the per-run ratios against a peer measured in the same run.",
        "",
        "| benchmark | figure | value | against a peer, same run |",
        "|---|---|---:|---|",
    ]
    for outcome in report.outcomes:
        if outcome.error is not None:
            lines.append(f"| {outcome.name} | did not run: {_cell(outcome.error)} | - | - |")
            continue
        for figure in outcome.figures:
            against = "; ".join(str(c) for c in figure.against) or "-"
            lines.append(
                f"| {outcome.name} | {_cell(figure.name)} | "
                f"{format_value(figure.value)} {figure.unit} | {against} |"
            )
    return "\n".join(lines) + "\n"


def format_value(value: float) -> str:
    """Three significant figures or more, thousands separated: 1,379 / 52.2 / 0.75."""
    if value != value:  # NaN: the benchmark measured nothing
        return "n/a"
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "/").split())


def run_suite(
    names: list[str],
    *,
    quick: bool,
    runs: int | None,
    command: str,
    log: IO[str],
    should_stop: Callable[[], bool] = lambda: False,
) -> SuiteReport:
    """Run the named benchmarks one after the other and collect their figures.

    ``runs`` is passed to each script (``--runs``), or the script is run that many times when
    it has no such option; None keeps each script's default (quick: one run).  Each script's
    output goes to ``log``.
    """
    started = datetime.datetime.now(datetime.UTC)
    machine = describe_machine()
    effective_runs = runs if runs is not None else (1 if quick else None)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="logbroker-bench-all-") as tmp:
        for name in names:
            if should_stop():
                break
            outcomes.append(
                _run_one(BY_NAME[name], Path(tmp), quick, effective_runs, log, should_stop)
            )
    load_after = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return SuiteReport(started, machine, command, effective_runs, quick, outcomes, load_after)


def _run_one(
    bench: Benchmark,
    work: Path,
    quick: bool,
    runs: int | None,
    log: IO[str],
    should_stop: Callable[[], bool],
) -> Outcome:
    args = list(bench.quick_args) if quick else []
    invocations = 1
    if runs is not None:
        if bench.takes_runs:
            args += ["--runs", str(runs)]
        else:
            invocations = runs
    started = time.monotonic()
    results: list[list[Figure]] = []
    for invocation in range(invocations):
        json_path = work / f"{bench.name}-{invocation}.json"
        command = [sys.executable, str(bench.script), *args, "--json", str(json_path)]
        print(f"== {bench.name}: {' '.join(command[1:])}", file=log, flush=True)
        code = _run_script(command, log, should_stop)
        if code != 0:
            error = code if isinstance(code, str) else f"exit status {code}; its output is above"
            return Outcome(bench.name, time.monotonic() - started, error=error)
        try:
            results.append(read(json_path).figures)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return Outcome(bench.name, time.monotonic() - started, error=f"no result: {exc}")
    return Outcome(bench.name, time.monotonic() - started, figures=merge_invocations(results))


def merge_invocations(results: list[list[Figure]]) -> list[Figure]:
    """Figures of several one-run invocations of a script as one: the runs of equally named
    figures joined, medians taken again."""
    if len(results) == 1:
        return results[0]
    merged: dict[str, list[Figure]] = {}
    for figures in results:
        for figure in figures:
            merged.setdefault(figure.name, []).append(figure)
    out = []
    for name, same in merged.items():
        runs = [r for f in same for r in f.runs]
        comparisons: dict[str, list[Comparison]] = {}
        for f in same:
            for c in f.against:
                comparisons.setdefault(c.peer, []).append(c)
        against = [
            Comparison(peer, statistics.median(c.ratio for c in cs), cs[0].style)
            for peer, cs in comparisons.items()
        ]
        out.append(Figure(name, statistics.median(runs), same[0].unit, runs, against))
    return out


def _run_script(command: list[str], log: IO[str], should_stop: Callable[[], bool]) -> int | str:
    """Run one benchmark script in its own process group: its exit status, or "stopped" when
    ``should_stop`` turned true first (the group is interrupted, so the script's cleanup runs,
    then whatever is left of it is killed)."""
    proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log, start_new_session=True)
    try:
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if should_stop():
                    _signal_group(proc.pid, signal.SIGINT)
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                    return "stopped"
    finally:
        # what the script started and left behind (a gateway, a broker) goes with it
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)
