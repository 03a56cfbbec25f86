"""``logbroker bench NAME [ARGS...]``: run one of the benchmarks in ``benchmarks/``.

Benchmarks print tables; they never fail on speed.  Run from a source checkout.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _available() -> list[str]:
    return sorted(p.stem.removesuffix("_bench") for p in BENCHMARKS_DIR.glob("*_bench.py"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="benchmark to run: " + ", ".join(_available()))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")


def run(args: argparse.Namespace) -> int:
    script = BENCHMARKS_DIR / f"{args.name}_bench.py"
    if not script.is_file():
        print(
            f"logbroker bench: no benchmark {args.name!r}; choose one of: "
            + ", ".join(_available()),
            file=sys.stderr,
        )
        return 2
    sys.argv = [str(script), *args.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
