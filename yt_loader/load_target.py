"""What the loader writes into: a Delta Lake table (default) or the Parquet-directory warehouse.

Both keep one promise, each in its own way: the rows of a batch and the offsets that say they
were loaded become visible together, in one commit, or not at all.  The job
(:mod:`yt_loader.load_job`) plans batches from a :class:`LoadState`, lets Spark tasks write
files where :meth:`LoadTarget.layout` says, and hands what the accepted attempts wrote to
:meth:`LoadTarget.commit`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from log_store.errors import BadRequest
from yt_loader.crash_points import reach
from yt_loader.range_writer import OutputLayout, WrittenRange
from yt_loader.typed_columns import TopicSchemas, usable_columns
from yt_loader.warehouse import (
    CommitRecord,
    LoadedRange,
    LoadGap,
    Recovery,
    TopicOffsets,
    Warehouse,
    now_ms,
)

TableFormat = Literal["delta", "parquet"]
TABLE_FORMATS: tuple[TableFormat, ...] = ("delta", "parquet")

Progress = Callable[[str], None]

DELTA_LOG_DIR = "_delta_log"


def check_table_format(path: Path, table_format: TableFormat) -> None:
    """Refuse (``BadRequest``, before anything is written) a table of the other format at
    ``path``: a Parquet load into a Delta table would leave files and a commit log of its own
    beside the table's, and the reverse would hide a warehouse's files from its readers.

    Refuse as well a path inside a Delta table (a partition's directory, say): Delta finds no
    table there, and a table made there would put files into the other's directories.
    """
    root = enclosing_delta_table(path)
    if root is not None:
        raise BadRequest(f"{path} is inside the Delta table {root}; give the table's root")
    if table_format == "parquet" and (path / DELTA_LOG_DIR).is_dir():
        raise BadRequest(
            f"{path} is a Delta table: load it without --table-format parquet (Delta is the "
            "default), or give the Parquet warehouse another path"
        )
    if (
        table_format == "delta"
        and not (path / DELTA_LOG_DIR).is_dir()
        and Warehouse(path).latest_commit() is not None
    ):
        raise BadRequest(
            f"{path} is a Parquet warehouse: load it with --table-format parquet, or "
            "convert it to Delta first (docs/loader.md, 'Migrating a Parquet warehouse')"
        )


def enclosing_delta_table(path: Path) -> Path | None:
    """The Delta table that ``path`` lies inside (the nearest directory above it with a Delta
    log), or None."""
    for parent in path.absolute().parents:
        if (parent / DELTA_LOG_DIR).is_dir():
            return parent
    return None


def table_exists(path: Path, table_format: TableFormat) -> bool:
    """Whether a table of ``table_format`` is at ``path`` already (a load only adds to it)."""
    if table_format == "delta":
        return (path / DELTA_LOG_DIR).is_dir()
    return Warehouse(path).latest_commit() is not None


@dataclass(frozen=True)
class LoadState:
    """What is loaded: the last committed batch and, per topic, every partition's end offset."""

    batch: int = 0
    offsets: dict[str, TopicOffsets] = field(default_factory=dict)


class LoadTarget(Protocol):
    def opened(self, progress: Progress) -> contextlib.AbstractContextManager[LoadState]:
        """Take what the target needs to be written (a lock, a repair) and say what is loaded."""
        ...

    @property
    def recovery(self) -> Recovery: ...

    def layout(self, batch: int, run: str) -> OutputLayout:
        """Where the tasks of ``batch`` write their files."""
        ...

    def evolve_schema(self, typed: dict[str, TopicSchemas]) -> dict[str, str]:
        """Make the next commit widen the table by the structured topics' typed columns.

        Returns the topics whose columns the table cannot get (a column would change type,
        a schema has no column type: see :func:`~yt_loader.typed_columns.usable_columns`),
        with why; the others' columns are made.  Nothing is written yet.
        """
        ...

    def commit(
        self,
        batch: int,
        written: list[WrittenRange],
        offsets: dict[str, TopicOffsets],
        gaps: list[LoadGap],
        crash_at: str | None,
    ) -> None:
        """Make the batch visible whole, with ``offsets`` (everything loaded after it)."""
        ...


class ParquetTarget:
    """The Parquet-directory warehouse with its own commit log (see :mod:`yt_loader.warehouse`)."""

    def __init__(self, root: Path) -> None:
        self.warehouse = Warehouse(root)
        self._recovery = Recovery(0, [])

    @property
    def recovery(self) -> Recovery:
        return self._recovery

    @contextlib.contextmanager
    def opened(self, progress: Progress) -> Iterator[LoadState]:
        check_table_format(self.warehouse.root, "parquet")
        with self.warehouse.locked():
            self._recovery = self.warehouse.recover()
            if self._recovery.published_files:
                progress(
                    f"recovered: moved {self._recovery.published_files} committed files into place"
                )
            if self._recovery.discarded_batches:
                batches = ", ".join(str(b) for b in self._recovery.discarded_batches)
                progress(f"recovered: discarded uncommitted batch {batches}; reloading it")
            latest = self.warehouse.latest_commit()
            if latest is None:
                yield LoadState()
            else:
                yield LoadState(latest.batch, latest.offsets)

    def evolve_schema(self, typed: dict[str, TopicSchemas]) -> dict[str, str]:
        """Parquet files carry their own schema (readers merge them): nothing to record here,
        but a column Parquet or Spark cannot hold is refused all the same."""
        _, refused = usable_columns({"type": "struct", "fields": []}, typed)
        return refused

    def layout(self, batch: int, run: str) -> OutputLayout:
        staging = self.warehouse.staging_dir(batch)
        staging.mkdir(parents=True, exist_ok=True)
        return OutputLayout(str(staging), run, "directory")

    def commit(
        self,
        batch: int,
        written: list[WrittenRange],
        offsets: dict[str, TopicOffsets],
        gaps: list[LoadGap],
        crash_at: str | None,
    ) -> None:
        record = CommitRecord(
            batch=batch,
            committed_ms=now_ms(),
            offsets=offsets,
            ranges=[
                LoadedRange(
                    topic=w.rng.topic,
                    partition=w.rng.partition,
                    start=w.rng.start,
                    end=w.rng.end,
                    files=[f.path for f in w.files],
                    lines=w.lines,
                    data_bytes=w.data_bytes,
                    staged_in=w.attempt,
                )
                for w in written
            ],
            gaps=gaps,
        )
        self.warehouse.commit(record)
        reach("after-commit", crash_at)
        self.warehouse.publish(record, on_moved=lambda: reach("mid-publish", crash_at))
        self.warehouse.drop_staging(batch)
