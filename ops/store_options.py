"""The Kafka options of commands that open a log store directly (``topics``, ``audit``).

``--data-dir DIR`` opens the embedded store; ``--kafka-bootstrap HOST:PORT`` (``--store kafka``
may be said too; with ``--kafka-namespace`` and ``--kafka-property KEY=VALUE`` for TLS/SASL)
opens the Kafka backend.  A command opening Kafka this way writes nothing unless asked to
(``audit`` and ``topics list``/``describe`` only read: they replay changelogs, so they never
fence a gateway).  A cluster no broker of which answers within a few seconds is one line,
``cannot reach Kafka at HOST:PORT: why``; librdkafka's own lines go to the Python logger at
DEBUG, not to stderr.
"""

from __future__ import annotations

import argparse
from types import MappingProxyType
from typing import Any

from log_store import LogStore, open_store
from log_store.errors import BadRequest


def add_kafka_arguments(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--store``, ``--kafka-*``; with ``suppress`` a later parser does not reset them."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--store",
        choices=("sqlite", "kafka"),
        default=default(None),
        help="the backend: sqlite (with --data-dir) or kafka (implied by --kafka-bootstrap)",
    )
    parser.add_argument(
        "--kafka-bootstrap", metavar="HOST:PORT", default=default(None), help="Kafka servers"
    )
    parser.add_argument(
        "--kafka-namespace", default=default(""), help="the gateways' kafka_namespace"
    )
    parser.add_argument(
        "--kafka-property",
        action="append",
        default=default([]),
        metavar="KEY=VALUE",
        help="a librdkafka property (TLS, SASL), repeatable",
    )


def store_kind(args: argparse.Namespace) -> str:
    """``kafka`` or ``sqlite``: ``--store``, or ``kafka`` when only ``--kafka-bootstrap`` is
    given."""
    store = getattr(args, "store", None)
    return store or ("kafka" if getattr(args, "kafka_bootstrap", None) else "sqlite")


def open_store_from_args(
    args: argparse.Namespace, *, create: bool = False, read_only: bool = False
) -> LogStore:
    """The store the arguments name; ``BadRequest`` if they name none.

    ``create`` lets the embedded store be made where there is none (``topics create``).
    ``read_only`` (commands that only read: ``audit``, ``topics list``/``describe``) opens the
    embedded store through ``mode=ro`` connections that create and change nothing, so a store
    on a read-only file system (or a snapshot mounted for inspection) can still be looked at.
    """
    if getattr(args, "store", None) == "sqlite" and args.kafka_bootstrap:
        raise BadRequest("--kafka-bootstrap goes with --store kafka, not --store sqlite")
    if store_kind(args) == "kafka":
        from log_store.kafka import KafkaSettings, open_kafka_store
        from log_store.kafka.bootstrap import check_reachable

        if not args.kafka_bootstrap:
            raise BadRequest("--store kafka needs --kafka-bootstrap HOST:PORT")
        properties = {}
        for item in args.kafka_property:
            key, sep, value = item.partition("=")
            if not sep:
                raise BadRequest(f"--kafka-property {item!r} is not KEY=VALUE")
            properties[key] = value
        settings = KafkaSettings(
            args.kafka_bootstrap,
            namespace=args.kafka_namespace,
            properties=MappingProxyType(properties),
            librdkafka_log="debug",
        )
        check_reachable(settings)
        return open_kafka_store(settings)
    if not args.data_dir:
        raise BadRequest("give --data-dir DIR (or --store kafka --kafka-bootstrap HOST:PORT)")
    return open_store(args.data_dir, create=create, read_only=read_only)
