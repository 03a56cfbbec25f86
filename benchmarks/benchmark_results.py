"""The machine-readable result of one benchmark run: what ``--json PATH`` writes.

Every benchmark in this directory prints its own table for a reader and, given ``--json PATH``,
also writes the same figures as JSON for ``logbroker bench all``, which collects them into one
table.  The file reads::

    {"benchmark": "store", "format": 1, "args": {...the script's arguments...},
     "figures": [{"name": "append 64 KiB records, 16 per append, 1 writer", "value": 556.0,
                  "unit": "MB/s", "runs": [550.1, 556.0, 571.2],
                  "against": [{"peer": "dd", "ratio": 0.40, "style": "percent"}]}, ...]}

``value`` is the median of ``runs`` (one entry per run of the script's ``--runs``).  A figure
measured against a peer in the same run (``dd``, rsyslog, a raw Kafka producer, the ingest rate)
gives in ``against`` the median of the per-run ratios, not the ratio of the medians, so that a
run a busy machine slowed down is compared with its own peer.  ``style`` says how to print the
ratio: ``percent`` ("40% of dd") or ``times`` ("4.15x rsyslog").
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

FORMAT = 1


@dataclass
class Comparison:
    """A figure divided by its peer's figure of the same run (median over the runs)."""

    peer: str
    ratio: float
    style: Literal["percent", "times"] = "times"

    def __str__(self) -> str:
        if self.style == "percent":
            return f"{self.ratio:.0%} of {self.peer}"
        return f"{self.ratio:.2f}x {self.peer}"


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    runs: list[float] = field(default_factory=list)
    against: list[Comparison] = field(default_factory=list)

    @classmethod
    def of_runs(cls, name: str, runs: list[float], unit: str) -> Figure:
        """The median of ``runs``."""
        return cls(name=name, value=statistics.median(runs), unit=unit, runs=list(runs))

    def compared(
        self,
        peer: str,
        ratios: list[float],
        style: Literal["percent", "times"] = "times",
    ) -> Figure:
        """This figure with the median of its per-run ratios to ``peer`` added."""
        self.against.append(Comparison(peer, statistics.median(ratios), style))
        return self


@dataclass
class BenchmarkResult:
    benchmark: str
    args: dict[str, Any]
    figures: list[Figure]


def write(path: Path | str | None, benchmark: str, args: object, figures: list[Figure]) -> None:
    """Write ``figures`` as JSON to ``path`` (nothing when ``path`` is None)."""
    if path is None:
        return
    arguments = {k: _plain(v) for k, v in vars(args).items() if k != "json"}
    document = {
        "benchmark": benchmark,
        "format": FORMAT,
        "args": arguments,
        "figures": [asdict(f) for f in figures],
    }
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


def read(path: Path) -> BenchmarkResult:
    """A result file written by :func:`write`; ``ValueError`` when it is not one."""
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT or not isinstance(document.get("figures"), list):
        raise ValueError(f"{path}: not a benchmark result of format {FORMAT}")
    return BenchmarkResult(
        benchmark=document["benchmark"],
        args=document.get("args", {}),
        figures=[
            Figure(
                name=f["name"],
                value=f["value"],
                unit=f["unit"],
                runs=f.get("runs", []),
                against=[Comparison(**c) for c in f.get("against", [])],
            )
            for f in document["figures"]
        ],
    )


def _plain(value: object) -> object:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
