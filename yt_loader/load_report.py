"""The report of a load as JSON: what ``logbroker load --format json`` prints and
``--report FILE`` writes.

A file, not a stream, is what a job reads the outcome from where stdout carries more than the
report: a driver that ``spark-submit`` started has its stderr merged into its stdout.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # this module needs no pyspark: a load without it still writes its report
    from yt_loader.load_job import LoadReport


def report_document(report: LoadReport) -> dict[str, Any]:
    """What ``--format json`` prints of a load that ran (and ``--report`` writes)."""
    return {
        "batches": report.batches,
        "ranges": report.ranges,
        "lines": report.lines,
        "data_bytes": report.data_bytes,
        "elapsed_s": round(report.elapsed_s, 3),
        "stopped": report.stopped,
        "recovered_files": report.recovery.published_files,
        "discarded_batches": report.recovery.discarded_batches,
        "gaps": [vars(g) | {"message": g.message()} for g in report.gaps],
        "clamped_times": report.clamped_times,
        "topics": {t: vars(p) for t, p in sorted(report.topics.items())},
        "held_back": dict(sorted(report.held_back.items())),
    }


def write_report(path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` with ``doc`` as JSON at once: a reader sees no file or a whole one."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(staged, "w") as out:
        out.write(json.dumps(doc, indent=1) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(staged, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
