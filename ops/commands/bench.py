"""``logbroker bench``: run the benchmarks in ``benchmarks/`` and print their tables.

    logbroker bench list
    logbroker bench all [--quick] [--only NAME,NAME] [--runs N] [--markdown PATH] [--json PATH]
    logbroker bench NAME [ARGS...]

``all`` runs every benchmark with its peers (``benchmarks/suite.py``) and prints one table with
the date and the machine; ``NAME`` runs one benchmark's script with its own arguments.
Benchmarks print tables; they never fail on speed.  Run from a source checkout.
"""

from __future__ import annotations

import argparse
import runpy
import shlex
import sys
from pathlib import Path
from types import ModuleType

from ops import stop_signals

BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
HANDLES_STOP_SIGNALS = True


def _available() -> list[str]:
    return sorted(p.stem.removesuffix("_bench") for p in BENCHMARKS_DIR.glob("*_bench.py"))


def _suite() -> ModuleType:
    """``benchmarks/suite.py``; the benchmarks import each other by their file names."""
    if str(BENCHMARKS_DIR) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS_DIR))
    import suite

    return suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="'all', 'list', or one benchmark: " + ", ".join(_available()))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark")


def _all_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logbroker bench all",
        description="Run every benchmark and its peers; print one table with the machine.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small workloads, one run each: a check, not figures"
    )
    parser.add_argument("--only", help="comma-separated benchmarks to run (see `bench list`)")
    parser.add_argument(
        "--runs", type=int, help="runs per benchmark, medians shown (default: each script's own)"
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here as Markdown")
    parser.add_argument("--json", type=Path, help="also write every figure here as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        return _list(args.args)
    if args.name == "all":
        return _run_all(args.args)
    stop_signals.restore_default()
    script = BENCHMARKS_DIR / f"{args.name}_bench.py"
    if not script.is_file():
        print(
            f"logbroker bench: no benchmark {args.name!r}; choose all, list or one of: "
            + ", ".join(_available()),
            file=sys.stderr,
        )
        return 2
    _suite()  # puts the benchmarks' directory on the import path
    sys.argv = [str(script), *args.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _list(extra: list[str]) -> int:
    if extra:
        print(f"logbroker bench list: takes no arguments, got {extra}", file=sys.stderr)
        return 2
    suite = _suite()
    for bench in suite.BENCHMARKS:
        print(f"{bench.name}: {bench.measures}")
        print(f"  peers: {bench.peers}")
        if bench.needs:
            print(f"  needs: {bench.needs}")
    return 0


def _run_all(argv: list[str]) -> int:
    parser = _all_parser()
    options = parser.parse_args(argv)  # bad arguments: a message and exit status 2
    suite = _suite()
    names = [b.name for b in suite.BENCHMARKS]
    if options.only is not None:
        wanted = [n.strip() for n in options.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in suite.BY_NAME]
        if not wanted or unknown:
            parser.error(
                f"--only: unknown benchmark(s) {', '.join(unknown) or '(none given)'}; "
                f"choose from {', '.join(names)}"
            )
        names = [n for n in names if n in wanted]
    if options.runs is not None and options.runs < 1:
        parser.error(f"--runs must be at least 1, not {options.runs}")
    for flag, path in (("--markdown", options.markdown), ("--json", options.json)):
        if path is not None and not path.parent.resolve().is_dir():
            parser.error(f"{flag}: no directory {path.parent} to write {path.name} in")

    stopped: list[bool] = []
    stop_signals.on_stop(lambda: stopped.append(True))
    report = suite.run_suite(
        names,
        quick=options.quick,
        runs=options.runs,
        command=shlex.join(["logbroker", "bench", "all", *argv]),
        log=sys.stderr,
        should_stop=lambda: bool(stopped),
    )
    table = suite.markdown(report)
    print(table, end="", flush=True)
    if options.markdown is not None:
        options.markdown.write_text(table)
    if options.json is not None:
        import json

        options.json.write_text(json.dumps(report.as_dict(), indent=1) + "\n")
    if stopped:
        print("logbroker bench all: stopped before every benchmark ran", file=sys.stderr)
        return 1
    if report.failed:
        names_failed = ", ".join(o.name for o in report.failed)
        print(f"logbroker bench all: did not run: {names_failed}", file=sys.stderr)
        return 1
    return 0
