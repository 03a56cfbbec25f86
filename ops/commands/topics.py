"""``logbroker topics``: list, describe, create, alter, delete; retention and forced deletion.

Works on a data dir of the embedded store directly (safe while a gateway runs on it); ``list``
and ``describe`` also work through a gateway (``--server URL``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from delivery.internal_state import is_internal
from delivery.pull_client import GatewayUnavailable, PullClient, RequestRefused
from log_store import LogbrokerError, TopicConfig, TopicInfo
from ops.store_options import add_kafka_arguments, open_store_from_args, store_kind
from ops.token_options import add_token_options, token_from


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Options accepted before and after the action (``topics --data-dir D list`` and
    ``topics list --data-dir D``); after it they must not reset what came before."""
    default = argparse.SUPPRESS if suppress else None
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", default=default, help="data dir of the embedded store")
    where.add_argument(
        "--server", default=default, help="gateway URL (list and describe only, read-only)"
    )
    add_token_options(parser, default=default)
    add_kafka_arguments(parser, suppress=suppress)
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print JSON instead of a table",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, suppress=True)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list topics", parents=[common])
    listing.add_argument("--all", action="store_true", help="include logbroker's internal topics")
    describe = actions.add_parser(
        "describe", help="partitions, offsets and sizes of a topic", parents=[common]
    )
    describe.add_argument("topic")
    create = actions.add_parser("create", help="create a topic", parents=[common])
    create.add_argument("topic")
    create.add_argument("--partitions", type=int, default=4)
    _retention_flags(create)
    alter = actions.add_parser(
        "alter", help="change partitions (grow only) or retention", parents=[common]
    )
    alter.add_argument("topic")
    alter.add_argument("--partitions", type=int)
    _retention_flags(alter)
    delete = actions.add_parser("delete", help="delete a topic and its data", parents=[common])
    delete.add_argument("topic")
    actions.add_parser("retention", help="apply every topic's retention now", parents=[common])
    drop = actions.add_parser(
        "delete-segments",
        help="forced deletion: drop whole segments below an offset",
        parents=[common],
    )
    drop.add_argument("topic")
    drop.add_argument("--partition", type=int, required=True)
    drop.add_argument("--before-offset", type=int, required=True)


def _retention_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--retention-hours", type=float, help="drop segments older than this")
    parser.add_argument("--retention-bytes", type=int, help="per-partition size to keep")
    parser.add_argument("--segment-bytes", type=int, help="roll segments at this size")


def _retention_ms(hours: float | None) -> int | None:
    return None if hours is None else int(hours * 3600 * 1000)


def _topic_dict(info: TopicInfo) -> dict[str, Any]:
    partitions = [vars(p) for p in info.partitions]  # sizes null where unknown (Kafka)
    return {
        "name": info.name,
        "topic_id": info.topic_id,
        "partitions": info.config.partitions,
        "retention_ms": info.config.retention_ms,
        "retention_bytes": info.config.retention_bytes,
        "segment_bytes": info.config.segment_bytes,
        "partition_info": partitions,
    }


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


def _print_topic(info: TopicInfo, as_json: bool) -> None:
    """Sizes and segments the store does not know (Kafka) are shown as ``-``."""
    if as_json:
        print(json.dumps(_topic_dict(info)))
        return
    print(
        f"{info.name}  id={info.topic_id}  partitions={info.config.partitions}  "
        f"retention_ms={info.config.retention_ms}  retention_bytes={info.config.retention_bytes}"
    )
    if info.partitions:
        print(f"  {'partition':>9} {'start':>12} {'end':>12} {'bytes':>14} {'segments':>8}")
        for p in info.partitions:
            print(
                f"  {p.partition:>9} {p.start_offset:>12} {p.end_offset:>12} "
                f"{_shown(p.size_bytes):>14} {_shown(p.segments):>8}"
            )


def run(args: argparse.Namespace) -> int:
    topic = getattr(args, "topic", None)
    if topic is not None and is_internal(topic) and args.action != "describe":
        print(
            f"logbroker topics: {topic} is one of logbroker's internal topics; "
            "it is managed by the gateway",
            file=sys.stderr,
        )
        return 2
    if args.server is not None:
        return _run_on_gateway(args)
    if args.data_dir is None and store_kind(args) != "kafka":
        print(
            "logbroker topics: give --data-dir DIR (or --server URL, or --store kafka "
            "--kafka-bootstrap HOST:PORT)",
            file=sys.stderr,
        )
        return 2
    try:
        # Only `create` may make a store where there is none; a typo is an error otherwise.
        with contextlib.closing(
            open_store_from_args(args, create=args.action == "create")
        ) as store:
            if args.action == "list":
                for info in store.list_topics():
                    if args.all or not is_internal(info.name):
                        _print_topic(info, args.json)
            elif args.action == "describe":
                _print_topic(store.describe_topic(args.topic), args.json)
            elif args.action == "create":
                config = TopicConfig(
                    partitions=args.partitions,
                    retention_ms=_retention_ms(args.retention_hours),
                    retention_bytes=args.retention_bytes,
                    segment_bytes=args.segment_bytes or TopicConfig().segment_bytes,
                )
                _print_topic(store.create_topic(args.topic, config), args.json)
            elif args.action == "alter":
                if args.partitions is not None:
                    store.set_partitions(args.topic, args.partitions)
                info = store.alter_topic(
                    args.topic,
                    retention_ms=_retention_ms(args.retention_hours),
                    retention_bytes=args.retention_bytes,
                    segment_bytes=args.segment_bytes,
                )
                _print_topic(info, args.json)
            elif args.action == "delete":
                store.delete_topic(args.topic)
                print(f"deleted {args.topic}")
            elif args.action == "retention":
                for (topic, partition), start in sorted(store.apply_retention().items()):
                    print(f"{topic} partition {partition}: log start offset now {start}")
            elif args.action == "delete-segments":
                start = store.delete_segments_before(args.topic, args.partition, args.before_offset)
                print(f"{args.topic} partition {args.partition}: log start offset now {start}")
    except LogbrokerError as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return 2
    return 0


def _run_on_gateway(args: argparse.Namespace) -> int:
    """``list`` and ``describe`` through a gateway's read API (what a reader may see)."""
    if args.action not in ("list", "describe"):
        print(
            f"logbroker topics: {args.action} needs --data-dir (a gateway's API only reads)",
            file=sys.stderr,
        )
        return 2
    try:
        token = token_from(args)
    except LogbrokerError as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return 2
    client = PullClient(args.server, token=token)
    try:
        if args.action == "list":
            for name in client.list_topics():
                _print_remote(client.describe(name), args.json)
        else:
            _print_remote(client.describe(args.topic), args.json)
    except RequestRefused as exc:
        print(f"logbroker topics: {exc.reason}", file=sys.stderr)
        return 2
    except GatewayUnavailable as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def _print_remote(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(doc))
        return
    parts = doc["partitions"]
    print(f"{doc['name']}  id={doc['topic_id']}  partitions={len(parts)}")
    print(f"  {'partition':>9} {'start':>12} {'end':>12} {'bytes':>14}")
    for p in parts:
        print(
            f"  {p['partition']:>9} {p['start_offset']:>12} {p['end_offset']:>12} "
            f"{_shown(p['size_bytes']):>14}"
        )
