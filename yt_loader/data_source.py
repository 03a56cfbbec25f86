"""The ``logbroker`` Spark data source: batch and streaming reads of the log, one row per line.

::

    register(spark)
    df = (spark.read.format("logbroker")
          .option("data_dir", "/var/lib/logbroker")     # or .option("server", "http://gw:8080")
                                                        # or .option("kafka_bootstrap", "k1:9092")
          .option("topics", "dc1.*")
          .load())

The driver fixes the offset ranges (one Spark partition per partition range, large ranges
split); executors read them in parallel.  Options:

``data_dir``, ``server`` or ``kafka_bootstrap``
    the embedded store's directory (same machine or a shared filesystem), a gateway's URL
    (either backend), or the Kafka servers of a Kafka-backed log, which every task then
    reads directly with read_committed consumers (``kafka_namespace``: the gateways'
    namespace; ``kafka.<property>``: librdkafka properties such as TLS or SASL settings);
    ``token`` is sent as a bearer token to the gateway.  ``server`` may name several
    gateways of one installation, ``URL,URL``: the driver asks every one its installation
    before it plans (:class:`~delivery.installations.MixedInstallations` if two name
    different ones), and each task refuses a gateway of another installation than the one
    the driver planned in, as ``logbroker load`` does.
``topics``
    comma-separated globs, default ``*``.
``max_range_bytes``
    about how much log data one Spark partition reads (default 64 MiB).
``starting_offsets``
    streaming only: ``earliest`` (default) or ``latest``, for topics the checkpoint does not
    know yet at the first batch.  Topics that appear later are read from their start.
``fail_on_data_loss``
    ``true`` (default): a range that retention dropped before it was read, or a topic
    deleted and created again, fails the query (the data would otherwise be silently
    missing); ``false`` skips what is gone and reads a new topic from its start.
``skip_corrupt``
    ``false`` (default): a message whose data does not decompress, or a record that is not an
    envelope at all, fails the query, naming its offset; ``true`` leaves it out, with a
    warning naming it in the executor's log.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from yt_loader.errors import BadSourceOptions, DataLost
from yt_loader.line_rows import SPARK_SCHEMA_DDL
from yt_loader.log_source import (
    KAFKA_OPTION_PREFIX,
    SourceSpec,
    TopicBounds,
    check_same_topic,
    current_bounds,
)
from yt_loader.offset_ranges import (
    DEFAULT_MAX_RANGE_BYTES,
    OffsetRange,
    split_range,
    topic_patterns,
)
from yt_loader.range_reader import RangeReadStats, read_range

log = logging.getLogger(__name__)

FORMAT_NAME = "logbroker"

StreamOffsets = dict[str, dict[str, Any]]
"""A stream position: topic -> partition (as a string, JSON keys are strings) -> next offset,
and under ``topic_id`` the identity of the topic those offsets are of (absent in positions
written before it was recorded)."""

TOPIC_ID_KEY = "topic_id"


def _partition_offsets(parts: Mapping[str, Any]) -> dict[str, int]:
    """The partitions of one topic's position, without its identity."""
    return {p: int(offset) for p, offset in parts.items() if p != TOPIC_ID_KEY}


def _recreated(start: Mapping[str, Any], end: Mapping[str, Any]) -> bool:
    """True if ``start`` and ``end`` are positions in two topics of the same name (the topic
    was deleted and created again between them)."""
    before, now = start.get(TOPIC_ID_KEY), end.get(TOPIC_ID_KEY)
    return before is not None and now is not None and before != now


OPTIONS = (
    "data_dir",
    "server",
    "token",
    "gateway_retry_s",
    "kafka_bootstrap",
    "kafka_namespace",
    "topics",
    "max_range_bytes",
    "starting_offsets",
    "fail_on_data_loss",
    "skip_corrupt",
)
"""Every option the source takes, besides ``kafka.<property>``."""


def _check_names(options: Mapping[str, str]) -> None:
    """Refuse an option the source does not know: a misspelt one (``startingOffsets``, as
    Spark's Kafka source spells it) would otherwise be ignored and its default used."""
    for name in options:
        if name.lower() not in OPTIONS and not name.lower().startswith(KAFKA_OPTION_PREFIX):
            raise BadSourceOptions(
                f"the logbroker source has no option {name!r}; its options: "
                f"{', '.join(OPTIONS)}, kafka.<librdkafka property>"
            )


@dataclass(frozen=True)
class ReaderOptions:
    spec: SourceSpec
    topics: str = "*"
    max_range_bytes: int = DEFAULT_MAX_RANGE_BYTES
    starting_offsets: str = "earliest"
    fail_on_data_loss: bool = True
    skip_corrupt: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReaderOptions:
        _check_names(options)
        topics = options.get("topics", "*")
        topic_patterns(topics)
        starting = options.get("starting_offsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise BadSourceOptions("starting_offsets must be 'earliest' or 'latest'")
        return cls(
            spec=SourceSpec.from_options(options),
            topics=topics,
            max_range_bytes=_positive_int(options, "max_range_bytes", DEFAULT_MAX_RANGE_BYTES),
            starting_offsets=starting,
            fail_on_data_loss=_bool(options, "fail_on_data_loss", True),
            skip_corrupt=_bool(options, "skip_corrupt", False),
        )


def _positive_int(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadSourceOptions(f"{name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise BadSourceOptions(f"{name} must be positive, got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise BadSourceOptions(f"{name} must be true or false, got {raw!r}")


class RangePartition(InputPartition):
    """One Spark partition: one offset range (picklable, shipped to an executor), the
    identity (``topic_id``) of the topic the range was planned in, and the (URL,
    installation id) of the gateways it was planned through (``installation``), which the
    task's gateways are checked against before anything is read from them.  (PySpark ships a
    reader's ``read`` to the executors before it plans: what planning learns goes in here.)

    ``None`` reads nothing: a batch read with nothing to read still needs one partition.
    """

    def __init__(
        self,
        rng: OffsetRange | None,
        topic_id: str | None = None,
        installation: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(rng)
        self.rng = rng
        self.topic_id = topic_id
        self.installation = installation


def _read_partition(options: ReaderOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition) or partition.rng is None:
        return
    rng = partition.rng
    spec = options.spec
    if partition.installation is not None and spec.installation is None:
        spec = dataclasses.replace(spec, installation=partition.installation)
    source = spec.open()
    stats = RangeReadStats()
    try:
        yield from read_range(
            source,
            rng,
            stats=stats,
            fail_on_data_loss=options.fail_on_data_loss,
            skip_corrupt=options.skip_corrupt,
        )
        if partition.topic_id is not None:
            # Reads go by name: a topic deleted and created again since the plan would have
            # given the new topic's records at the old one's offsets.  The task fails, so
            # Spark takes none of its rows; a restarted stream sees the new topic.
            check_same_topic(source, rng.topic, partition.topic_id)
    finally:
        source.close()
        for offset, why in stats.corrupt:
            log.warning(
                "skipping a corrupt message: %s/%d offset %d: the message %s",
                rng.topic,
                rng.partition,
                offset,
                why,
            )


class LogbrokerBatchReader(DataSourceReader):
    """Reads every matching partition from its log start to its end at planning time."""

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        spec = self.options.spec.pinned()  # several gateways: each asked its installation
        source = spec.open()
        try:
            bounds = current_bounds(source, self.options.topics)
            installation = spec.pinned(learnt_by=source).installation
        finally:
            source.close()
        ranges: list[InputPartition] = [
            RangePartition(rng, topic.topic_id, installation)
            for topic in bounds
            for p in topic.partitions
            for rng in split_range(
                topic.name,
                p.partition,
                p.start_offset,
                p.end_offset,
                p.bytes_per_offset,
                self.options.max_range_bytes,
            )
        ]
        return ranges or [RangePartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)


class LogbrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of new offsets; Spark's checkpoint holds the position, so a restarted
    query replays exactly the batch it had planned and continues after it."""

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self._target: StreamOffsets | None = None
        self._spec: SourceSpec | None = None
        """The options' spec with the installation its gateways were found to belong to at
        the query's start (every plan and every task is checked against it)."""

    def _bounds(self) -> list[TopicBounds]:
        if self._spec is None:  # several gateways: each asked its installation at the start
            self._spec = self.options.spec.pinned()
        source = self._spec.open()
        try:
            bounds = current_bounds(source, self.options.topics)
            self._spec = self._spec.pinned(learnt_by=source)
            return bounds
        finally:
            source.close()

    def _ends(self) -> StreamOffsets:
        return {
            t.name: {TOPIC_ID_KEY: t.topic_id}
            | {str(p.partition): p.end_offset for p in t.partitions}
            for t in self._bounds()
        }

    def initialOffset(self) -> dict[str, Any]:
        latest = self.options.starting_offsets == "latest"
        return {
            t.name: {TOPIC_ID_KEY: t.topic_id}
            | {str(p.partition): p.end_offset if latest else p.start_offset for p in t.partitions}
            for t in self._bounds()
        }

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        ends = self._target if self._target is not None else self._ends()
        merged: StreamOffsets = {t: dict(parts) for t, parts in start.items()}
        for topic, parts in ends.items():
            known = merged.setdefault(topic, {})
            if _recreated(known, parts):
                # A new topic of the same name: its offsets start again; ``partitions``
                # reads it from its start (or fails, as for retention, on the old one's loss).
                merged[topic] = dict(parts)
                continue
            known[TOPIC_ID_KEY] = parts[TOPIC_ID_KEY]
            for partition, end in _partition_offsets(parts).items():
                # Never behind the start: a lagging gateway must not rewind.
                known[partition] = max(end, int(known.get(partition, 0)))
        return merged

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        wanted = {}
        for topic, parts in end.items():
            before = start.get(topic, {})
            if _recreated(before, parts):
                lost = ", ".join(
                    f"{p} from offset {o}" for p, o in _partition_offsets(before).items()
                )
                message = (
                    f"{topic} was deleted and created again: whatever the old topic held "
                    f"past the offsets read (partition {lost}) was never read"
                )
                if self.options.fail_on_data_loss:
                    raise DataLost(f"{message} (set fail_on_data_loss=false to go on)")
                log.warning("%s; reading the new topic from its start", message)
                before = {}
            for p, e in _partition_offsets(parts).items():
                wanted[(topic, int(p))] = (int(before.get(p, 0)), e)
        if not any(e > s for s, e in wanted.values()):
            return []
        per_offset = {
            (t.name, p.partition): p.bytes_per_offset for t in self._bounds() for p in t.partitions
        }
        installation = None if self._spec is None else self._spec.installation
        return [
            RangePartition(rng, end[topic].get(TOPIC_ID_KEY), installation)
            for (topic, p), (s, e) in sorted(wanted.items())
            for rng in split_range(
                topic, p, s, e, per_offset.get((topic, p), 0.0), self.options.max_range_bytes
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.options, partition)


class LogbrokerDataSource(DataSource):
    """``spark.read.format("logbroker")`` and ``spark.readStream.format("logbroker")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogbrokerBatchReader(ReaderOptions.from_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogbrokerStreamReader(ReaderOptions.from_options(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("logbroker")`` known to ``spark``."""
    spark.dataSource.register(LogbrokerDataSource)
