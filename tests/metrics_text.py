"""Reading Prometheus text the way a scraper does (label order and number format do not matter)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample, or None when the scrape has no such series."""
    return samples(text).get((name, frozenset(labels.items())))


def sample_names(text: str) -> set[str]:
    """The names of every sample of a scrape (``x_bucket``, ``x_count`` ... for histograms)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}
