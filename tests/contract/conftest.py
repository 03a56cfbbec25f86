"""The backends the contract suite runs against, chosen by the capabilities a test needs.

A test marked ``@pytest.mark.requires("store_retention")`` runs on every backend that has the
capability (see ``log_store.interface.StoreCapabilities``) and on no other: what a backend
legitimately does not offer is left out by name, never skipped at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from log_store import LogStore
from tests.contract.backends import CAPABILITIES, kafka_spec, open_spec


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    wanted = [name for m in metafunc.definition.iter_markers("requires") for name in m.args]
    backends = [
        pytest.param(name, marks=[pytest.mark.kafka] if name == "kafka" else [])
        for name, caps in sorted(CAPABILITIES.items())
        if all(getattr(caps, capability) for capability in wanted)
    ]
    metafunc.parametrize("backend", backends)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires(*capabilities): run only on backends with these capabilities"
    )


@pytest.fixture
def store_spec(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where this test's store is: a data dir, or a namespace on the session's Kafka."""
    if backend == "kafka":
        cluster = request.getfixturevalue("kafka_cluster")
        return kafka_spec(cluster.bootstrap, request.getfixturevalue("kafka_namespace"))
    return str(tmp_path / "data")


@pytest.fixture
def open_backend(store_spec: str) -> Iterator[Callable[[], LogStore]]:
    """Opens stores of the backend on one data dir (or namespace); all closed at the end."""
    opened: list[LogStore] = []

    def _open() -> LogStore:
        store = open_spec(store_spec)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_backend: Callable[[], LogStore]) -> LogStore:
    return open_backend()
