"""The loader's audit counts: messages and lines per (topic, window) of what the table holds.

Counted from the committed table itself after every load, so the counts are exactly what is
loaded (a crash loses nothing and a reloaded batch counts once), and a line deleted from the
table by hand shows as lost.  A message is a distinct (partition, offset); its lines are rows.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from audit.windows import WINDOW_S
from yt_loader.warehouse import Warehouse

Counts = dict[tuple[str, int], tuple[int, int]]


def _topic_of(path: Path) -> str:
    for part in path.parts:
        if part.startswith("topic="):
            return part[len("topic=") :]
    raise ValueError(f"{path} is not under a topic= directory")


def parquet_table_counts(warehouse: Path) -> Counts:
    """Counts of the committed files of a Parquet warehouse (no Spark needed)."""
    messages: dict[tuple[str, int], set[tuple[int, int]]] = defaultdict(set)
    lines: dict[tuple[str, int], int] = defaultdict(int)
    for path in Warehouse(warehouse).committed_files():
        if not path.exists():
            continue
        table = pq.read_table(path, columns=["partition", "offset", "create_time"])
        topic = _topic_of(path.relative_to(warehouse))
        seconds = pc.divide(table.column("create_time").cast("int64"), 1_000_000).to_pylist()
        partitions = table.column("partition").to_pylist()
        offsets = table.column("offset").to_pylist()
        for second, partition, offset in zip(seconds, partitions, offsets, strict=True):
            key = (topic, int(second) // WINDOW_S * WINDOW_S)
            messages[key].add((partition, offset))
            lines[key] += 1
    return {key: (len(messages[key]), lines[key]) for key in lines}


def delta_table_counts(spark: Any, warehouse: Path) -> Counts:
    """Counts of a Delta table, with Spark."""
    from pyspark.sql import functions as F

    if not (warehouse / "_delta_log").is_dir():
        return {}
    df = spark.read.format("delta").load(str(warehouse))
    window = (F.floor(F.unix_timestamp("create_time") / WINDOW_S) * WINDOW_S).cast("long")
    rows = (
        df.groupBy("topic", window.alias("window"))
        .agg(F.countDistinct("partition", "offset").alias("messages"), F.count("*").alias("lines"))
        .collect()
    )
    return {(r["topic"], int(r["window"])): (int(r["messages"]), int(r["lines"])) for r in rows}
