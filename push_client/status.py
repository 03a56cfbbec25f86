"""``logbroker push --status``: what the daemon shipped and how far behind each file is.

The daemon looks at what ``status.json`` in its state directory would show every second: it
rewrites the file when that changed (``changed_at``) and else only touches it, so the file's
modification time says when the daemon last found it current.  ``--status`` reads it and
measures each file again (its size now), so the lag it prints is current even between two
updates of the file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import orjson

from log_store.errors import LogbrokerError
from push_client.identity import display_path
from push_client.partition_outage import waits_for

if TYPE_CHECKING:
    from push_client.files import Unreadable
    from push_client.handover import Doubt, Overlap
    from push_client.installations import InstallationSet
    from push_client.parking import Refusal
    from push_client.partition_outage import PartitionOutage
    from push_client.tailer import PathError, TailedFile

STATUS_NAME = "status.json"


class NoStatus(LogbrokerError):
    """The state directory holds no status document that can be read."""


def _phase(tailed: TailedFile) -> str:
    if tailed.parked is not None:
        return "parked"
    if tailed.outage is not None:
        return "waiting"
    if tailed.handover.census:
        return "census"
    return tailed.phase.value if tailed.session_ready else "opening"


class _Shown(NamedTuple):
    """Everything a file's status row shows, as plain values: compared as a tuple (cheap),
    read by name."""

    path: str
    source_id: str
    log_type: str
    topic: str
    partition: int
    phase: str
    dev: int
    ino: int
    acked: int
    size: int
    pending_since: float | None
    installation: str
    parked: tuple[Refusal, float] | None
    """The refusal that parks it, and since when (wall clock)."""
    doubts: tuple[Doubt, ...]
    retrying: str
    """The last refusal that may pass; "" when none."""
    waiting_for: tuple[str, ...]
    """The installations whose position of the file is waited for."""
    path_error: PathError | None
    unterminated: int
    outage: tuple[str, int, str, float, float, bool] | None
    """Its partition without a reachable owner: topic, partition, the gateway's reason, since
    when and the next try (wall clock), and whether that partition holds its pin (not its
    data)."""
    overlaps: tuple[Overlap, ...]
    """Ranges found in two installations (written twice) in this run."""


def _shown(tailed: TailedFile) -> _Shown:
    """What ``tailed``'s status row shows now."""
    parked = tailed.parked
    outage = tailed.outage
    plan = tailed.handover
    # Positional, in the fields' order: with keywords the call costs 2.7 times as much
    # (1.3 against 0.47 us on Python 3.11), for every file every second.
    return _Shown(
        tailed.path,
        tailed.source_id,
        tailed.entry.log_type,
        tailed.topic,
        tailed.partition,
        _phase(tailed),
        tailed.identity.dev,
        tailed.identity.ino,
        tailed.settled,
        tailed.size,
        tailed.pending_since,
        tailed.session_installation or plan.installation,
        None if parked is None else (parked.refusal, parked.since),
        tuple(plan.doubts) if plan.doubts else (),
        tailed.session_refusal,
        tuple(sorted(plan.census)) if plan.census else (),
        tailed.path_error,
        tailed.unterminated,
        None if outage is None else _outage(outage, tailed in outage.pin_files),
        tuple(plan.overlaps) if plan.overlaps else (),
    )


def _outage(outage: PartitionOutage, pin: bool) -> tuple[str, int, str, float, float, bool]:
    return (outage.topic, outage.partition, outage.reason, outage.since, outage.retry_wall, pin)


def _row(shown: _Shown) -> dict[str, Any]:
    """The status row of a file from :func:`_shown`'s values (and nothing else, so that a
    row kept while those values stay the same is what it would be built again)."""
    parked = shown.parked
    path_error = shown.path_error
    row = {
        # printable text: JSON holds no undecodable bytes (a Latin-1 name), and a name with
        # a newline would break the table of --status
        "path": display_path(shown.path),
        "source_id": shown.source_id,
        "log_type": shown.log_type,
        "topic": shown.topic,
        "partition": shown.partition,
        "phase": shown.phase,
        "dev": shown.dev,
        "ino": shown.ino,
        "acked": shown.acked,
        "size": shown.size,
        "pending_since": shown.pending_since,
        "installation": shown.installation,
        "parked": None if parked is None else _parked_row(*parked),
        "doubts": [d.as_list() for d in shown.doubts],
        "retrying": shown.retrying or None,
        "waiting_for": list(shown.waiting_for),
        "path_error": None
        if path_error is None
        else {"error": path_error.error, "errno": path_error.errno, "since": path_error.since},
    }
    if shown.unterminated:
        row["unterminated"] = shown.unterminated  # only then: most files end with a newline
    if shown.overlaps:
        row["overlaps"] = [o.as_list() for o in shown.overlaps]  # only then: rare
    if shown.outage is not None:
        topic, partition, reason, since, next_try_at, pin = shown.outage
        waiting: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "reason": reason,
            "since": since,
            "next_try_at": next_try_at,
        }
        if pin:
            waiting["holds_pin"] = True  # only then: not the partition of the file's data
        row["partition_outage"] = waiting
    return row


def _parked_row(refusal: Refusal, since: float) -> dict[str, Any]:
    return {
        "status": refusal.status,
        "error": refusal.error,
        "reason": refusal.reason,
        "since": since,
    }


def file_row(tailed: TailedFile) -> dict[str, Any]:
    """What ``status.json`` shows of a tailed file."""
    return _row(_shown(tailed))


class FileRows:
    """The status rows of the tailed files, each built again only when what it shows
    changed: an idle client with a thousand files compares their values every second
    instead of building (and serializing) a thousand rows."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[_Shown, dict[str, Any]]] = {}

    def rows(self, files: list[TailedFile]) -> list[dict[str, Any]]:
        """The rows of ``files``; a row is never changed once returned (readers keep them)."""
        known = self._known
        now: dict[int, tuple[_Shown, dict[str, Any]]] = {}
        out = []
        for tailed in files:
            shown = _shown(tailed)
            last = known.get(id(tailed))
            row = last[1] if last is not None and last[0] == shown else _row(shown)
            now[id(tailed)] = (shown, row)
            out.append(row)
        self._known = now
        return out


def unreadable_row(miss: Unreadable) -> dict[str, Any]:
    """A file (or a directory of an entry) that cannot be read: what ``status.json`` lists
    under ``unreadable``; ``size`` and ``lag_bytes`` are None when it cannot be looked at."""
    lag_bytes = miss.lag_bytes
    return {
        "path": display_path(miss.path),
        "log_type": miss.log_type,
        "phase": "unreadable",
        "error": miss.error,
        "errno": miss.errno,
        "since": miss.since,
        "acked": miss.acked,
        "size": miss.size,
        "lag_bytes": lag_bytes,
        "pending_since": miss.since if lag_bytes else None,
    }


def installation_rows(
    installations: InstallationSet, failing: dict[str, list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    """The installations, each with its gateways that fail now (``failing``, by name)."""
    current = installations.current()
    return [
        {
            "name": m.name,
            "servers": list(m.spec.servers),
            "up": m.up,
            "current": m is current,
            "last_error": m.last_error,
            "next_probe_at": installations.next_probe_at(m),
            "failing_gateways": (failing or {}).get(m.name, []),
            # only while it is up, idle and its probes fail (see push_client.installations)
            **({"unanswered_since": m.unanswered_since} if m.up and m.unanswered_since else {}),
        }
        for m in installations.members
    ]


def gateway_errors(
    failing: dict[str, list[dict[str, Any]]], recoveries: list[dict[str, Any] | None]
) -> dict[str, Any]:
    """The status's ``last_error`` (of a gateway failing now; "" when none fails),
    ``last_error_at``, and ``last_recovery`` (when none fails: the last gateway that
    answered again, and since when it had failed).

    Only what is true now: an error of a gateway that answers again is not shown as the
    last error (it was, until another error replaced it, whatever answered since).
    """
    now_failing = [gw for gateways in failing.values() for gw in gateways]
    latest = max(now_failing, key=lambda gw: gw["tried_at"], default=None)
    recovered = [r for r in recoveries if r is not None]
    return {
        "last_error": "" if latest is None else latest["outcome"],
        "last_error_at": 0.0 if latest is None else latest["tried_at"],
        "last_recovery": None
        if latest is not None
        else max(recovered, key=lambda r: r["recovered_at"], default=None),
    }


def status_content(
    *,
    pid: int,
    running: bool,
    started_at: float,
    servers: list[str],
    installations: list[dict[str, Any]],
    errors: dict[str, Any],
    files: list[dict[str, Any]],
    unreadable: list[dict[str, Any]] | None = None,
    token_problem: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the status shows: compared with the last one to know whether it changed."""
    return {
        "token_problem": token_problem,
        "pid": pid,
        "running": running,
        "started_at": started_at,
        "servers": servers,
        "installations": installations,
        **errors,
        "files": files,
        "unreadable": unreadable or [],
    }


def status_document(
    content: dict[str, Any], changed_at: float, checked_at: float | None = None
) -> bytes:
    """The status as JSON: ``content``, when it last changed (``changed_at``) and, for a
    reader that cannot see the file's time (the ``/status`` endpoint), when the daemon last
    found it current (``checked_at``; the file's modification time says that)."""
    times = {"changed_at": changed_at}
    if checked_at is not None:
        times["checked_at"] = checked_at
    return orjson.dumps({**content, **times})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_ENDED_PHASES = ("closing", "done")
"""Phase.CLOSING and Phase.DONE (by value: --status does not import the tailer)."""


def current_lag(row: dict[str, Any], now: float) -> tuple[int, int, float]:
    """(size now, lag in bytes, lag in seconds) of one status row."""
    size = int(row["size"])
    try:
        # A source closed by a truncation ends where it was read to, whatever the file at
        # its path (the same inode, with a copytruncate) holds now.
        if row.get("phase") not in _ENDED_PHASES:
            st = os.stat(row["path"])
            if (st.st_dev, st.st_ino) == (row["dev"], row["ino"]):
                size = st.st_size
    except OSError:
        pass  # the file is gone: its size stays unknown in the report
    lag_bytes = max(0, size - int(row["acked"]))
    since = row.get("pending_since")
    if lag_bytes and since is None:
        since = now
    lag_s = max(0.0, now - since) if lag_bytes and since is not None else 0.0
    return size, lag_bytes, lag_s


def read_status(state_dir: Path) -> dict[str, Any]:
    """The last status the daemon published, with lags measured now.

    Raises :class:`NoStatus` when there is none or it cannot be read.
    """
    path = state_dir / STATUS_NAME
    try:
        with path.open("rb") as f:
            doc: dict[str, Any] = orjson.loads(f.read())
            checked_at = os.fstat(f.fileno()).st_mtime
    except FileNotFoundError as exc:
        raise NoStatus(f"no status in {state_dir} (has the client run there?)") from exc
    except OSError as exc:
        raise NoStatus(f"cannot read {path}: {exc.strerror}") from exc
    except orjson.JSONDecodeError as exc:
        raise NoStatus(f"{path} is damaged ({exc}); the client writes it whole, by rename") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), list):
        raise NoStatus(f"{path} is not a status document")
    now = time.time()
    # The daemon rewrites the file when what it shows changes and touches it every second:
    # its modification time is when the daemon last found it current.  (A status of an
    # older version has updated_at, rewritten every second, instead of both.)
    doc["checked_at"] = checked_at
    doc.setdefault("changed_at", doc.get("updated_at", checked_at))
    doc["running"] = bool(doc.get("running")) and _alive(int(doc.get("pid", 0)))
    for row in doc["files"]:
        row["size"], row["lag_bytes"], row["lag_s"] = current_lag(row, now)
    return doc


def _code(error: dict[str, Any]) -> str:
    """`` [EACCES]``: an error's errno as --status shows it after the message ("" if none;
    a status of an older client has none)."""
    code = error.get("errno")
    return f" [{code}]" if code else ""


def _topic_partition(row: dict[str, Any]) -> str:
    """``dc1.app/3``, or ``-`` while the file has no partition (parked, opening)."""
    if not row.get("topic") or int(row.get("partition", -1)) < 0:
        return "-"
    return f"{row['topic']}/{row['partition']}"


def _next_probe(at: float, now: float) -> str:
    if at <= now:
        return "probe due"
    return f"next probe in {at - now:.{0 if at - now >= 10 else 1}f} s"


def print_status(doc: dict[str, Any], out: TextIO) -> None:
    now = time.time()
    checked = now - float(doc["checked_at"])
    changed = now - float(doc["changed_at"])
    state = f"running (pid {doc['pid']})" if doc["running"] else "not running"
    out.write(
        f"logbroker push: {state}; status checked {checked:.1f} s ago, "
        f"changed {changed:.1f} s ago\n"
    )
    out.write(f"servers: {', '.join(doc['servers'])}\n")
    installations = doc.get("installations", [])
    if len(installations) > 1:
        for inst in installations:
            state = "up"
            if inst["up"] and inst.get("unanswered_since") is not None:
                when = time.strftime("%H:%M:%S", time.localtime(inst["unanswered_since"]))
                state = f"up, NOT ANSWERING since {when} (idle; probed, no gateway answers)"
            if not inst["up"]:
                at = inst.get("next_probe_at")
                probe = "" if at is None else f"; {_next_probe(at, now)}"
                state = f"DOWN ({inst.get('last_error', '')[:120]}{probe})"
            mark = " <- writing here" if inst["current"] else ""
            out.write(f"installation {inst['name']}: {state}{mark}\n")
    for inst in installations:
        for gw in inst.get("failing_gateways", []):
            when = time.strftime("%H:%M:%S", time.localtime(gw["since"]))
            where = f" of {inst['name']}" if len(installations) > 1 else ""
            if not inst.get("up", True):
                use = "its installation is down"
            elif gw["current"]:
                use = "retrying"
            else:
                use = "not in use while another gateway of it answers"
            tried = ""
            if "tried_at" in gw:
                by = " by a probe" if gw.get("tried_by") == "probe" else ""
                tried = f"last tried {max(0.0, now - gw['tried_at']):.0f} s ago{by}; "
            if gw.get("next_probe_at") is not None:
                tried += f"{_next_probe(gw['next_probe_at'], now)}; "
            out.write(
                f"GATEWAY FAILING {gw['server']}{where} since {when}: {gw['error']} "
                f"({gw['retries']} failures; {tried}{use})\n"
            )
    if doc.get("last_error"):
        when = time.strftime("%H:%M:%S", time.localtime(doc["last_error_at"]))
        out.write(f"last error ({when}): {doc['last_error'][:200]}\n")
    elif doc.get("last_recovery"):
        back = doc["last_recovery"]
        out.write(
            f"no gateway fails: {back['server']} answers again since "
            f"{time.strftime('%H:%M:%S', time.localtime(back['recovered_at']))} (failing "
            f"from {time.strftime('%H:%M:%S', time.localtime(back['failing_since']))})\n"
        )
    token = doc.get("token_problem")
    if token:
        when = time.strftime("%H:%M:%S", time.localtime(token["since"]))
        out.write(
            f"TOKEN FILE NOT USED since {when}: {token['error']} (requests go "
            f"{token.get('requests_go', 'with the token read last')})\n"
        )
    for r in doc.get("unreadable", []):
        when = time.strftime("%H:%M:%S", time.localtime(r["since"]))
        lag = r.get("lag_bytes")
        behind = "; size unknown" if lag is None else f"; {lag} bytes behind"
        out.write(
            f"UNREADABLE {r['path']} since {when}: {r['error']}{_code(r)} (not shipped{behind})\n"
        )
    files = doc["files"]
    # What an unreadable file owes is lag too: left out, a host with one showed "total lag 0".
    unreadable = doc.get("unreadable", [])
    owed = sum(r.get("lag_bytes") or 0 for r in unreadable)
    total = sum(r["lag_bytes"] for r in files) + owed
    line = f"{len(files)} files, total lag {total} bytes"
    if unreadable:
        unknown = sum(1 for r in unreadable if r.get("lag_bytes") is None)
        sizes = f", {unknown} of them of unknown size" if unknown else ""
        noun = "file" if len(unreadable) == 1 else "files"
        line += f" ({owed} of them in {len(unreadable)} unreadable {noun}{sizes})"
    out.write(line + "\n")
    if not files:
        return
    width = max(len(r["path"]) for r in files)
    out.write(
        f"{'FILE':<{width}}  {'PHASE':<9} {'ACKED':>14} {'SIZE':>14} {'LAG_BYTES':>12} "
        f"{'LAG_S':>8}  TOPIC/PARTITION\n"
    )
    for r in sorted(files, key=lambda r: r["path"]):
        out.write(
            f"{r['path']:<{width}}  {r['phase']:<9} {r['acked']:>14} {r['size']:>14} "
            f"{r['lag_bytes']:>12} {r['lag_s']:>8.1f}  {_topic_partition(r)}\n"
        )
    for r in sorted(files, key=lambda r: r["path"]):
        parked = r.get("parked")
        if parked:
            when = time.strftime("%H:%M:%S", time.localtime(parked["since"]))
            out.write(
                f"PARKED {r['path']} since {when}: HTTP {parked['status']} "
                f"{parked['error']}: {parked['reason'][:200]}\n"
            )
        for name, start, end in r.get("doubts", []):
            out.write(
                f"IN DOUBT {r['path']}: bytes {start}..{end} sent to {name}, which went down "
                "before answering; held until it is back\n"
            )
        for name, elsewhere, start, end in r.get("overlaps", []):
            out.write(
                f"OVERLAP {r['path']}: bytes {start}..{end} are in both {name} and {elsewhere} "
                f"(written twice: the positions were older than {name}'s log)\n"
            )
        if r.get("path_error"):
            when = time.strftime("%H:%M:%S", time.localtime(r["path_error"]["since"]))
            out.write(
                f"CANNOT STAT {r['path']} since {when}: {r['path_error']['error']}"
                f"{_code(r['path_error'])} (read on "
                "through its open descriptor; a rotation is not noticed until it can be)\n"
            )
        outage = r.get("partition_outage")
        if outage:
            when = time.strftime("%H:%M:%S", time.localtime(outage["since"]))
            wait = max(0.0, outage["next_try_at"] - now)
            where = waits_for(
                f"{outage['topic']}/{outage['partition']}",
                bool(outage.get("holds_pin")),
                r.get("topic", ""),
                r.get("partition", -1),
            ).removeprefix("partition ")
            out.write(
                f"PARTITION UNAVAILABLE {r['path']}: {where} "
                f"has no reachable owner since {when} ({outage['reason'][:200]}); this file "
                f"waits, next try in {wait:.0f} s; the other files ship on\n"
            )
        if r.get("retrying"):
            out.write(f"RETRYING {r['path']}: the gateway cannot take it now: {r['retrying']}\n")
        if r.get("unterminated"):
            out.write(
                f"NO NEWLINE YET {r['path']}: its last {r['unterminated']} bytes are a line "
                "not ended yet; sent once it ends (or the file is let go after a rotation)\n"
            )
        if r.get("waiting_for"):
            out.write(
                f"WAITING {r['path']}: for {', '.join(r['waiting_for'])} to say how far it "
                "holds this file\n"
            )
