"""The loader tier of the audit: the table's counts, published after every ``logbroker load``.

The instance is named for the table (host and warehouse path), not for the run: its totals
are recounted from the committed table each time, so a later run's totals replace the
earlier ones.  The records go to a gateway's audit topic (``--server``, or ``--audit-server``
when the loader reads a data dir: it never writes into a store it reads).
"""

from __future__ import annotations

import socket
from pathlib import Path

from audit.publisher import AuditPublisher
from audit.records import is_audit_topic
from audit.sinks import HttpAuditSink
from audit.windows import WindowCounts

Counts = dict[tuple[str, int], tuple[int, int]]


def publish_table_counts(counts: Counts, warehouse: Path, *, server: str, token: str | None) -> int:
    """Publish the loader's totals to the gateway at ``server``; returns records written."""
    instance = f"{socket.gethostname()}:{warehouse.resolve()}"
    totals = WindowCounts()
    for (topic, window), (messages, lines) in counts.items():
        if not is_audit_topic(topic):
            totals.set(topic, window, messages, lines)
    sink = HttpAuditSink(server, token=token)
    try:
        return AuditPublisher("loader", instance, totals, sink).publish()
    finally:
        sink.close()
