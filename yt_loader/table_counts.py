"""The loader's audit counts: messages and lines per (topic, window) of what the table holds.

Counted from the committed table itself after every load, so the counts are exactly what is
loaded (a crash loses nothing and a reloaded batch counts once), and a line deleted from the
table by hand shows as lost.  A message is a distinct (topic identity, partition, offset); its
lines are rows.  The identity is the one the loader's file names carry
(:func:`yt_loader.warehouse.file_name`): a topic deleted and created again starts at offset 0
again, and its messages are other messages than the old topic's at the same offsets, as the
gateway counted them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from audit.windows import WINDOW_S
from yt_loader.warehouse import Warehouse

Counts = dict[tuple[str, int], tuple[int, int]]

FILE_TOPIC_ID = r"^part-([0-9a-zA-Z]+)-\d+-\d+-\d+"
"""The topic identity in the name of a file the loader wrote (``part-<id>-<p>-<first>-<end>``);
a file another writer made (``OPTIMIZE``'s) has none, and counts as one identity."""
_FILE_TOPIC_ID = re.compile(FILE_TOPIC_ID)


def topic_id_of_file(name: str) -> str:
    """The topic identity in a loader file's name, or ``""`` for another writer's file."""
    found = _FILE_TOPIC_ID.match(name)
    return found.group(1) if found else ""


def _topic_of(path: Path) -> str:
    for part in path.parts:
        if part.startswith("topic="):
            return part[len("topic=") :]
    raise ValueError(f"{path} is not under a topic= directory")


def parquet_table_counts(warehouse: Path) -> Counts:
    """Counts of the committed files of a Parquet warehouse (no Spark needed)."""
    messages: dict[tuple[str, int], set[tuple[str, int, int]]] = defaultdict(set)
    lines: dict[tuple[str, int], int] = defaultdict(int)
    for path in Warehouse(warehouse).committed_files():
        if not path.exists():
            continue
        table = pq.read_table(path, columns=["partition", "offset", "create_time"])
        topic = _topic_of(path.relative_to(warehouse))
        topic_id = topic_id_of_file(path.name)
        seconds = pc.divide(table.column("create_time").cast("int64"), 1_000_000).to_pylist()
        partitions = table.column("partition").to_pylist()
        offsets = table.column("offset").to_pylist()
        for second, partition, offset in zip(seconds, partitions, offsets, strict=True):
            key = (topic, int(second) // WINDOW_S * WINDOW_S)
            messages[key].add((topic_id, partition, offset))
            lines[key] += 1
    return {key: (len(messages[key]), lines[key]) for key in lines}


def delta_table_counts(spark: Any, warehouse: Path) -> Counts:
    """Counts of a Delta table, with Spark."""
    from pyspark.sql import functions as F

    if not (warehouse / "_delta_log").is_dir():
        return {}
    df = spark.read.format("delta").load(str(warehouse))
    window = (F.floor(F.unix_timestamp("create_time") / WINDOW_S) * WINDOW_S).cast("long")
    topic_id = F.regexp_extract(F.col("_metadata.file_name"), FILE_TOPIC_ID, 1)
    rows = (
        df.groupBy("topic", window.alias("window"))
        .agg(
            F.countDistinct(topic_id, "partition", "offset").alias("messages"),
            F.count("*").alias("lines"),
        )
        .collect()
    )
    return {(r["topic"], int(r["window"])): (int(r["messages"]), int(r["lines"])) for r in rows}
