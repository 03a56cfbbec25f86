"""How the contract suite (and its child processes) open a store of each backend.

A *store spec* names one: a directory for the embedded store, ``kafka://HOST:PORT/NAMESPACE``
for the Kafka backend (a namespace of its own per test, on the session's broker).
"""

from __future__ import annotations

from log_store import LogStore, SqliteLogStore, StoreCapabilities, open_store
from log_store.kafka import KafkaLogStore, KafkaSettings, open_kafka_store

CAPABILITIES: dict[str, StoreCapabilities] = {
    "sqlite": SqliteLogStore.capabilities,
    "kafka": KafkaLogStore.capabilities,
}


def kafka_spec(bootstrap: str, namespace: str) -> str:
    return f"kafka://{bootstrap}/{namespace}"


def open_spec(spec: str) -> LogStore:
    if spec.startswith("kafka://"):
        bootstrap, _, namespace = spec.removeprefix("kafka://").partition("/")
        return open_kafka_store(
            KafkaSettings(bootstrap, namespace=namespace, operation_timeout_s=20.0)
        )
    return open_store(spec)
