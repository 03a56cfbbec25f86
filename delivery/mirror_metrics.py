"""The mirror daemon's Prometheus metrics: what it copied and how far behind the source it is.

Read from :meth:`delivery.mirror.Mirror.progress` at each collection; ``logbroker mirror
--metrics-port`` serves them, ``--graphite`` sends them.  The lag is source offsets not yet
copied per partition, against the source's end offset as its last answer gave it (so it can
be a round behind, never ahead).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from delivery.mirror import Mirror


class MirrorCollector(Collector):
    """prometheus_client collector over one :class:`Mirror`."""

    def __init__(self, mirror: Mirror) -> None:
        self._mirror = mirror

    def collect(self) -> Iterator[Metric]:
        progress = self._mirror.progress()
        lag = GaugeMetricFamily(
            "logbroker_mirror_lag_messages",
            "source messages of a partition not copied to the destination yet",
            labels=("topic", "partition"),
        )
        for (topic, partition), behind in sorted(progress.lag.items()):
            lag.add_metric([topic, str(partition)], float(behind))
        yield lag
        copied = CounterMetricFamily(
            "logbroker_mirror_copied_messages_total",
            "messages copied to the destination, per topic",
            labels=("topic",),
        )
        for topic, count in sorted(progress.copied_by_topic.items()):
            copied.add_metric([topic], float(count))
        yield copied
        yield GaugeMetricFamily(
            "logbroker_mirror_partitions",
            "source partitions this mirror copies",
            value=float(len(progress.lag)),
        )
        yield CounterMetricFamily(
            "logbroker_mirror_source_dropped_offsets_total",
            "source offsets the source's retention dropped before they could be copied",
            value=float(progress.stats.dropped_offsets),
        )
        yield CounterMetricFamily(
            "logbroker_mirror_refused_gaps_total",
            "appends the destination refused because they did not start where it expected",
            value=float(progress.stats.refused_gaps),
        )
