"""What a data directory holds, said by the directory itself.

A gateway's data directory records, once, what it is: the store kind (``embedded``: the
store of :mod:`log_store.sqlite_store`; ``kafka``: the local scratch of a Kafka gateway), the
format version of what was written there, and the DC the gateway serves (``--dc``).  The
embedded store keeps them in its catalog (table ``data_dir``, copied with it by a backup);
a Kafka gateway's scratch directory in :data:`KAFKA_SCRATCH_MARKER`.

``logbroker serve`` refuses, before it makes anything there, a directory that is not its own:
a store of another DC (one installation id answering as two DCs fools the mirror's checks),
an embedded store given to ``--store kafka`` (its topics would be hidden, not moved), a Kafka
gateway's scratch given to the embedded store (its writes would go where no other gateway or
reader of the installation looks), a directory of another tool (a push-client's or mirror's
state), and a format newer than this release reads.  A store of an older release, which
recorded nothing, is adopted and recorded when it is opened.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from log_store.errors import ForeignDataDir

FORMAT_VERSION = 1
"""The format this release writes and the newest it reads.  1: the first recorded one (the
catalog's ``data_dir`` and ``deletions`` tables); stores of older releases read as 0."""

EMBEDDED = "embedded"
KAFKA = "kafka"
KAFKA_SCRATCH_MARKER = "logbroker-kafka-gateway.json"
CATALOG = "catalog.db"

_OTHER_TOOLS = {
    "state.json": "a push-client's state directory (--state-dir)",
    "status.json": "a push-client's state directory (--state-dir)",
    "audit-journal": "a push-client's state directory (--state-dir)",
    "mirror-status.json": "a mirror's state directory (--state-dir)",
}


def refuse_newer_format(data_dir: Path, found: int | None) -> None:
    """Raise :class:`ForeignDataDir` if ``found`` is a format newer than this release's."""
    if found is not None and found > FORMAT_VERSION:
        raise ForeignDataDir(
            f"data_dir {data_dir} holds a store of format {found}, written by a newer logbroker "
            f"release; this one reads formats up to {FORMAT_VERSION}: run the newer release "
            "on it (going back to an older release after a format change is not supported)"
        )


def refuse_other_dc(data_dir: Path, kind: str, recorded: str, dc: str) -> None:
    """Raise :class:`ForeignDataDir` if the directory was recorded for another DC."""
    if recorded != dc:
        what = "the embedded store" if kind == EMBEDDED else "the Kafka gateway scratch dir"
        raise ForeignDataDir(
            f"data_dir {data_dir} holds {what} of DC {recorded}, not of --dc {dc}: "
            f"give --dc {recorded}, or another data dir for {dc} (one store answering as "
            "two DCs would fool the mirror's checks)"
        )


def _embedded_topics(data_dir: Path) -> list[str]:
    """The topics an embedded store's catalog names (empty if it cannot be read)."""
    try:
        conn = sqlite3.connect(f"{(data_dir / CATALOG).absolute().as_uri()}?mode=ro", uri=True)
        try:
            return [str(r[0]) for r in conn.execute("SELECT name FROM topics ORDER BY name")]
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def read_kafka_scratch(data_dir: Path) -> dict[str, object] | None:
    """What a Kafka gateway recorded in its scratch directory (None: nothing)."""
    try:
        raw = (data_dir / KAFKA_SCRATCH_MARKER).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ForeignDataDir(
            f"data_dir {data_dir}: cannot read {KAFKA_SCRATCH_MARKER}: {exc}"
        ) from exc
    try:
        found = json.loads(raw)
        if not isinstance(found, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise ForeignDataDir(
            f"data_dir {data_dir}: {KAFKA_SCRATCH_MARKER} is not what a gateway writes ({exc})"
        ) from None
    return found


def check_for_serve(data_dir: Path, kind: str, dc: str) -> None:
    """Raise :class:`ForeignDataDir` (one line) unless a gateway of store ``kind``
    (``sqlite`` or ``kafka``) serving ``dc`` may use ``data_dir``.  The embedded store checks
    its own DC and format when it opens (``SqliteLogStore(dc=...)``)."""
    if not os.path.isdir(data_dir):
        return  # made by the start; a file there is refused by the caller
    has_catalog = os.path.isfile(data_dir / CATALOG)
    scratch = read_kafka_scratch(data_dir)
    if kind == "kafka":
        if has_catalog:
            topics = _embedded_topics(data_dir)
            shown = ", ".join(topics[:3]) + (
                f" and {len(topics) - 3} more" if len(topics) > 3 else ""
            )
            raise ForeignDataDir(
                f"data_dir {data_dir} holds an embedded store with {len(topics)} topic(s)"
                + (f" ({shown})" if topics else "")
                + ": a gateway with --store kafka does not use it, and its topics stay there; "
                'move them to Kafka with `logbroker mirror` (docs/operations.md, "Moving from '
                'the embedded store to Kafka") and give the Kafka gateway another data dir'
            )
        if scratch is not None:
            format_ = scratch.get("format")
            refuse_newer_format(data_dir, format_ if isinstance(format_, int) else None)
            recorded = scratch.get("dc")
            if isinstance(recorded, str):
                refuse_other_dc(data_dir, KAFKA, recorded, dc)
        return
    if scratch is not None and not has_catalog:
        raise ForeignDataDir(
            f"data_dir {data_dir} is the scratch dir of a Kafka gateway (DC {scratch.get('dc')}): "
            "its topics are in Kafka; start it with --store kafka --kafka-bootstrap HOST:PORT, "
            "or give the embedded store another data dir"
        )
    if has_catalog:
        return
    try:
        names = set(os.listdir(data_dir))
    except OSError:
        return  # cannot be looked into: the caller's own checks say why
    tools = sorted(name for name in names if name in _OTHER_TOOLS)
    if tools:
        raise ForeignDataDir(
            f"data_dir {data_dir} holds no logbroker store but {', '.join(tools)}: it is "
            f"{_OTHER_TOOLS[tools[0]]}; give the gateway a directory of its own"
        )
    if "legacy-staging" in names and "topics" not in names:
        raise ForeignDataDir(
            f"data_dir {data_dir} holds legacy-staging/ and no logbroker store: it is the "
            "scratch dir of a Kafka gateway (start it with --store kafka), or a store whose "
            "catalog.db was lost; give the embedded store another data dir"
        )


def record_kafka_scratch(data_dir: Path, dc: str, namespace: str) -> None:
    """Record (once) that ``data_dir`` is a Kafka gateway's scratch for ``dc``."""
    if (data_dir / KAFKA_SCRATCH_MARKER).exists():
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / (KAFKA_SCRATCH_MARKER + ".tmp")
    tmp.write_text(
        json.dumps({"format": FORMAT_VERSION, "kind": KAFKA, "dc": dc, "namespace": namespace})
        + "\n"
    )
    os.replace(tmp, data_dir / KAFKA_SCRATCH_MARKER)
