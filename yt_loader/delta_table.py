"""The loader's Delta Lake table: each batch is one Delta commit of its files and its offsets.

Layout: one Delta table at the warehouse path, partitioned by ``topic``, ``date`` and ``hour``
(the hour of ``write_time``, UTC)::

    TABLE/_delta_log/00000000000000000007.json     Delta's transaction log
    TABLE/topic=dc1.app/date=2026-11-21/hour=14/
        part-<topic id>-<partition>-<first offset>-<end offset>-<attempt>.parquet

One batch, one Delta transaction, committed by the driver, holding:

- an ``add`` action for every file of the task attempts whose results Spark accepted (files
  of failed, killed or overtaken attempts are in the directory but in no commit, so no reader
  sees them; ``VACUUM`` removes them);
- the application transaction ``logbroker-load`` at version ``batch``, and one
  ``logbroker-load/<topic>/<topic id>/<partition>`` at the partition's loaded end offset for
  every partition the batch moved; ``logbroker-load/<topic>/<topic id>/deleted`` once a load
  found that topic gone from the log and reported it.

Application transactions (``txn`` actions, ``txnAppId``/``txnVersion`` in Delta's writer) are
what Delta's own streaming sink uses to make a micro-batch idempotent.  Here they also carry
the loader's offsets, so the table's snapshot is the loader's whole state: committed atomically
with the rows, kept in Delta's checkpoints, and seen as of any version by time travel.  Each
transaction reads ``logbroker-load`` first, so if two loaders commit to the same table, Delta
fails the second with a concurrent-transaction error instead of loading a batch twice.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from log_store.errors import BadRequest
from yt_loader.crash_points import reach
from yt_loader.errors import WarehouseBusy, WarehouseCorrupt
from yt_loader.load_target import DELTA_LOG_DIR, LoadState, Progress, check_table_format
from yt_loader.range_writer import PARTITION_COLUMNS, OutputLayout, WrittenFile, WrittenRange
from yt_loader.typed_columns import TopicSchemas, evolved_table_schema, usable_columns
from yt_loader.warehouse import LOADER_DIR, LoadGap, Recovery, TopicOffsets, Warehouse

BATCH_APP_ID = "logbroker-load"
TABLE_SCHEMA_DDL = (
    "topic STRING, date DATE, hour INT, partition INT, offset BIGINT, source_id STRING, "
    "seqno BIGINT, server STRING, file STRING, log_type STRING, create_time TIMESTAMP, "
    "write_time TIMESTAMP, line STRING"
)
RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"
_CONCURRENT_COMMIT_ERRORS = (
    "ConcurrentTransactionException",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


DELETED = "deleted"
CREATION_WAIT_S = 30.0
"""How long a loader waits for another loader's creation of the table to commit."""


def _has_commit(path: Path) -> bool:
    """True if the Delta log at ``path`` has a commit (its first is ``000...0.json``).

    A log directory alone is not a table: Delta makes it just before writing the first commit.
    """
    log_dir = path / DELTA_LOG_DIR
    try:
        names = [entry.name for entry in log_dir.iterdir()]
    except (FileNotFoundError, NotADirectoryError):
        return False
    # A commit, a checkpoint or a checksum: a version number of 20 digits, then a dot.
    return any(len(name) > 20 and name[:20].isdigit() and name[20] == "." for name in names)


def partition_app_id(topic: str, topic_id: str, partition: int | str) -> str:
    """The application transaction whose version is ``partition``'s loaded end offset
    (``partition`` :data:`DELETED`: the mark of a topic a load found deleted)."""
    return f"{BATCH_APP_ID}/{topic}/{topic_id}/{partition}"


def with_table_columns(df: DataFrame) -> DataFrame:
    """Add the ``date`` and ``hour`` partition columns of the loader's table (UTC, whatever the
    session's time zone), e.g. before ``writeStream.format("delta")`` into a table of the same
    shape."""
    hours = "floor(unix_micros(write_time) / 3600000000)"
    return df.withColumn(
        "date", F.expr(f"date_from_unix_date(CAST(floor({hours} / 24) AS INT))")
    ).withColumn("hour", F.expr(f"CAST({hours} % 24 AS INT)"))


@dataclass(frozen=True)
class _Entry:
    topic: str
    topic_id: str
    partition: int
    offset: int
    updated_ms: int


def _parse_app_id(app_id: str) -> tuple[str, str, int | str] | None:
    """(topic, topic id, partition or :data:`DELETED`) of a loader's application transaction."""
    prefix = BATCH_APP_ID + "/"
    if not app_id.startswith(prefix):
        return None
    parts = app_id[len(prefix) :].split("/")
    if len(parts) != 3:
        return None
    if parts[2] == DELETED:
        return parts[0], parts[1], DELETED
    if not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


class _Jvm:
    """The few Delta and Scala calls the driver makes through Py4J."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        jvm = spark._jvm
        if jvm is None:
            raise BadRequest("the Delta table needs a classic Spark session (not Spark Connect)")
        self.jvm: Any = jvm
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters

    def delta_log(self, path: Path) -> Any:
        return self.jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            self.spark._jsparkSession, str(path)
        )

    def seq(self, items: list[Any]) -> Any:
        array = self.jvm.java.util.ArrayList()
        for item in items:
            array.add(item)
        return self.converters.asScala(array).toSeq()

    def to_list(self, seq: Any) -> list[Any]:
        return list(self.converters.asJava(seq))

    def map_get(self, scala_map: Any, key: str) -> str | None:
        value = self.converters.asJava(scala_map).get(key)
        return None if value is None else str(value)

    def some(self, value: Any) -> Any:
        return self.jvm.scala.Some(value)

    def none(self) -> Any:
        return getattr(getattr(self.jvm.scala, "None$"), "MODULE$")

    def action(self, doc: dict[str, Any]) -> Any:
        actions = getattr(
            getattr(self.jvm.org.apache.spark.sql.delta.actions, "Action$"), "MODULE$"
        )
        return actions.fromJson(json.dumps(doc, separators=(",", ":")))

    def write_operation(self, user_metadata: str) -> Any:
        write = getattr(self.jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")
        none = self.none()
        return write(
            self.jvm.org.apache.spark.sql.SaveMode.Append,
            self.some(self.seq(list(PARTITION_COLUMNS))),
            none,
            self.some(user_metadata),
            none,
            none,
            none,
            none,
            none,
        )


class _Transaction:
    """One open Delta transaction and the loader's state as its snapshot has it."""

    def __init__(self, jvm: _Jvm, delta_log: Any) -> None:
        self.jvm = jvm
        self.txn = delta_log.startTransaction()
        # Read through the transaction, so that a concurrent loader's commit conflicts.
        self.batch = max(0, int(self.txn.txnVersion(BATCH_APP_ID)))
        snapshot = self.txn.snapshot()
        self.entries: dict[tuple[str, str, int], _Entry] = {}
        self.deleted: dict[tuple[str, str], int] = {}
        """(topic, topic id) a load found deleted -> when it recorded that (ms)."""
        for txn in jvm.to_list(snapshot.setTransactions()):
            parsed = _parse_app_id(str(txn.appId()))
            if parsed is None:
                continue
            updated = txn.lastUpdated()
            updated_ms = int(updated.get()) if updated.isDefined() else 0
            topic, topic_id, partition = parsed
            if isinstance(partition, str):
                self.deleted[(topic, topic_id)] = updated_ms
                continue
            self.entries[(topic, topic_id, partition)] = _Entry(
                topic, topic_id, partition, int(txn.version()), updated_ms
            )
        self.retention = jvm.map_get(snapshot.metadata().configuration(), RETENTION_PROPERTY)

    def is_deleted(self, topic: str, topic_id: str) -> bool:
        """True if a load recorded the topic deleted and loaded nothing of it since."""
        marked = self.deleted.get((topic, topic_id))
        if marked is None:
            return False
        loaded = [
            e.updated_ms
            for e in self.entries.values()
            if e.topic == topic and e.topic_id == topic_id
        ]
        return marked >= max(loaded, default=0)

    def offsets(self) -> dict[str, TopicOffsets]:
        """Per topic name, the partitions of its newest topic identity."""
        newest: dict[str, tuple[int, str]] = {}
        updates = [(e.topic, e.topic_id, e.updated_ms) for e in self.entries.values()]
        updates += [(topic, topic_id, ms) for (topic, topic_id), ms in self.deleted.items()]
        for topic, topic_id, updated_ms in updates:
            known = newest.get(topic)
            if known is None or updated_ms > known[0]:
                newest[topic] = (updated_ms, topic_id)
        offsets: dict[str, TopicOffsets] = {
            topic: TopicOffsets(topic_id, deleted=self.is_deleted(topic, topic_id))
            for topic, (_, topic_id) in newest.items()
        }
        for entry in self.entries.values():
            if offsets[entry.topic].topic_id == entry.topic_id:
                offsets[entry.topic].partitions[entry.partition] = entry.offset
        return offsets


def _stats(f: WrittenFile, partition: int) -> str:
    return json.dumps(
        {
            "numRecords": f.rows,
            "minValues": {"partition": partition, "offset": f.min_offset},
            "maxValues": {"partition": partition, "offset": f.max_offset},
            "nullCount": {"partition": 0, "offset": 0},
        },
        separators=(",", ":"),
    )


def _batch_metadata(batch: int, written: list[WrittenRange], gaps: list[LoadGap]) -> str:
    loaded: dict[str, dict[str, list[int]]] = {}
    for w in written:
        bounds = loaded.setdefault(w.rng.topic, {}).setdefault(
            str(w.rng.partition), [w.rng.start, w.rng.end]
        )
        bounds[0], bounds[1] = min(bounds[0], w.rng.start), max(bounds[1], w.rng.end)
    return json.dumps(
        {
            "loader": "logbroker load",
            "batch": batch,
            "lines": sum(w.lines for w in written),
            "offsets": loaded,
            "gaps": [g.message() for g in gaps],
        },
        separators=(",", ":"),
        sort_keys=True,
    )


class DeltaTarget:
    """A Delta table filled by ``logbroker load``; see the module docstring."""

    def __init__(self, spark: SparkSession, path: Path) -> None:
        self.spark = spark
        self.path = path
        self._jvm = _Jvm(spark)
        self._txn: _Transaction | None = None
        self._evolved: dict[str, Any] | None = None
        """The table's ``metaData`` with a wider schema, for the next commit (typed columns)."""

    @property
    def recovery(self) -> Recovery:
        return Recovery(0, [])

    def _create_if_absent(self) -> None:
        if _has_commit(self.path):
            return
        check_table_format(self.path, "delta")
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(self.spark).location(str(self.path))
        for column in TABLE_SCHEMA_DDL.split(", "):
            name, data_type = column.split(" ")
            builder = builder.addColumn(name, data_type)
        builder = builder.partitionedBy(*PARTITION_COLUMNS)
        try:
            builder.execute()
        except Exception:
            # Another loader (two scheduled runs starting together) is creating the table:
            # Delta refuses the second creation, as a concurrent commit if both got to commit,
            # or as a location that is not empty if the other's log directory was there first.
            # Once the other's first commit is there, creating the table again checks that it
            # is the loader's table and uses it.  Which of the two loads a batch is then
            # decided by the batches' own transactions.
            if not self._wait_for_other_creation():
                raise
            builder.execute()

    def _wait_for_other_creation(self) -> bool:
        """True once another writer's first commit is in the table's log; False at once if
        nobody is creating the table (no log directory: the error was something else).

        A log directory that stays without a commit is a creation that never finished: it is
        named, as Delta's own error (a location that is not empty) would not say what to do.
        """
        log_dir = self.path / DELTA_LOG_DIR
        deadline = time.monotonic() + CREATION_WAIT_S
        while log_dir.is_dir():
            if _has_commit(self.path):
                return True
            if time.monotonic() > deadline:
                raise WarehouseCorrupt(
                    f"{log_dir} has had no commit for {CREATION_WAIT_S:.0f} s: a table "
                    "creation that did not finish; if no other load is running, remove that "
                    "directory and load again"
                )
            time.sleep(0.05)
        return False

    def _begin(self) -> _Transaction:
        txn = _Transaction(self._jvm, self._jvm.delta_log(self.path))
        if txn.retention is not None:
            raise BadRequest(
                f"the table sets {RETENTION_PROPERTY}={txn.retention}: Delta would forget the "
                "loader's offsets, and the next load would load old offsets again; unset it"
            )
        return txn

    @contextlib.contextmanager
    def opened(self, progress: Progress) -> Iterator[LoadState]:
        self._create_if_absent()
        txn = self._begin()
        offsets = txn.offsets()
        if txn.batch == 0 and not offsets:
            offsets = self._adopt_parquet_offsets(progress)
        self._txn = txn
        try:
            yield LoadState(txn.batch, offsets)
        finally:
            self._txn = None

    def _adopt_parquet_offsets(self, progress: Progress) -> dict[str, TopicOffsets]:
        """The offsets of a Parquet warehouse converted in place to Delta, if this was one."""
        warehouse = Warehouse(self.path)
        latest = warehouse.latest_commit()
        if latest is None:
            return {}
        staging = self.path / LOADER_DIR / "staging"
        if staging.is_dir() and any(staging.iterdir()):
            raise WarehouseCorrupt(
                f"{self.path} was converted from a Parquet warehouse whose last load did not "
                "finish; restore it, run `logbroker load --table-format parquet` once, then "
                "convert it again"
            )
        progress(
            f"continuing from the Parquet warehouse's commit log (batch {latest.batch}): "
            "this first Delta commit records its offsets in the table"
        )
        return {
            t: TopicOffsets(o.topic_id, dict(o.partitions), o.deleted)
            for t, o in latest.offsets.items()
        }

    def layout(self, batch: int, run: str) -> OutputLayout:
        return OutputLayout(str(self.path), run, "file_name")

    def evolve_schema(self, typed: dict[str, TopicSchemas]) -> dict[str, str]:
        """The next commit also changes the table's schema to hold ``typed``'s columns, the way
        ``mergeSchema`` does: one ``metaData`` action in the same transaction as the rows.
        Returns the topics whose columns the table cannot get, with why."""
        txn = self._txn if self._txn is not None else self._begin()
        metadata = json.loads(str(txn.txn.metadata().json()))["metaData"]
        if "schemaString" not in metadata:
            # Delta's metadata where its log has no table (a directory inside a table, say)
            raise WarehouseCorrupt(
                f"{self.path} is not a Delta table: its log has no schema (a directory inside "
                "a table? give the table's root)"
            )
        table_schema = json.loads(metadata["schemaString"])
        usable, refused = usable_columns(table_schema, typed)
        wider = evolved_table_schema(table_schema, usable)
        self._evolved = None
        if wider is not None:
            self._evolved = {**metadata, "schemaString": json.dumps(wider, separators=(",", ":"))}
        return refused

    def commit(
        self,
        batch: int,
        written: list[WrittenRange],
        offsets: dict[str, TopicOffsets],
        gaps: list[LoadGap],
        crash_at: str | None,
    ) -> None:
        txn = self._txn if self._txn is not None else self._begin()
        self._txn = None
        if txn.batch != batch - 1:
            raise WarehouseBusy(
                f"{self.path} has batch {txn.batch} committed, not {batch - 1}: another loader "
                f"is writing this table; batch {batch} was not committed"
            )
        jvm = self._jvm
        now = int(time.time() * 1000)
        actions = [
            jvm.action(
                {
                    "add": {
                        "path": f.path,
                        "partitionValues": {"topic": f.topic, "date": f.date, "hour": str(f.hour)},
                        "size": f.size_bytes,
                        "modificationTime": f.modified_ms,
                        "dataChange": True,
                        "stats": _stats(f, w.rng.partition),
                    }
                }
            )
            for w in written
            for f in w.files
        ]
        actions.append(
            jvm.action({"txn": {"appId": BATCH_APP_ID, "version": batch, "lastUpdated": now}})
        )
        for topic, topic_offsets in sorted(offsets.items()):
            if topic_offsets.deleted and not txn.is_deleted(topic, topic_offsets.topic_id):
                app_id = partition_app_id(topic, topic_offsets.topic_id, DELETED)
                actions.append(
                    jvm.action({"txn": {"appId": app_id, "version": 1, "lastUpdated": now}})
                )
            for partition, end in sorted(topic_offsets.partitions.items()):
                key = (topic, topic_offsets.topic_id, partition)
                known = txn.entries.get(key)
                if known is not None and known.offset == end:
                    continue
                app_id = partition_app_id(topic, topic_offsets.topic_id, partition)
                actions.append(
                    jvm.action({"txn": {"appId": app_id, "version": end, "lastUpdated": now}})
                )
        operation = jvm.write_operation(_batch_metadata(batch, written, gaps))
        if self._evolved is not None:
            txn.txn.updateMetadata(jvm.action({"metaData": self._evolved}), False)
        try:
            txn.txn.commit(jvm.seq(actions), operation)
        except Exception as exc:
            text = str(exc)
            if any(name in text for name in _CONCURRENT_COMMIT_ERRORS):
                raise WarehouseBusy(
                    f"another loader (or writer) committed to {self.path} while batch {batch} "
                    "ran: "
                    f"{text.splitlines()[0][:300]}; batch {batch} was not committed"
                ) from exc
            raise
        self._evolved = None
        reach("after-commit", crash_at)
