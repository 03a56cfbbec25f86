"""The gateway's metrics: a thin registry over ``prometheus_client``, one view over all workers.

Route modules ask :class:`MetricsRegistry` for counters, gauges and histograms by name and
update them on the hot path (``counter.inc(1, (topic, status))``: a dict lookup and
prometheus_client's own add).  ``/metrics`` renders them in the Prometheus text format 0.0.4.

Several workers: ``logbroker serve --workers N`` makes a directory for the run and names it in
``PROMETHEUS_MULTIPROC_DIR`` before the workers start, so prometheus_client's multiprocess
mode keeps every worker's values in memory-mapped files there and any worker's ``/metrics``
adds them all up.  Each kind of value is combined its own way:

* counters and histograms: summed over every worker that ever ran in this gateway run, so a
  scrape never goes backwards, not even when a worker dies and uvicorn starts another;
* gauges a worker sets or reads from a callback (``read=``): combined by their ``mode`` over
  the workers alive (``livesum`` by default, ``livemax`` for maxima); a callback gauge is read
  in the worker's event loop every :data:`REFRESH_S` seconds and just before it answers a scrape;
* gauges of the whole gateway read from the store (disk space, topics' offsets, consumer lag):
  :meth:`MetricsRegistry.collected_gauge`, read by the worker that answers the scrape and
  never written to the files (each worker would report the same value).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import prometheus_client
from prometheus_client import CollectorRegistry, exposition, multiprocess, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_log = logging.getLogger(__name__)
LabelValues = tuple[str, ...]
GaugeMode = Literal["livesum", "livemax", "livemin", "liveall", "mostrecent"]
"""How a gauge's per-worker values combine (prometheus_client's ``multiprocess_mode``)."""

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = exposition.CONTENT_TYPE_PLAIN_0_0_4
REFRESH_S = 1.0
"""How often a worker refreshes its callback gauges when several workers share the files."""

DEFAULT_LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# ``_created`` samples double every series and mean nothing in multiprocess mode (where
# prometheus_client leaves them out anyway): the text is the same with one worker or many.
prometheus_client.disable_created_metrics()


def multiprocess_enabled() -> bool:
    """Whether this process writes its values to the run's shared directory.

    prometheus_client decides once, when it is first imported, from ``PROMETHEUS_MULTIPROC_DIR``.
    """
    return bool(getattr(values.ValueClass, "_multiprocess", False))


class _Labelled:
    """A prometheus_client metric and its children, one per label set, made on first use."""

    def __init__(self, metric: Any, label_names: Sequence[str]) -> None:
        self.name: str = metric._name
        self.label_names = tuple(label_names)
        self._metric = metric
        self._children: dict[LabelValues, Any] = {}
        if not self.label_names:
            self._children[()] = metric

    def _child(self, labels: LabelValues) -> Any:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._metric.labels(*labels)
        return child


class Counter(_Labelled):
    """A count per label set that only goes up."""

    kind = "counter"

    def __init__(self, metric: prometheus_client.Counter, label_names: Sequence[str]) -> None:
        super().__init__(metric, label_names)
        self.name = metric._name + "_total"

    def inc(self, amount: float = 1.0, labels: LabelValues = ()) -> None:
        self._child(labels).inc(amount)


class Gauge(_Labelled):
    """A value per label set that goes up and down, or one read from a function."""

    kind = "gauge"

    def __init__(
        self,
        metric: prometheus_client.Gauge,
        label_names: Sequence[str],
        read: Callable[[], float] | None,
    ) -> None:
        super().__init__(metric, label_names)
        self._read = read

    def set(self, value: float, labels: LabelValues = ()) -> None:
        self._child(labels).set(value)

    def inc(self, amount: float = 1.0, labels: LabelValues = ()) -> None:
        self._child(labels).inc(amount)

    def dec(self, amount: float = 1.0, labels: LabelValues = ()) -> None:
        self._child(labels).dec(amount)

    def refresh(self) -> None:
        """Store the callback's value now (a gauge without ``read`` keeps what was set)."""
        if self._read is not None:
            self._metric.set(self._read())


class Histogram(_Labelled):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def observe(self, value: float, labels: LabelValues = ()) -> None:
        self._child(labels).observe(value)


Samples = Iterable[tuple[LabelValues, float]]


class _CollectedGauge:
    """A gauge read at scrape time by the process that renders, never stored in the files."""

    def __init__(
        self, name: str, help_text: str, label_names: Sequence[str], read: Callable[[], Samples]
    ) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)
        self.read = read

    def family(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(self.name, self.help, labels=self.label_names)
        for labels, value in self.read():
            family.add_metric([str(v) for v in labels], float(value))
        return family


class _CollectedGauges(Collector):
    def __init__(self) -> None:
        self.gauges: dict[str, _CollectedGauge] = {}

    def collect(self) -> Iterator[Metric]:
        for gauge in list(self.gauges.values()):
            try:
                family = gauge.family()
            except Exception:
                # a store that is down or closing must not hide every other metric
                _log.warning("metric %s could not be read", gauge.name, exc_info=True)
                continue
            yield family


class MultiprocessView(Collector):
    """Every worker's values from the run's directory plus this process's collected gauges.

    Worker processes render it for ``/metrics``; ``logbroker serve`` gives it to the Graphite
    sender in the parent process, which has no values of its own.
    """

    def __init__(self, directory: str, collected: Collector) -> None:
        self.directory = directory
        self._files = multiprocess.MultiProcessCollector(None, directory)
        self._collected = collected

    def collect(self) -> Iterator[Metric]:
        forget_dead_workers(self.directory)
        yield from self._files.collect()
        yield from self._collected.collect()


def forget_dead_workers(directory: str) -> None:
    """Drop the live gauges of workers that died without saying so (SIGKILL, OOM).

    A gauge in a ``live*`` mode adds up only the processes alive; prometheus_client leaves
    it to the supervisor to say which are gone.  Counters and histograms stay: they were
    counted.
    """
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        pid_text = os.path.basename(path).rsplit("_", 1)[1].removesuffix(".db")
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(int(pid_text), directory)
        except PermissionError:
            continue  # alive, another user's


class MetricsRegistry:
    """The metrics of one gateway process, rendered for ``/metrics`` (all workers' sum)."""

    CONTENT_TYPE = CONTENT_TYPE

    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        self._callbacks: list[Gauge] = []
        self._collected = _CollectedGauges()
        self.exposition = CollectorRegistry(auto_describe=False)
        self.multiprocess = multiprocess_enabled()
        if self.multiprocess:
            directory = os.environ.get(MULTIPROC_DIR_ENV, "")
            self.exposition.register(MultiprocessView(directory, self._collected))
        else:
            self.exposition.register(self._collected)

    def _registered(self, name: str, kind: str, label_names: Sequence[str]) -> Any:
        existing = self._metrics.get(name)
        if existing is None:
            if name in self._collected.gauges:
                raise ValueError(f"metric {name} registered twice with another shape")
            return None
        if existing.kind != kind or existing.label_names != tuple(label_names):
            raise ValueError(f"metric {name} registered twice with another shape")
        return existing

    def _target(self) -> CollectorRegistry | None:
        # in multiprocess mode the values travel through the files, not this registry
        return None if self.multiprocess else self.exposition

    def counter(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> Counter:
        existing = self._registered(name, "counter", label_names)
        if existing is not None:
            assert isinstance(existing, Counter)
            return existing
        metric = prometheus_client.Counter(
            name, help_text, labelnames=tuple(label_names), registry=self._target()
        )
        counter = self._metrics[name] = Counter(metric, label_names)
        return counter

    def gauge(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        read: Callable[[], float] | None = None,
        mode: GaugeMode = "livesum",
    ) -> Gauge:
        """A gauge of this process; with ``read`` its (unlabelled) value is read at each render.

        ``mode`` says how workers' values combine: ``livesum`` for things each worker holds
        its share of (sessions, cache entries), ``livemax`` for a largest-of.
        """
        existing = self._registered(name, "gauge", label_names)
        if existing is not None:
            assert isinstance(existing, Gauge)
            return existing
        if read is not None and label_names:
            raise ValueError(f"gauge {name}: a read callback gives one unlabelled value")
        metric = prometheus_client.Gauge(
            name,
            help_text,
            labelnames=tuple(label_names),
            registry=self._target(),
            multiprocess_mode=mode,
        )
        gauge = self._metrics[name] = Gauge(metric, label_names, read)
        if read is not None:
            self._callbacks.append(gauge)
            gauge.refresh()
        return gauge

    def histogram(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S,
    ) -> Histogram:
        existing = self._registered(name, "histogram", label_names)
        if existing is not None:
            assert isinstance(existing, Histogram)
            return existing
        metric = prometheus_client.Histogram(
            name,
            help_text,
            labelnames=tuple(label_names),
            registry=self._target(),
            buckets=tuple(buckets),
        )
        histogram = self._metrics[name] = Histogram(metric, label_names)
        return histogram

    def collected_gauge(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str],
        read: Callable[[], Samples],
    ) -> None:
        """A gauge of the whole gateway, read by ``read() -> [(labels, value)]`` at each scrape.

        For values every worker would read alike (from the store or the disk): they are not
        added up over workers.  ``read`` runs in the thread that renders; it may block.
        """
        if name in self._metrics or name in self._collected.gauges:
            raise ValueError(f"metric {name} registered twice with another shape")
        self._collected.gauges[name] = _CollectedGauge(name, help_text, label_names, read)

    @property
    def collected(self) -> Collector:
        """The scrape-time gauges alone (the parent process of several workers adds them)."""
        return self._collected

    def refresh(self) -> None:
        """Read every callback gauge now; call it where the state it reads is changed."""
        for gauge in self._callbacks:
            gauge.refresh()

    async def refresh_forever(self, interval_s: float = REFRESH_S) -> None:
        """Keep callback gauges current in the shared files (for the other workers' scrapes)."""
        while True:
            self.refresh()
            await asyncio.sleep(interval_s)

    def retire(self) -> None:
        """This worker is stopping: its live gauges stop counting at once."""
        if self.multiprocess:
            with contextlib.suppress(OSError):
                multiprocess.mark_process_dead(os.getpid(), os.environ.get(MULTIPROC_DIR_ENV))

    def render(self, refresh: bool = True) -> bytes:
        """The text format of every metric (every worker's, added up), callbacks read first."""
        if refresh:
            self.refresh()
        return exposition.generate_latest(self.exposition)
