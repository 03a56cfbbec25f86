"""A small Prometheus registry: counters, gauges and histograms rendered as text format 0.0.4.

Hand-written so that the hot path costs one dict lookup and an add.  Each uvicorn worker has
its own registry; with several workers ``/metrics`` shows the worker that answered.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Sequence

LabelValues = tuple[str, ...]

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: LabelValues, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value):
        return str(int(value))
    return repr(value)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(label_names)
        self._lock = threading.Lock()

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, label_names)
        self._values: dict[LabelValues, float] = {}

    def inc(self, amount: float = 1.0, labels: LabelValues = ()) -> None:
        # a lost update between threads would under-count; the lock is cheap next to a request
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, labels: LabelValues = ()) -> float:
        return self._values.get(labels, 0.0)

    def render(self) -> list[str]:
        lines = self.header()
        with self._lock:
            items = sorted(self._values.items())
        for labels, value in items:
            lines.append(f"{self.name}{_labels(self.label_names, labels)} {_number(value)}")
        return lines


class Gauge(Counter):
    """A value that goes up and down per label set, or one read from a function at render."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        read: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(name, help_text, label_names)
        self._read = read

    def render(self) -> list[str]:
        if self._read is not None:
            self.set(self._read())
        return super().render()

    def set(self, value: float, labels: LabelValues = ()) -> None:
        with self._lock:
            self._values[labels] = value

    def dec(self, amount: float = 1.0, labels: LabelValues = ()) -> None:
        self.inc(-amount, labels)


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S,
    ) -> None:
        super().__init__(name, help_text, label_names)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[LabelValues, list[int]] = {}
        self._sums: dict[LabelValues, float] = {}

    def observe(self, value: float, labels: LabelValues = ()) -> None:
        index = bisect.bisect_left(self.buckets, value)
        with self._lock:
            counts = self._counts.get(labels)
            if counts is None:
                counts = self._counts[labels] = [0] * (len(self.buckets) + 1)
                self._sums[labels] = 0.0
            counts[index] += 1
            self._sums[labels] += value

    def count(self, labels: LabelValues = ()) -> int:
        return sum(self._counts.get(labels, ()))

    def render(self) -> list[str]:
        lines = self.header()
        with self._lock:
            items = sorted((k, list(v), self._sums[k]) for k, v in self._counts.items())
        for labels, counts, total in items:
            cumulative = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                cumulative += n
                le = f'le="{_number(bound)}"'
                lines.append(
                    f"{self.name}_bucket{_labels(self.label_names, labels, le)} {cumulative}"
                )
            lab = _labels(self.label_names, labels)
            lines.append(f"{self.name}_sum{lab} {_number(total)}")
            lines.append(f"{self.name}_count{lab} {cumulative}")
        return lines


class MetricsRegistry:
    """Holds the metrics of one process and renders them for ``/metrics``."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> _Metric:
        existing = self._metrics.get(metric.name)
        if existing is not None:
            if type(existing) is not type(metric) or existing.label_names != metric.label_names:
                raise ValueError(f"metric {metric.name} registered twice with another shape")
            return existing
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_text: str, label_names: Sequence[str] = ()) -> Counter:
        metric = self._add(Counter(name, help_text, label_names))
        assert isinstance(metric, Counter)
        return metric

    def gauge(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        read: Callable[[], float] | None = None,
    ) -> Gauge:
        """A gauge; with ``read`` its (unlabelled) value is read at each render."""
        metric = self._add(Gauge(name, help_text, label_names, read))
        assert isinstance(metric, Gauge)
        return metric

    def histogram(
        self,
        name: str,
        help_text: str,
        label_names: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S,
    ) -> Histogram:
        metric = self._add(Histogram(name, help_text, label_names, buckets))
        assert isinstance(metric, Histogram)
        return metric

    def render(self) -> bytes:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return ("\n".join(lines) + "\n").encode()
