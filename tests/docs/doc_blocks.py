"""The shell blocks of the project's Markdown, and how the docs test runs them.

Every fenced block whose info string is ``sh`` in ``README.md`` and ``docs/*.md`` is a command
a reader may copy, and is run by ``tests/docs/test_docs_commands.py``.  Other blocks
(``text``, ``toml``, ``json``, ``python``, ``sql``, or no language) show formats, layouts and
output, and are not run.  An HTML comment on the line before a shell block says how to run
it, when the default (run to the end, exit 0, within five minutes) does not fit:

``<!-- docs-test: background -->``
    a daemon: started, left running while the file's later blocks run, then stopped with
    SIGTERM, and it must still be alive then.  A ``logbroker serve`` in it is waited for.
``<!-- docs-test: stop-after 20 expect "text" -->``
    a command that follows (a reader, a push-client, the quick start): interrupted with SIGINT
    after that many seconds; it must have printed ``text`` (stdout or stderr) by then.
``<!-- docs-test: exit 2 -->``
    a command shown failing on purpose, with this exit code.
``<!-- docs-test: not run: reason -->``
    not run, for the reason given (the test lists these reasons, so they stay few and honest).

The names a reader would adapt stand for things the test provides (:data:`HOST_URLS`,
:data:`KAFKA_BOOTSTRAPS`, :data:`SANDBOXED_ROOTS`): a block naming ``http://gw1:8080`` talks to
a real gateway of the test, ``/var/lib/logbroker`` is that gateway's data dir in a scratch
directory, ``kafka1:9092`` is the test session's Apache Kafka broker.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

HOST_URLS = {
    "dc1": ("gw", "gw1", "gw2", "localhost", "127.0.0.1", "dc1-gw", "a", "b"),
    "dc2": ("dc2-gw", "c"),
}
"""Gateway host names used in the docs, by the data center whose gateway answers them."""
KAFKA_BOOTSTRAPS = ("kafka1:9092,kafka2:9092,kafka3:9092", "kafka1:9092")
SANDBOXED_ROOTS = ("/var/lib/", "/var/log/", "/etc/logbroker/", "/data/", "/shared/", "/srv/")
"""Absolute paths in the docs that live under the test's scratch directory instead."""

_FENCE = re.compile(r"^```(\S*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class ShellBlock:
    path: Path
    line: int
    """1-based line of the opening fence."""
    text: str
    mode: str = "run"
    """``run``, ``background``, ``stop-after``, ``not-run``."""
    seconds: float = 300.0
    expect: str | None = None
    exit_code: int = 0
    reason: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def parse_directive(text: str, path: Path, line: int) -> dict[str, object]:
    if text.startswith("not run:"):
        reason = text.removeprefix("not run:").strip()
        if not reason:
            raise ValueError(f"{path}:{line}: 'not run:' needs a reason")
        return {"mode": "not-run", "reason": reason}
    words = shlex.split(text)
    if words == ["background"]:
        return {"mode": "background"}
    if len(words) == 2 and words[0] == "exit":
        return {"exit_code": int(words[1])}
    if len(words) == 4 and words[0] == "stop-after" and words[2] == "expect":
        return {"mode": "stop-after", "seconds": float(words[1]), "expect": words[3]}
    raise ValueError(f"{path}:{line}: unknown docs-test directive {text!r}")


def shell_blocks(path: Path) -> list[ShellBlock]:
    """The ``sh`` blocks of one Markdown file, in order, with their directives."""
    lines = path.read_text().splitlines()
    blocks: list[ShellBlock] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if fence.group(1) != "sh":
            continue
        options: dict[str, object] = {}
        previous = lines[start - 1] if start > 0 else ""
        directive = _DIRECTIVE.match(previous)
        if directive is not None:
            options = parse_directive(directive.group(1), path, start)
        blocks.append(ShellBlock(path, start + 1, "\n".join(body) + "\n", **options))  # type: ignore[arg-type]
    return blocks


def adapt(text: str, urls: dict[str, str], sandbox: Path, kafka: str | None) -> str:
    """The block with the docs' stand-in names replaced by what the test runs."""
    for dc, hosts in HOST_URLS.items():
        for host in hosts:
            text = re.sub(rf"http://{re.escape(host)}:8080(?![\w.-])", urls[dc], text)
    if kafka is not None:
        for bootstrap in KAFKA_BOOTSTRAPS:
            text = text.replace(bootstrap, kafka)
    for root in SANDBOXED_ROOTS:
        text = re.sub(rf"(?<![\w./-]){re.escape(root)}", f"{sandbox}{root}", text)
    return text


OWN_PIDS_VARIABLE = "LOGBROKER_DOCS_OWN_PIDS"
_OWN_PKILL = r"""pkill() {  # the docs test's: signals only the page's own daemons
    local signal=-TERM pattern="" matched pid hit=""
    while [ $# -gt 0 ]; do
        case "$1" in -f) ;; -*) signal="$1" ;; *) pattern="$1" ;; esac
        shift
    done
    matched=$(pgrep -f -- "$pattern" || true)
    for pid in $LOGBROKER_DOCS_OWN_PIDS; do
        if grep -qx -- "$pid" <<<"$matched"; then kill "$signal" "$pid"; hit=1; fi
    done
    if [ -z "$hit" ]; then
        echo "pkill -f '$pattern' matches none of the page's daemons" \
            "($LOGBROKER_DOCS_OWN_PIDS; it matches: ${matched:-nothing})" >&2
        return 1
    fi
}
"""


def confine_pkill(text: str) -> str:
    """The block, with ``pkill`` signalling only the page's own daemons (the pids in
    ``$LOGBROKER_DOCS_OWN_PIDS``) that its pattern matches, and failing if it matches none.

    The real ``pkill -f`` signals every process of the host whose command line matches: in a
    parallel test run, other tests' push-clients too (one died of a SIGHUP it got while
    starting).  The pattern is still checked: it must match the daemon the page started.
    """
    return _OWN_PKILL + text if re.search(r"(?<![\w-])pkill\b", text) else text


def needs_kafka(blocks: list[ShellBlock]) -> bool:
    return any(b.mode != "not-run" and any(k in b.text for k in KAFKA_BOOTSTRAPS) for b in blocks)
