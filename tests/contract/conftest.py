"""The backends the contract suite runs against.  Each new backend adds itself here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from log_store import LogStore, open_store

StoreFactory = Callable[[Path], LogStore]

BACKENDS: dict[str, StoreFactory] = {"sqlite": open_store}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_backend(backend: str, tmp_path: Path) -> Iterator[Callable[[], LogStore]]:
    """Opens stores of the backend on one data dir; all are closed at the end."""
    opened: list[LogStore] = []

    def _open() -> LogStore:
        store = BACKENDS[backend](tmp_path / "data")
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_backend: Callable[[], LogStore]) -> LogStore:
    return open_backend()
