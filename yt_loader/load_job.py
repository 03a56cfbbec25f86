"""The loader job: every new offset of every matching topic into a table, exactly once.

One run: open the target (a Delta table, :mod:`yt_loader.delta_table`, or the Parquet
warehouse, :mod:`yt_loader.warehouse`; both in :mod:`yt_loader.load_target`) and read the
loaded offsets from it, ask the log for its topics and their current ends, then load
``loaded .. end`` of each partition in batches.  New topics are picked up by the glob with no
configuration.  Each batch runs one Spark task per offset range (ranges of about
``max_range_bytes``, spread over the executors as a fixed pool, as the LinkedIn Hadoop load
job balanced Kafka partitions over its tasks); the driver then commits the files of the
attempts Spark accepted, with the offsets, in one commit of the target.

A partition whose log start moved past the loaded offset lost data to retention before it
was loaded: the run records the gap in the commit log, reports it, and exits non-zero.  So
does a topic the table has offsets of that is gone from the log (deleted, or deleted and
created again): what it held past the loaded offsets was never loaded.  A topic that goes
while a batch's tasks read it is reported the same way by that run (see :func:`_run_batch`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import SparkSession

from delivery.installations import MixedInstallations, NotAGateway
from log_store.errors import LogbrokerError, OffsetOutOfRange, TopicDeleted, UnknownTopic
from session_dedup.chunk_codecs import CorruptChunk
from yt_loader.crash_points import reach
from yt_loader.errors import DataLost, WarehouseCorrupt
from yt_loader.load_target import LoadState, LoadTarget, ParquetTarget, Progress, TableFormat
from yt_loader.log_source import LogSource, SourceSpec, TopicBounds, current_bounds
from yt_loader.offset_ranges import (
    DEFAULT_MAX_RANGE_BYTES,
    OffsetRange,
    matching_topics,
    split_range,
)
from yt_loader.range_writer import OutputLayout, WrittenRange, write_range
from yt_loader.typed_columns import TopicSchemas, schemas_for
from yt_loader.warehouse import LoadGap, Recovery, TopicOffsets

DEFAULT_MAX_BATCH_BYTES = 512 * 1024 * 1024


class LoadFailed(LogbrokerError):
    """A batch's tasks failed; nothing of that batch was committed."""


@dataclass(frozen=True)
class LoadConfig:
    spec: SourceSpec
    warehouse: Path
    topics: str = "*"
    max_range_bytes: int = DEFAULT_MAX_RANGE_BYTES
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    crash_at: str | None = None
    progress_interval_s: float = 10.0
    table_format: TableFormat = "delta"
    skip_corrupt: bool = False
    """Leave out a message that does not decompress, recording it as lost (a :class:`LoadGap`
    of one offset), rather than stop the load there."""

    def __post_init__(self) -> None:
        # The tasks resolve paths in their executor's working directory (on a cluster, the
        # worker's work directory): a relative path must mean what it means here.
        object.__setattr__(self, "warehouse", Path(self.warehouse).absolute())


@dataclass
class TopicProgress:
    """One topic's share of a run: offsets to load, offsets loaded, what they held."""

    topic: str
    total_offsets: int = 0
    done_offsets: int = 0
    lines: int = 0
    data_bytes: int = 0
    clamped_times: int = 0
    """Messages loaded with a create or write time clamped into 1970 .. 9999-12-31."""

    def offsets_done(self, extra: int = 0) -> str:
        done = self.done_offsets + extra
        percent = 100.0 * done / self.total_offsets if self.total_offsets else 100.0
        return f"{self.topic}: {done}/{self.total_offsets} offsets ({percent:.0f}%)"

    def describe(self) -> str:
        return f"{self.offsets_done()}, {self.lines} lines, {self.data_bytes / 1e6:.1f} MB"


@dataclass
class LoadReport:
    recovery: Recovery
    batches: list[int] = field(default_factory=list)
    ranges: int = 0
    lines: int = 0
    data_bytes: int = 0
    gaps: list[LoadGap] = field(default_factory=list)
    topics: dict[str, TopicProgress] = field(default_factory=dict)
    clamped_times: int = 0
    """Messages whose create or write time was outside 1970-01-01 .. 9999-12-31 UTC (stored
    before the gateway refused such times, or by another producer on Kafka), loaded with it
    clamped into that range rather than failing the load."""
    elapsed_s: float = 0.0
    stopped: bool = False
    held_back: dict[str, str] = field(default_factory=dict)
    """Topics not loaded, with why: their log type's schema cannot become a column of the
    table (see :func:`yt_loader.typed_columns.usable_columns`).  Their offsets stay where they
    were; every other topic is loaded."""


@dataclass
class _Plan:
    offsets: dict[str, TopicOffsets]
    pieces: list[OffsetRange]
    bytes_per_offset: dict[tuple[str, int], float]
    gaps: list[LoadGap]
    topics: dict[str, TopicProgress]
    typed: dict[str, TopicSchemas] = field(default_factory=dict)
    """The structured topics: their lines get typed columns (see ``typed_columns``)."""


def _bounds(
    source: LogSource, state: LoadState, topics: str
) -> tuple[list[TopicBounds], list[str]]:
    """The bounds of every topic matching ``topics`` now, and the topics the table has
    offsets of that the log no longer has (asked for by name: a listing may lag)."""
    bounds = current_bounds(source, topics)
    listed = {t.name for t in bounds}
    gone = []
    known = [t for t, o in state.offsets.items() if not o.deleted and t not in listed]
    for name in matching_topics(known, topics):
        try:
            bounds.append(source.topic_bounds(name))
        except UnknownTopic:
            gone.append(name)
    return bounds, gone


def _deleted_gaps(topic: str, before: TopicOffsets, how: str = "deleted") -> list[LoadGap]:
    """The offsets a topic took with it, from those loaded of it on; ``how`` it went ("deleted",
    "deleted and created again while batch 2 read it")."""
    if not before.partitions:
        return [LoadGap(topic, 0, 0, 0, f"the topic was {how} before anything of it was loaded")]
    return [
        LoadGap(
            topic,
            partition,
            offset,
            offset,
            f"the topic was {how}; loaded up to offset {offset}, whatever it held from "
            f"offset {offset} on was never loaded",
        )
        for partition, offset in sorted(before.partitions.items())
    ]


def _plan(
    bounds: list[TopicBounds], state: LoadState, config: LoadConfig, gone: Sequence[str] = ()
) -> _Plan:
    offsets = dict(state.offsets)
    plan = _Plan(offsets, [], {}, [], {})
    for name in gone:
        old = offsets[name]
        plan.gaps.extend(_deleted_gaps(name, old))
        offsets[name] = TopicOffsets(old.topic_id, dict(old.partitions), deleted=True)
    for topic in bounds:
        before = offsets.get(topic.name)
        loaded: dict[int, int] = {}
        if before is not None and before.topic_id == topic.topic_id:
            loaded = dict(before.partitions)  # also of one marked deleted: it is back
        elif before is not None and before.deleted:
            pass  # reported when it was found deleted: the new topic is loaded from its start
        elif before is not None:
            for partition, offset in sorted(before.partitions.items()):
                plan.gaps.append(
                    LoadGap(
                        topic.name,
                        partition,
                        offset,
                        offset,
                        "the topic was deleted and created again; whatever the old topic "
                        f"held from offset {offset} on was not loaded",
                    )
                )
        progress = TopicProgress(topic.name)
        for p in topic.partitions:
            done = loaded.get(p.partition, 0)
            if done > p.end_offset:
                raise WarehouseCorrupt(
                    f"the warehouse has {topic.name} partition {p.partition} loaded up to "
                    f"offset {done}, but the log ends at {p.end_offset}: is this the same log?"
                )
            if done < p.start_offset:
                plan.gaps.append(
                    LoadGap(
                        topic.name,
                        p.partition,
                        done,
                        p.start_offset,
                        "retention dropped them before they were loaded",
                    )
                )
                done = p.start_offset
            loaded[p.partition] = done
            progress.total_offsets += p.end_offset - done
            plan.bytes_per_offset[(topic.name, p.partition)] = p.bytes_per_offset
            plan.pieces.extend(
                split_range(
                    topic.name,
                    p.partition,
                    done,
                    p.end_offset,
                    p.bytes_per_offset,
                    # a range is the least a batch holds: one larger than the batch's bound
                    # would make every batch it is in that large
                    min(config.max_range_bytes, config.max_batch_bytes),
                )
            )
        offsets[topic.name] = TopicOffsets(topic.topic_id, loaded)
        plan.topics[topic.name] = progress
    return plan


def _hold_back(plan: _Plan, state: LoadState, refused: dict[str, str]) -> None:
    """Leave ``refused`` topics out of ``plan``, as if the load had not looked at them."""
    plan.pieces = [r for r in plan.pieces if r.topic not in refused]
    plan.gaps = [g for g in plan.gaps if g.topic not in refused]
    for topic in refused:
        plan.typed.pop(topic, None)
        plan.topics.pop(topic, None)
        before = state.offsets.get(topic)
        if before is None:
            plan.offsets.pop(topic, None)
        else:
            plan.offsets[topic] = before


def _batches(plan: _Plan, max_batch_bytes: int) -> list[list[OffsetRange]]:
    """Pieces in batches of at most ``max_batch_bytes`` each as the log stores them (the
    partition's bytes per offset, compressed as written; a piece of one message larger than
    that is a batch of its own), each spread over many partitions.

    Pieces are taken round-robin over partitions (a partition's pieces stay in offset order),
    so every batch keeps the executors busy instead of one partition's pieces filling it.
    """
    nth: dict[tuple[str, int], int] = {}
    keyed = []
    for rng in plan.pieces:
        key = (rng.topic, rng.partition)
        nth[key] = nth.get(key, 0) + 1
        keyed.append((nth[key], rng))
    keyed.sort()
    batches: list[list[OffsetRange]] = []
    size = 0.0
    for _, rng in keyed:
        estimate = rng.count * plan.bytes_per_offset.get((rng.topic, rng.partition), 0.0)
        if not batches or size + estimate > max_batch_bytes:
            batches.append([])
            size = 0.0
        batches[-1].append(rng)
        size += estimate
    return batches


_TASK_ERROR = re.compile(r"(?:yt_loader|log_store|delivery|session_dedup)\.[\w.]*?(\w+): ([^\n]+)")


def _corrupt_gaps(written: list[WrittenRange]) -> list[LoadGap]:
    """The messages the tasks left out because they do not decompress or are no envelope
    at all (``skip_corrupt``), one gap each, in offset order."""
    gaps = []
    for w in sorted(written, key=lambda w: (w.rng.topic, w.rng.partition, w.rng.start)):
        for offset, why in w.corrupt:
            reason = f"the message {why}; left out by --skip-corrupt"
            gaps.append(LoadGap(w.rng.topic, w.rng.partition, offset, offset + 1, reason))
    return gaps


def _clamped_warnings(batch: int, written: list[WrittenRange]) -> list[str]:
    """One line per range that loaded messages with a time clamped, naming the first few."""
    said = []
    for w in sorted(written, key=lambda w: (w.rng.topic, w.rng.partition, w.rng.start)):
        if not w.clamped:
            continue
        examples = ", ".join(
            f"offset {offset} {name} {value}" for offset, name, value in w.clamped_examples
        )
        said.append(
            f"batch {batch}: {w.rng.topic} partition {w.rng.partition}: {w.clamped} messages "
            "with a create_time or write_time outside 1970-01-01 .. 9999-12-31 UTC were loaded "
            f"with it clamped into that range ({examples})"
        )
    return said


def _task_failure(batch: int, exc: Exception) -> LogbrokerError:
    """The logbroker error a Spark task failed with, as that error again: the last one named
    in the failure's text (a Python traceback names an error's cause before the error)."""
    found = _TASK_ERROR.findall(str(exc))
    if not found:
        return LoadFailed(f"batch {batch} failed in Spark: {str(exc).strip()[:2000]}")
    name, message = found[-1]
    return _batch_failure(batch, name, message)


def _batch_failure(batch: int, name: str, message: str) -> LogbrokerError:
    """The error that ends batch ``batch``, from the ``name`` and ``message`` of its task's."""
    if name == "DataLost":
        return DataLost(f"{message} (batch {batch} was not committed; run the load again)")
    if name == "MixedInstallations":
        return MixedInstallations(message)  # as the driver says it: the command line's mistake
    if name == "NotAGateway":
        return NotAGateway(message)
    return LoadFailed(f"batch {batch} failed: {name}: {message}")


_HANDLED_IN_THE_DRIVER = (
    TopicDeleted,
    UnknownTopic,
    OffsetOutOfRange,
    DataLost,
    WarehouseCorrupt,
    CorruptChunk,
    MixedInstallations,
    NotAGateway,
)
"""What a task meets that no attempt of it again would mend, and that the driver handles
(a topic deleted, offsets dropped by retention, a message that does not decompress, a
gateway of another installation than the one the driver planned in, a URL of ``server``
where no gateway answers)."""


@dataclass(frozen=True)
class RangeNotLoaded:
    """A task's range that met one of :data:`_HANDLED_IN_THE_DRIVER`: returned, not raised,
    so that Spark neither tries it again nor logs a task failure with two stack traces for a
    condition the run reports in a line (``DATA LOST: ...``).  The driver raises it again
    (:func:`_batch_failure`) once the batch's tasks are done; anything else a task raises
    fails it in Spark as ever."""

    rng: OffsetRange
    error: str
    """The error's class name."""
    message: str


class _OffsetsDone(AccumulatorParam[dict[str, int]]):
    """Offsets finished per topic, summed over tasks as they complete."""

    def zero(self, value: dict[str, int]) -> dict[str, int]:
        return {}

    def addInPlace(self, value1: dict[str, int], value2: dict[str, int]) -> dict[str, int]:
        for topic, count in value2.items():
            value1[topic] = value1.get(topic, 0) + count
        return value1


def _load_task(
    done: Accumulator[dict[str, int]],
    spec: SourceSpec,
    layout: OutputLayout,
    crash_at: str | None,
    topic_ids: dict[str, str],
    typed: dict[str, TopicSchemas],
    skip_corrupt: bool,
    rng: OffsetRange,
) -> WrittenRange | RangeNotLoaded:
    try:
        written = write_range(
            spec, layout, crash_at, topic_ids, rng, typed.get(rng.topic), skip_corrupt=skip_corrupt
        )
    except _HANDLED_IN_THE_DRIVER as exc:
        return RangeNotLoaded(rng, type(exc).__name__, str(exc))
    done.add({rng.topic: rng.count})
    return written


def _report_while_running(
    stop: threading.Event,
    done: Accumulator[dict[str, int]],
    topics: dict[str, TopicProgress],
    batch: int,
    progress: Progress,
    interval_s: float,
) -> None:
    while not stop.wait(interval_s):
        finished = dict(done.value)
        for topic in sorted(finished):
            progress(f"batch {batch} running: {topics[topic].offsets_done(finished[topic])}")


def _run_tasks(
    spark: SparkSession,
    config: LoadConfig,
    batch: int,
    layout: OutputLayout,
    pieces: list[OffsetRange],
    plan: _Plan,
    progress: Progress,
) -> list[WrittenRange]:
    sc = spark.sparkContext
    sc.setJobDescription(f"logbroker load: batch {batch}, {len(pieces)} offset ranges")
    done = sc.accumulator({}, _OffsetsDone())
    topic_ids = {t: o.topic_id for t, o in plan.offsets.items()}
    task = functools.partial(
        _load_task,
        done,
        config.spec,
        layout,
        config.crash_at,
        topic_ids,
        plan.typed,
        config.skip_corrupt,
    )
    stop = threading.Event()
    reporter = threading.Thread(
        target=_report_while_running,
        args=(stop, done, plan.topics, batch, progress, config.progress_interval_s),
        daemon=True,
    )
    reporter.start()
    try:
        # Spark returns one result per task, from the attempt it accepted; the files of any
        # other attempt (failed, killed, overtaken by a speculative copy) are never named.
        results = sc.parallelize(pieces, len(pieces)).map(task).collect()
    except Exception as exc:  # Spark wraps task errors in Py4J/PySpark exceptions
        raise _task_failure(batch, exc) from exc
    finally:
        stop.set()
        reporter.join()
    written = []
    for result in results:
        if isinstance(result, RangeNotLoaded):
            raise _batch_failure(batch, result.error, result.message)
        written.append(result)
    return written


def _gone_topics(spec: SourceSpec, plan: _Plan, pieces: Sequence[OffsetRange]) -> dict[str, bool]:
    """The topics of ``pieces`` that are no longer the ones planned, each with whether it was
    created again; {} if every one still is (or the log cannot say now)."""
    gone: dict[str, bool] = {}
    try:
        source = spec.open()
        try:
            for name in sorted({r.topic for r in pieces}):
                try:
                    now = source.topic_bounds(name).topic_id
                except UnknownTopic:
                    gone[name] = False
                    continue
                if now != plan.offsets[name].topic_id:
                    gone[name] = True
        finally:
            source.close()
    except LogbrokerError:
        return {}  # the batch's own failure is what the run reports
    return gone


def _run_batch(
    spark: SparkSession,
    config: LoadConfig,
    batch: int,
    layout: OutputLayout,
    pieces: list[OffsetRange],
    plan: _Plan,
    offsets: dict[str, TopicOffsets],
    progress: Progress,
) -> tuple[list[WrittenRange], list[LoadGap]]:
    """Run the batch's tasks; what they wrote, and the topics found deleted meanwhile.

    A topic deleted (and maybe created again) after the plan fails the tasks that read it
    (the store says so, or a task finds another topic under the name once it has read its
    range).  Such a topic is lost from its loaded offsets on: it is named, marked deleted in
    ``offsets`` (a topic of that name found later is a new topic, loaded from its start), and
    the batch runs again without it; the files of the failed attempts are never committed.
    """
    lost: list[LoadGap] = []
    while pieces:
        try:
            return _run_tasks(spark, config, batch, layout, pieces, plan, progress), lost
        except (LoadFailed, DataLost):
            gone = _gone_topics(config.spec, plan, pieces)
            if not gone:
                raise
        for topic, created_again in sorted(gone.items()):
            old = offsets[topic]
            again = " and created again" if created_again else ""
            for gap in _deleted_gaps(topic, old, f"deleted{again} while batch {batch} read it"):
                progress(f"DATA LOST: {gap.message()}")
                lost.append(gap)
            offsets[topic] = TopicOffsets(old.topic_id, dict(old.partitions), deleted=True)
        pieces = [r for r in pieces if r.topic not in gone]
    return [], lost


def _batch_size(written: Sequence[WrittenRange], plan: _Plan) -> str:
    """A committed batch's own size: its lines' bytes, and the log's bytes as stored that
    ``--max-batch-mb`` bounds (estimated as the plan did; unknown where the log reports no
    sizes, as Kafka does)."""
    lines = sum(w.lines for w in written)
    data_bytes = sum(w.data_bytes for w in written)
    per_offset = [plan.bytes_per_offset.get((w.rng.topic, w.rng.partition), 0.0) for w in written]
    stored = sum(w.rng.count * b for w, b in zip(written, per_offset, strict=True))
    ranges = "range" if len(written) == 1 else "ranges"
    if any(w.rng.count and not b for w, b in zip(written, per_offset, strict=True)):
        as_stored = "size as stored unknown"
    else:
        as_stored = f"about {stored / 1e6:.2f} MB as stored"
    return f"{len(written)} {ranges}, {lines} lines, {data_bytes / 1e6:.2f} MB ({as_stored})"


def _copy(offsets: dict[str, TopicOffsets]) -> dict[str, TopicOffsets]:
    return {t: TopicOffsets(o.topic_id, dict(o.partitions), o.deleted) for t, o in offsets.items()}


def open_target(spark: SparkSession, config: LoadConfig) -> LoadTarget:
    """The table ``config`` names, in its format."""
    if config.table_format == "parquet":
        return ParquetTarget(config.warehouse)
    from yt_loader.delta_table import DeltaTarget

    return DeltaTarget(spark, config.warehouse)


def run_load(
    spark: SparkSession,
    config: LoadConfig,
    progress: Progress,
    stop: threading.Event | None = None,
) -> LoadReport:
    """Load everything new into the table; see the module docstring.

    ``stop`` set (e.g. by SIGTERM) ends the run after the batch in hand is committed.
    """
    started = time.monotonic()
    target = open_target(spark, config)
    run = uuid.uuid4().hex[:8]
    with target.opened(progress) as state:
        report = LoadReport(target.recovery)
        spec = config.spec.pinned()  # several gateways: each asked its installation at once
        source = spec.open()
        try:
            bounds, gone = _bounds(source, state, config.topics)
            # the tasks check every gateway they ask against the installation planned in
            config = dataclasses.replace(config, spec=spec.pinned(learnt_by=source))
        finally:
            source.close()
        plan = _plan(bounds, state, config, gone)
        plan.typed = schemas_for(config.spec, sorted(plan.topics))
        # A schema that cannot be a column holds back its own topics only, before any writing.
        report.held_back = target.evolve_schema(plan.typed)
        _hold_back(plan, state, report.held_back)
        for topic, why in sorted(report.held_back.items()):
            progress(f"NOT LOADED: {topic}: {why}")
        report.topics = plan.topics
        report.gaps = list(plan.gaps)
        for gap in plan.gaps:
            progress(f"DATA LOST: {gap.message()}")
        offsets = _copy(plan.offsets)
        work = _batches(plan, config.max_batch_bytes)
        if not work and plan.gaps:
            work = [[]]  # commit the gaps alone, so that they are recorded and reported once
        batch = state.batch
        deleted: set[str] = set()  # topics found deleted by an earlier batch of this run
        for planned in work:
            pieces = [r for r in planned if r.topic not in deleted]
            if planned and not pieces:
                continue
            if stop is not None and stop.is_set():
                report.stopped = True
                progress(f"stopped after {len(report.batches)} batches; the next run goes on")
                break
            batch += 1
            layout = target.layout(batch, run)
            written, lost = _run_batch(
                spark, config, batch, layout, pieces, plan, offsets, progress
            )
            deleted.update(gap.topic for gap in lost)
            report.gaps.extend(lost)
            reach("after-files", config.crash_at)
            corrupt = _corrupt_gaps(written)
            for gap in corrupt:
                progress(f"DATA LOST: {gap.message()}")
            report.gaps.extend(corrupt)
            gaps = (plan.gaps if not report.batches else []) + lost + corrupt
            for w in written:
                topic_offsets = offsets[w.rng.topic].partitions
                topic_offsets[w.rng.partition] = max(
                    topic_offsets.get(w.rng.partition, 0), w.rng.end
                )
            target.commit(
                batch,
                written,
                _copy(offsets),
                gaps,
                config.crash_at,
            )
            report.batches.append(batch)
            progress(f"batch {batch}: {_batch_size(written, plan)}")
            for said in _clamped_warnings(batch, written):
                progress(said)
            for w in written:
                report.ranges += 1
                report.lines += w.lines
                report.data_bytes += w.data_bytes
                report.clamped_times += w.clamped
                topic_progress = report.topics[w.rng.topic]
                topic_progress.done_offsets += w.rng.end - w.rng.start
                topic_progress.lines += w.lines
                topic_progress.data_bytes += w.data_bytes
                topic_progress.clamped_times += w.clamped
            for topic in sorted({w.rng.topic for w in written}):
                progress(f"batch {batch}: {report.topics[topic].describe()} so far")
        report.elapsed_s = time.monotonic() - started
        return report
