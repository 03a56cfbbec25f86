"""``logbroker topics``: list, describe, create, alter, delete; retention and forced deletion.

Works on a data dir of the embedded store directly (safe while a gateway runs on it); ``list``
and ``describe`` also work through a gateway (``--server URL``), and ``create``, ``alter`` and
``delete`` through a gateway with an admin token (``POST /v1/topics``, ``PATCH`` and ``DELETE
/v1/topics/{topic}``).

``create`` and ``alter`` keep a topic within the gateway's ``max_partitions_per_topic`` (read
from ``--config``, ``LOGBROKER_CONFIG`` or ``LOGBROKER_LIMITS_MAX_PARTITIONS_PER_TOPIC``, as
``serve`` reads it, or the gateway's own through ``--server``), and ``create`` the store within
its ``max_topics``: over them they exit 2 and change nothing.  ``create --server`` without
``--partitions`` gives the topic the gateway's ``partitions``.  ``--retention-hours unlimited``
and ``--retention-bytes unlimited`` remove a retention limit.  Exit 2 for bad usage, a
refusal (the store's, or the gateway's 4xx, a refused token included), a Kafka cluster that
cannot be reached (said in one line within a few seconds), 1 for a gateway that fails (500),
4 for gateways that stayed unreachable or unavailable (502, 503, 504) for ``--gateway-retry``
seconds (30): ``--server URL[,URL...]`` asks the next gateway at once and waits out an
unavailable installation as ``ops/gateway_client.py`` says.  A ``create`` or ``delete`` whose
first attempt may have reached the gateway (its answer lost) and whose repeat is refused 409
(the topic exists) or 404 (no such topic) says that the lost attempt may have done it.

logbroker's internal topics (``logbroker-internal.*``, and on Kafka every ``__...`` topic:
the owners' and state topics, Kafka's own) are never created, altered or deleted here, as the
gateway's admin routes refuse them; the audit topic (``<dc>.logbroker-audit``) is not deleted
(its retention may be changed).  ``list`` shows what a gateway lists (no internal or audit
topics; ``--all`` shows them), each with its partitions, whichever way the topics are reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from audit.records import is_audit_topic
from delivery.internal_state import is_internal
from ingest_api.settings import load_limits
from log_store import UNLIMITED, LogbrokerError, TopicConfig, TopicInfo, UnknownTopic
from log_store.topic_names import validate_topic_name
from log_store.topic_quota import TopicChange, TopicLimits, TopicQuota
from ops.gateway_client import (
    EXIT_UNAVAILABLE,
    SERVERS_HELP,
    GatewayClient,
    GatewayStillUnavailable,
    add_gateway_retry,
    gateway_retry_of,
)
from ops.store_options import add_kafka_arguments, open_store_from_args, store_kind
from ops.token_options import add_token_options, token_from


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Options accepted before and after the action (``topics --data-dir D list`` and
    ``topics list --data-dir D``); after it they must not reset what came before."""
    default = argparse.SUPPRESS if suppress else None
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", default=default, help="data dir of the embedded store")
    where.add_argument(
        "--server",
        default=default,
        metavar="URL[,URL...]",
        help="gateway URL (list, describe; create, alter, delete: admin token)" + SERVERS_HELP,
    )
    add_gateway_retry(parser, suppress=suppress)
    parser.add_argument(
        "--config",
        type=Path,
        default=default,
        help="the gateway's TOML configuration: its [limits] bound create and alter",
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
    listing.add_argument(
        "--all", action="store_true", help="include logbroker's internal and audit topics"
    )
    describe = actions.add_parser(
        "describe", help="partitions, offsets and sizes of a topic", parents=[common]
    )
    describe.add_argument("topic")
    create = actions.add_parser("create", help="create a topic", parents=[common])
    create.add_argument("topic")
    create.add_argument(
        "--partitions",
        type=int,
        help=f"default {TopicConfig().partitions}; with --server, the gateway's partitions",
    )
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
    parser.add_argument(
        "--retention-hours",
        type=_hours,
        help="drop segments older than this; 'unlimited' removes the limit",
    )
    parser.add_argument(
        "--retention-bytes",
        type=_count,
        help="per-partition size to keep; 'unlimited' removes the limit",
    )
    parser.add_argument("--segment-bytes", type=_size, help="roll segments at this size")


def _hours(text: str) -> float:
    if text == "unlimited":
        return UNLIMITED
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of hours or 'unlimited'"
        ) from None
    if not 0 <= hours < 2**63 / 3_600_000:  # nan and inf too
        raise argparse.ArgumentTypeError(f"{text!r}: hours must be 0 or more, or 'unlimited'")
    return hours


_MAX_VALUE = 2**63 - 1
"""The largest setting a store keeps (a 64-bit integer), as the gateway's admin API checks."""


def _count(text: str) -> int:
    if text == "unlimited":
        return UNLIMITED
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of bytes or 'unlimited'"
        ) from None
    if not 0 <= count <= _MAX_VALUE:
        raise argparse.ArgumentTypeError(
            f"{text!r}: bytes must be in 0..{_MAX_VALUE}, or 'unlimited'"
        )
    return count


def _size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes") from None
    if not 0 <= size <= _MAX_VALUE:
        raise argparse.ArgumentTypeError(f"{text!r}: bytes must be in 0..{_MAX_VALUE}")
    return size


def _retention_ms(hours: float | None) -> int | None:
    """``--retention-hours`` in milliseconds: None (not given) and UNLIMITED stay as they are."""
    if hours is None or hours == UNLIMITED:
        return None if hours is None else UNLIMITED
    return int(hours * 3600 * 1000)


def _unlimited_is_none(value: int | None) -> int | None:
    """``create``: a topic without retention is what ``unlimited`` asks for."""
    return None if value == UNLIMITED else value


def _topic_dict(info: TopicInfo) -> dict[str, Any]:
    partitions = [vars(p) for p in info.partitions]  # sizes null where unknown (Kafka)
    return {**info.settings_json(), "partition_info": partitions}


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


def _limit(value: int | None) -> str:
    """A retention limit as the options take it: ``unlimited`` for none (JSON keeps null)."""
    return "unlimited" if value is None else str(value)


def _print_topic(info: TopicInfo, as_json: bool) -> None:
    """Sizes the store does not know (Kafka) are shown as ``-``; segments only where the
    store has them (the embedded store), so a topic on Kafka reads as through a gateway."""
    if as_json:
        print(json.dumps(_topic_dict(info)))
        return
    print(
        f"{info.name}  id={info.topic_id}  partitions={info.config.partitions}  "
        f"retention_ms={_limit(info.config.retention_ms)}  "
        f"retention_bytes={_limit(info.config.retention_bytes)}"
    )
    if not info.partitions:
        return
    segments = any(p.segments is not None for p in info.partitions)
    print(
        f"  {'partition':>9} {'start':>12} {'end':>12} {'bytes':>14}"
        + (f" {'segments':>8}" if segments else "")
    )
    for p in info.partitions:
        print(
            f"  {p.partition:>9} {p.start_offset:>12} {p.end_offset:>12} "
            f"{_shown(p.size_bytes):>14}" + (f" {_shown(p.segments):>8}" if segments else "")
        )


def _refusal(topic: str, args: argparse.Namespace) -> str | None:
    """Why ``topic`` may not be created, altered or deleted here, if it may not: the
    gateway's rule (its internal topics), Kafka's internal names, and the audit topic's
    records, which only a deletion could lose."""
    if is_internal(topic):
        return f"{topic} is one of logbroker's internal topics; it is managed by the gateway"
    kafka_name = (getattr(args, "kafka_namespace", "") or "") + topic
    if args.server is None and store_kind(args) == "kafka" and kafka_name.startswith("__"):
        return (
            f"{topic} is the Kafka topic {kafka_name}, an internal topic (of Kafka or of a "
            "logbroker installation); it is managed by the gateway or by Kafka"
        )
    if args.action == "delete" and is_audit_topic(topic):
        return (
            f"{topic} is the audit topic (the tiers' counts that `logbroker audit --windows` "
            "reconciles); it is not deleted by hand: bound it with `topics alter "
            "--retention-hours`"
        )
    return None


def _listed(store: Any, show_all: bool) -> list[TopicInfo]:
    """The topics ``list`` shows, each with its partitions (a store that lists topics
    without them, Kafka, is asked for each): what a gateway lists, or with ``show_all`` every
    topic."""
    shown = []
    for info in store.list_topics():
        if not show_all and (is_internal(info.name) or is_audit_topic(info.name)):
            continue
        if not info.partitions and info.config.partitions:
            try:
                info = store.describe_topic(info.name)
            except UnknownTopic:
                continue  # deleted since the listing
        shown.append(info)
    return shown


def run(args: argparse.Namespace) -> int:
    topic = getattr(args, "topic", None)
    refusal = None if topic is None or args.action == "describe" else _refusal(topic, args)
    if refusal is not None:
        print(f"logbroker topics: {refusal}", file=sys.stderr)
        return 2
    if args.action == "alter" and not any(v is not None for v in vars(_change(args)).values()):
        print(
            "logbroker topics: nothing to change; name one of --partitions, --retention-hours, "
            "--retention-bytes, --segment-bytes",
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
        # `list` and `describe` only read: read-only, so a read-only file system is no obstacle.
        with contextlib.closing(
            open_store_from_args(
                args,
                create=args.action == "create",
                read_only=args.action in ("list", "describe"),
            )
        ) as store:
            if args.action == "list":
                for info in _listed(store, args.all):
                    _print_topic(info, args.json)
            elif args.action == "describe":
                _print_topic(store.describe_topic(args.topic), args.json)
            elif args.action == "create":
                config = TopicConfig(
                    partitions=(
                        TopicConfig().partitions if args.partitions is None else args.partitions
                    ),
                    retention_ms=_unlimited_is_none(_retention_ms(args.retention_hours)),
                    retention_bytes=_unlimited_is_none(args.retention_bytes),
                    segment_bytes=args.segment_bytes or TopicConfig().segment_bytes,
                )
                _print_topic(_quota(store, args).create_new(args.topic, config), args.json)
            elif args.action == "alter":
                _print_topic(_quota(store, args).alter(args.topic, _change(args)), args.json)
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


def _quota(store: Any, args: argparse.Namespace) -> TopicQuota:
    """The gateway's limits over ``store``, as ``serve`` would read them."""
    limits = load_limits(config_file=args.config)
    return TopicQuota(store, TopicLimits(limits.max_topics, limits.max_partitions_per_topic))


def _change(args: argparse.Namespace) -> TopicChange:
    return TopicChange(
        partitions=args.partitions,
        retention_ms=_retention_ms(args.retention_hours),
        retention_bytes=args.retention_bytes,
        segment_bytes=args.segment_bytes,
    )


def _run_on_gateway(args: argparse.Namespace) -> int:
    """``list`` and ``describe`` through a gateway's read API (what a reader may see);
    ``create``, ``alter`` and ``delete`` through its admin API."""
    if args.action not in ("list", "describe", "create", "alter", "delete"):
        print(
            f"logbroker topics: {args.action} needs --data-dir (a gateway's API only reads, "
            "creates, alters and deletes topics)",
            file=sys.stderr,
        )
        return 2
    try:
        token = token_from(args)
    except LogbrokerError as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return 2
    try:
        with GatewayClient(
            args.server,
            command="topics",
            token=token,
            retry_s=gateway_retry_of(args),
            timeout_s=60,
        ) as http:
            if args.action in ("create", "alter", "delete"):
                return _admin_on_gateway(args, http)
            if args.action == "list":
                params = {"include_audit": "true"} if args.all else None
                listed = _answer(http.request("GET", "/v1/topics", params=params))
                for name in (t["name"] for t in listed["topics"]):
                    _print_remote(_answer(http.request("GET", _topic_path(name))), args.json)
            else:
                _print_remote(_answer(http.request("GET", _topic_path(args.topic))), args.json)
    except GatewayStillUnavailable as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except _Refused as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return exc.exit_status
    except (LogbrokerError, httpx.UnsupportedProtocol) as exc:
        print(f"logbroker topics: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"logbroker topics: {args.server}: {exc}", file=sys.stderr)
        return 1
    return 0


class _Refused(Exception):
    """A gateway's answer other than 2xx (that is not waited out): 4xx exit 2, 5xx exit 1."""

    def __init__(self, response: httpx.Response, note: str = "") -> None:
        try:
            body = response.json()
            reason = f"{body['reason']} ({response.status_code} {body['error']})"
        except (ValueError, KeyError, TypeError):
            reason = f"{response.status_code} {response.text[:300]}"
        super().__init__(reason + note)
        self.status = response.status_code
        self.exit_status = 2 if response.status_code < 500 else 1


def _answer(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise _Refused(response)
    return response.json()


def _topic_path(topic: str) -> str:
    return f"/v1/topics/{quote(topic, safe='')}"


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


def _admin_on_gateway(args: argparse.Namespace, http: GatewayClient) -> int:
    """``POST /v1/topics``, ``PATCH`` or ``DELETE /v1/topics/{topic}``: the gateway applies
    its own limits."""
    topic = validate_topic_name(args.topic)  # never a path of another route
    body: dict[str, Any] | None = None
    if args.action == "delete":
        method, path = "DELETE", _topic_path(topic)
    else:
        change = _change(args)
        body = {
            name: None if value == UNLIMITED else value
            for name, value in vars(change).items()
            if value is not None
        }
        if args.action == "create":
            method, path, body = "POST", "/v1/topics", {"name": topic, **body}
        else:
            method, path = "PATCH", _topic_path(topic)
    response = http.request(method, path, json=body)
    lost = {"create": 409, "delete": 404}.get(args.action)
    if response.status_code == lost and http.asked_again_after_sending:
        # repeating a create or a delete is refused if the first attempt did it: say so
        done = "created" if args.action == "create" else "deleted"
        raise _Refused(
            response,
            f"; an earlier attempt of this command, whose answer was lost, may have {done} it",
        )
    if response.status_code >= 400:
        raise _Refused(response)
    doc = response.json()
    if args.json:
        print(json.dumps(doc))
    elif args.action == "delete":
        print(f"deleted {doc['name']} (id {doc['topic_id']})")
    else:
        print(
            f"{doc['name']}  id={doc['topic_id']}  partitions={doc['partitions']}  "
            f"retention_ms={_limit(doc['retention_ms'])}  "
            f"retention_bytes={_limit(doc['retention_bytes'])}"
        )
    return 0
