"""``logbroker read``: follow a topic or a DC prefix and print lines or JSON (the kcat of it).

With ``--group`` the reader is a member of a consumer group: partitions are shared with the
group's other members and positions are committed after each batch is printed and flushed.
SIGTERM/SIGINT stop it after the batch in hand: it commits, leaves the group and exits 0.
"""

from __future__ import annotations

import argparse
import base64
import signal
import sys
import time
from types import FrameType
from typing import BinaryIO

import orjson

from delivery.consumer import Consumer
from delivery.filters import BadFilter, MessageFilter, parse_filter
from delivery.pull_client import GatewayUnavailable, PullClient, ReadMessage, RequestRefused
from log_store.errors import BadRequest

_POLL_WAIT_MS = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="gateway URL, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--topic",
        required=True,
        help="topic to read; a name ending in '*' (e.g. 'dc1.*') reads every topic it prefixes",
    )
    parser.add_argument("--group", help="consumer group: share partitions, commit positions")
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the oldest message (a new group, or without --group); default: the end",
    )
    parser.add_argument("--format", choices=("lines", "jsonl"), default="lines")
    parser.add_argument(
        "--idle-exit",
        type=float,
        metavar="SECONDS",
        help="exit after this many seconds with nothing new",
    )
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="server-side filter: source_id=, server=, file= (globs allowed), log_type=; "
        "repeat a field for alternatives",
    )
    parser.add_argument(
        "--hash",
        metavar="KEY:MOD:REM",
        help="server-side split: only messages whose KEY (source_id|server|file) hashes to REM "
        "modulo MOD",
    )
    parser.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--token", help="bearer token")


def _filter(args: argparse.Namespace) -> MessageFilter:
    params: dict[str, list[str]] = {}
    for item in args.where:
        name, sep, value = item.partition("=")
        if not sep or name not in ("source_id", "server", "file", "log_type"):
            raise BadFilter(f"--where {item!r}: use source_id=, server=, file= or log_type=")
        params.setdefault(name, []).append(value)
    if args.hash:
        parts = args.hash.split(":")
        if len(parts) != 3:
            raise BadFilter(f"--hash {args.hash!r}: use KEY:MOD:REM, e.g. source_id:4:0")
        key, mod, rem = parts
        params.update(hash_key=[key], hash_mod=[mod], hash_rem=[rem])
    return parse_filter(params)


def _jsonl(message: ReadMessage) -> bytes:
    env = message.envelope
    record: dict[str, object] = {
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "source_id": env.source_id,
        "seqno": env.seqno,
        "server": env.server,
        "file": env.file,
        "log_type": env.log_type,
        "create_time": env.create_time,
        "write_time": env.write_time,
    }
    if env.kind != "chunk":
        record["txn_id"] = env.txn_id
    data = message.text_data()
    try:
        record["data"] = data.decode("utf-8")
    except UnicodeDecodeError:
        record["data_b64"] = base64.b64encode(data).decode()
    return orjson.dumps(record) + b"\n"


def _write(out: BinaryIO, messages: list[ReadMessage], fmt: str) -> None:
    for message in messages:
        if fmt == "jsonl":
            out.write(_jsonl(message))
        else:
            data = message.text_data()
            out.write(data)
            if data and not data.endswith(b"\n"):
                out.write(b"\n")
    out.flush()


def run(args: argparse.Namespace) -> int:
    try:
        message_filter = _filter(args)
    except BadRequest as exc:
        print(f"logbroker read: {exc}", file=sys.stderr)
        return 2
    if args.idle_exit is not None and args.idle_exit < 0:
        print("logbroker read: --idle-exit must be >= 0", file=sys.stderr)
        return 2
    prefix = args.topic[:-1] if args.topic.endswith("*") else None
    topics = () if prefix is not None else (args.topic,)
    stop = {"requested": False}

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    client = PullClient(args.server, token=args.token)
    out = sys.stdout.buffer
    consumer: Consumer | None = None
    try:
        if topics:
            client.describe(topics[0])  # an unknown topic is a usage error, said at once
        consumer = Consumer(
            client,
            topics=topics,
            prefix=prefix,
            group=args.group,
            from_beginning=args.from_beginning,
            message_filter=message_filter,
            max_bytes=args.max_bytes,
            session_timeout_ms=args.session_timeout_ms,
        )
        last_new = time.monotonic()
        while not stop["requested"]:
            wait_ms = _POLL_WAIT_MS
            if args.idle_exit is not None:
                left = args.idle_exit - (time.monotonic() - last_new)
                if left <= 0:
                    break
                wait_ms = max(0, min(wait_ms, int(left * 1000)))
            try:
                messages = consumer.poll(wait_ms)
                if messages:
                    _write(out, messages, args.format)
                    last_new = time.monotonic()
                # Also after an empty poll: a commit the gateway missed is made again here.
                consumer.commit()
            except GatewayUnavailable as exc:
                print(f"logbroker read: {exc}; retrying", file=sys.stderr)
                time.sleep(1.0)
        consumer.close()
        return 0
    except RequestRefused as exc:
        print(f"logbroker read: {exc.reason}", file=sys.stderr)
        return 2
    except GatewayUnavailable as exc:
        print(f"logbroker read: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    finally:
        client.close()
