"""The ``logbroker`` command: a thin layer over the library, one module per subcommand.

Each subcommand lives in ``ops/commands/<name>.py`` and defines ``add_arguments(parser)``
and ``run(args) -> int``.  Bad usage exits with code 2 and a message on stderr.  A command
that stops cleanly on SIGTERM/SIGINT sets ``HANDLES_STOP_SIGNALS = True`` and says what a stop
means through :func:`ops.stop_signals.on_stop`; the signals are recorded from the first
instruction on, so a stop that comes while the command is still starting is not lost.  One that
reloads its configuration on SIGHUP sets ``HANDLES_RELOAD = True`` and uses
:func:`ops.stop_signals.on_reload`; the others die by SIGHUP as usual.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from pathlib import Path
from types import ModuleType

if (
    __name__ == "__main__"
    and sys.path
    and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent
):
    # Run as a file (`spark-submit ops/cli.py load ...`): Python put ops/ itself first on the
    # path, where ops/audit.py would hide the `audit` package.  Import from the repository.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from ops import stop_signals

SUBCOMMANDS: dict[str, str] = {
    "serve": "run the gateway (ingest, pull reads, push delivery) over a log store",
    "push": "the host daemon: tail log files and ship every line exactly once",
    "read": "read a topic or a DC prefix and print lines or JSON",
    "mirror": "copy dc-prefixed topics from one installation to another, exactly once",
    "load": "load topics into a Delta Lake table with Spark, exactly once",
    "topics": "list, describe, create, alter and delete topics; force segment deletion",
    "audit": "check a data directory: offsets, envelopes, dedup state",
    "schemas": "register, list and show schemas of structured log types; set compatibility",
    "bench": "run every benchmark with its peers (all) or one, and print a table",
}


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"ops.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"ops.commands.{name}":
            return None
        raise


def build_parser(
    command: str | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, ModuleType | None]]:
    """The CLI's parser; with ``command``, only that command's module is imported (the
    others are listed with their help text), so ``logbroker read`` does not pay for the
    gateway's and the loader's imports."""
    parser = argparse.ArgumentParser(
        prog="logbroker", description="Exactly-once log collection and delivery."
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, ModuleType | None] = {}
    for name, help_text in SUBCOMMANDS.items():
        sub = subs.add_parser(name, help=help_text, description=help_text)
        parser.set_defaults(**{f"_parser_{name}": sub})
        if command is not None and name != command:
            continue
        module = _load(name)
        modules[name] = module
        if module is not None:
            module.add_arguments(sub)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    stop_signals.install()  # before the imports of build_parser, which take a while
    args_in = sys.argv[1:] if argv is None else argv
    # the command is the first word (the top-level parser has no options but --help)
    command = args_in[0] if args_in and args_in[0] in SUBCOMMANDS else None
    parser, modules = build_parser(command)
    args, unknown = parser.parse_known_args(args_in)
    if unknown:
        # said by the command's own parser, with its usage (not the top-level one)
        own = getattr(args, f"_parser_{args.command}", None) if args.command else None
        (own or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    module = modules[args.command]
    if module is None:
        print(
            f"logbroker {args.command}: not built yet in this version of logbroker",
            file=sys.stderr,
        )
        return 2
    bad_token = _bad_token_source(args)
    if bad_token is not None:
        print(
            f"logbroker {args.command}: {bad_token} holds whitespace or a control character "
            "(a line end of the file it came from?); a bearer token has none",
            file=sys.stderr,
        )
        return 2
    if not getattr(module, "HANDLES_STOP_SIGNALS", False):
        stop_signals.restore_default()
    elif not getattr(module, "HANDLES_RELOAD", False):
        stop_signals.restore_default_reload()
    try:
        result: int = module.run(args)
        sys.stdout.flush()  # here, where a reader that went away can still be told apart
    except BrokenPipeError:
        # `logbroker topics list | head`: the reader has what it wanted; no traceback, and
        # nothing more written (the interpreter's last flush would fail the same way)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return result


def _bad_token_source(args: argparse.Namespace) -> str | None:
    """``--token`` or ``LOGBROKER_TOKEN``, when the command takes a token and the one it
    would use cannot go in an HTTP header: every request would fail on the client's side,
    and the command would blame the gateway ("did not answer").  Token files are checked
    where they are read."""
    if not hasattr(args, "token"):
        return None
    if args.token:
        token, where = args.token, "--token"
    elif getattr(args, "token_file", None) or os.environ.get("LOGBROKER_TOKEN_FILE"):
        return None
    else:
        token, where = os.environ.get("LOGBROKER_TOKEN") or "", "LOGBROKER_TOKEN"
    if any(c.isspace() or not c.isprintable() for c in token):
        return where
    return None


if __name__ == "__main__":
    sys.exit(main())
