"""The loader tier of the audit: the table's counts, published after every ``logbroker load``.

The instance is named for the table (host and warehouse path), not for the run: its totals
are recounted from the committed table each time, so a later run's totals replace the
earlier ones.  With ``--server`` the records go to that gateway's audit topic; with
``--data-dir`` into the store's ``<dc>.logbroker-audit`` of each counted topic's DC.
"""

from __future__ import annotations

import socket
from collections import defaultdict
from pathlib import Path

from audit.publisher import AuditPublisher
from audit.records import is_audit_topic
from audit.sinks import HttpAuditSink, StoreAuditSink
from audit.windows import WindowCounts
from log_store import open_store
from session_dedup.exactly_once import ExactlyOnceWriter

AUDIT_TOPIC_PARTITIONS = 4
Counts = dict[tuple[str, int], tuple[int, int]]


def publish_table_counts(
    counts: Counts,
    warehouse: Path,
    *,
    server: str | None,
    data_dir: str | None,
    token: str | None,
) -> int:
    """Publish the loader's totals; returns how many records were written."""
    instance = f"{socket.gethostname()}:{warehouse.resolve()}"
    by_dc: dict[str, WindowCounts] = defaultdict(WindowCounts)
    for (topic, window), (messages, lines) in counts.items():
        if not is_audit_topic(topic):
            by_dc[topic.split(".", 1)[0]].set(topic, window, messages, lines)
    written = 0
    if server is not None:
        merged = WindowCounts()
        for dc_counts in by_dc.values():
            for (topic, window), (messages, lines) in dc_counts.snapshot().items():
                merged.set(topic, window, messages, lines)
        sink = HttpAuditSink(server, token=token)
        try:
            written += AuditPublisher("loader", instance, merged, sink).publish()
        finally:
            sink.close()
        return written
    assert data_dir is not None
    with open_store(Path(data_dir)) as store:
        for dc, dc_counts in sorted(by_dc.items()):
            writer = ExactlyOnceWriter(store, dc=dc, partitions=AUDIT_TOPIC_PARTITIONS)
            written += AuditPublisher(
                "loader", instance, dc_counts, StoreAuditSink(writer)
            ).publish()
    return written
