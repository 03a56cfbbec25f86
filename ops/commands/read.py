"""``logbroker read``: follow a topic or a DC prefix and print lines or JSON (the kcat of it).

With ``--group`` the reader is a member of a consumer group: partitions are shared with the
group's other members and positions are committed after each batch is printed and flushed.
SIGTERM/SIGINT stop it after the batch in hand: it commits, leaves the group and exits 0.
"""

from __future__ import annotations

import argparse
import base64
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import BinaryIO

import orjson

from delivery.consumer import Consumer
from delivery.consumer_group import (
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    validate_group,
)
from delivery.filters import BadFilter, MessageFilter, parse_filter
from delivery.gateway_retry import gateway_urls
from delivery.installations import MixedInstallations, NotAGateway
from delivery.internal_state import is_internal
from delivery.partition_reader import MAX_MAX_BYTES
from delivery.pull_client import (
    GatewayUnavailable,
    PullClient,
    ReadMessage,
    RequestRefused,
)
from log_store.errors import BadRequest, InvalidTopicName
from log_store.topic_names import validate_log_type, validate_topic_name
from ops import stop_grace, stop_signals
from ops.commands.arg_types import seconds
from ops.token_options import add_token_options, token_from
from session_dedup.chunk_codecs import CorruptChunk

_POLL_WAIT_MS = 1000
_STOP_GRACE_S = 5.0
_GLOB_CHARS = "*?["
_EXACT_ONLY = {"server": "a host name", "log_type": "a log type"}
"""Filter fields that match exactly and whose values cannot hold a glob's characters (a
source_id may: it stays exact, as the help says)."""


HANDLES_STOP_SIGNALS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        required=True,
        metavar="URL[,URL...]",
        help="gateway URL, e.g. http://127.0.0.1:8080; several gateways of one installation "
        "(comma-separated): a request a gateway fails goes to the next",
    )
    parser.add_argument(
        "--topic",
        required=True,
        metavar="TOPIC|PREFIX*",
        help="topic to read; a name ending in '*' (e.g. 'dc1.*', or '*' for all) reads every "
        "topic it prefixes (only a trailing '*': no other glob)",
    )
    parser.add_argument("--group", help="consumer group: share partitions, commit positions")
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the oldest message (a new group, or without --group); default: the end",
    )
    parser.add_argument(
        "--format",
        choices=("lines", "jsonl", "jsonl-chunks"),
        default="lines",
        help="lines: the log data as written; jsonl: one JSON object per line with the "
        "message's fields; jsonl-chunks: one JSON object per message (a chunk of lines)",
    )
    parser.add_argument(
        "--idle-exit",
        type=seconds,
        metavar="SECONDS",
        help="exit after this many seconds with nothing new (status 0; 1 if the gateway "
        "was unreachable then; 3 if a partition was not read past a damaged batch)",
    )
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="server-side filter: source_id=, server=, log_type= match exactly; file= also takes "
        "globs (*, ?, [...]); repeat a field for alternatives",
    )
    parser.add_argument(
        "--hash",
        metavar="KEY:MOD:REM",
        help="server-side split: only messages whose KEY (source_id|server|file) hashes to REM "
        "modulo MOD",
    )
    parser.add_argument(
        "--max-bytes", type=int, default=16 * 1024 * 1024, help="log data per fetch (16 MiB)"
    )
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    add_token_options(parser)


def _filter(args: argparse.Namespace) -> MessageFilter:
    params: dict[str, list[str]] = {}
    for item in args.where:
        name, sep, value = item.partition("=")
        if not sep or name not in ("source_id", "server", "file", "log_type"):
            raise BadFilter(f"--where {item!r}: use source_id=, server=, file= or log_type=")
        if name in _EXACT_ONLY and any(c in value for c in _GLOB_CHARS):
            # no host name or log type holds them: a glob here would silently match nothing
            raise BadFilter(
                f"--where {item!r}: only file= takes globs; {name}= matches exactly, and "
                f"{_EXACT_ONLY[name]} has no '*', '?' or '['"
            )
        if name == "log_type":
            validate_log_type(value)  # a log type no writer can have would match nothing
        params.setdefault(name, []).append(value)
    if args.hash:
        parts = args.hash.split(":")
        if len(parts) != 3:
            raise BadFilter(f"--hash {args.hash!r}: use KEY:MOD:REM, e.g. source_id:4:0")
        key, mod, rem = parts
        params.update(hash_key=[key], hash_mod=[mod], hash_rem=[rem])
    return parse_filter(params)


def _chunk_fields(message: ReadMessage) -> dict[str, object]:
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
    if env.schema_id is not None:  # a structured log type's chunk: the schema it was checked by
        record["schema_id"] = f"{env.schema_id:016x}"
    return record


def _data_field(data: bytes) -> bytes:
    """``"data":"..."`` for UTF-8 text, ``"data_b64":"..."`` for anything else."""
    try:
        return b'"data":' + orjson.dumps(data.decode("utf-8"))
    except UnicodeDecodeError:
        return b'"data_b64":' + orjson.dumps(base64.b64encode(data).decode())


_JSONL_PIECE_LINES = 1024
"""Lines of a chunk encoded and written at a time: a chunk's JSON is never whole in memory."""


def _jsonl_lines(message: ReadMessage) -> Iterator[bytes]:
    """One JSON object per line of the chunk: the chunk's fields, ``line`` (its index in the
    chunk) and ``data`` (the line without its newline); in pieces of a few hundred KiB."""
    head = orjson.dumps(_chunk_fields(message))[:-1] + b',"line":'
    data = message.text_data()
    lines = data.split(b"\n")
    del data
    if lines[-1] == b"":
        lines.pop()
    for start in range(0, len(lines), _JSONL_PIECE_LINES):
        piece = lines[start : start + _JSONL_PIECE_LINES]
        yield b"".join(
            b"%s%d,%s}\n" % (head, i, _data_field(line)) for i, line in enumerate(piece, start)
        )


def _jsonl_chunk(message: ReadMessage) -> Iterator[bytes]:
    """One JSON object per message: the chunk's fields and its whole ``data``."""
    head = orjson.dumps(_chunk_fields(message))[:-1]
    yield head + b"," + _data_field(message.text_data()) + b"}\n"


def _write(out: BinaryIO, messages: list[ReadMessage], fmt: str) -> None:
    """Print the messages; a message whose data does not decompress is skipped with a warning
    (one bad chunk in a log must not stop every reader of it, nor a group at its offset).

    Each message is decompressed, encoded and written in turn, never a whole batch at once:
    a fetch of ``--max-bytes`` of zstd chunks holds several times that once decompressed,
    and more as JSON lines (a batch encoded whole took 209 MiB of RSS for 300 MB of
    access-log lines compressed 7 times, 393 MB in tests/delivery/test_read_memory.py)."""
    if fmt == "lines":
        for message in messages:
            try:
                data = message.text_view()
            except CorruptChunk as exc:
                _skip(exc)
                continue
            out.write(data)
            if data and data[-1] != 0x0A:
                out.write(b"\n")
    else:
        encode = _jsonl_lines if fmt == "jsonl" else _jsonl_chunk
        for message in messages:
            try:
                pieces = encode(message)
                out.write(next(pieces))  # decompressed here: a corrupt chunk prints nothing
            except CorruptChunk as exc:
                _skip(exc)
                continue
            except StopIteration:
                continue  # no lines
            for piece in pieces:
                out.write(piece)
    out.flush()


def _skip(exc: CorruptChunk) -> None:
    print(f"logbroker read: skipping a corrupt message: {exc}", file=sys.stderr, flush=True)


def _none_yet(with_token: bool) -> str:
    """What an empty topic list means: with a token, the gateway lists only what it may read."""
    return (
        "; there are no topics this token may read" if with_token else "; there are no topics yet"
    )


def _topic_hint(topic: str, names: list[str], with_token: bool = False) -> str:
    """What a user who typed ``topic`` may have meant, from the topics that exist."""
    similar = [n for n in names if n.endswith("." + topic) or n.split(".", 1)[-1] == topic]
    hint = ""
    if "." not in topic:
        hint = f"; topics are named <dc>.<log_type>, e.g. dc1.{topic}"
    if similar:
        hint += f"; did you mean {', '.join(similar[:5])}?"
    elif names:
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        hint += f"; topics there: {shown}"
    else:
        hint += _none_yet(with_token)
    return hint + " (`logbroker topics --server URL list` lists them)"


def _prefix_hint(prefix: str, names: list[str], with_token: bool = False) -> str:
    """What a user who typed ``prefix*`` may have meant, from the topics that exist."""
    similar: set[str] = set()
    if prefix and "." not in prefix:
        # 'app*' for 'dc1.app*': a log type where a topic's name starts with its DC
        for name in names:
            dc, _, log_type = name.partition(".")
            if log_type.startswith(prefix):
                similar.add(f"{dc}.{prefix}*")
    if similar:
        shown = ", ".join(sorted(similar)[:5])
        hint = f"; topics are named <dc>.<log_type>: did you mean {shown}?"
    elif names:
        hint = f"; topics there: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
    else:
        hint = _none_yet(with_token)
    return hint + " (`logbroker topics --server URL list` lists them)"


def _any_topic(client: PullClient, prefix: str | None) -> bool:
    """Whether a topic matches ``prefix`` now (a group member may own none of its partitions);
    True if the gateway does not say."""
    try:
        return bool(client.list_topics(prefix or ""))
    except GatewayUnavailable:
        return True


def _wait_for_gateway(
    client: PullClient, stop: dict[str, bool], until: float | None, failures: list[str]
) -> list[str] | None:
    """Wait until the gateway answers; its topics then, or None if stopped or out of time
    first (the last failure appended to ``failures``)."""
    said = False
    while not stop["requested"]:
        try:
            return client.list_topics()
        except GatewayUnavailable as exc:
            failures[:] = [str(exc)]
            if not said:
                print(f"logbroker read: {exc}; retrying", file=sys.stderr, flush=True)
                said = True
        if until is not None and time.monotonic() >= until:
            return None
        time.sleep(0.5)
    return None


def _report_damage(consumer: Consumer) -> int:
    """Say again, last, which partitions were not read to their end because of damaged data."""
    for (topic, partition), (position, error) in sorted(consumer.corrupt.items()):
        print(
            f"logbroker read: {topic}/{partition} was not read past offset {position}: {error} "
            '(docs/operations.md, "A batch fails its checksum")',
            file=sys.stderr,
        )
    return 3


def run(args: argparse.Namespace) -> int:
    # the reader's own warnings (a group rebalanced, a topic created again) name the command,
    # as every other line it writes to stderr does
    logging.basicConfig(level=logging.WARNING, format="logbroker read: %(message)s")
    try:
        message_filter = _filter(args)
        token = token_from(args)
    except BadRequest as exc:
        print(f"logbroker read: {exc}", file=sys.stderr)
        return 2
    if not MIN_SESSION_TIMEOUT_MS <= args.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        print(
            f"logbroker read: --session-timeout-ms must be in "
            f"{MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}, not {args.session_timeout_ms}",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.max_bytes <= MAX_MAX_BYTES:
        # said at once, not by the gateway's answer to the first read: that waits for the
        # topic to appear, maybe for ever
        print(f"logbroker read: --max-bytes must be in 1..{MAX_MAX_BYTES}", file=sys.stderr)
        return 2
    for url in gateway_urls(args.server) or (args.server,):
        server = urllib.parse.urlsplit(url)
        if server.scheme not in ("http", "https") or not server.hostname:
            print(
                f"logbroker read: --server {url!r} is not an http:// or https:// URL",
                file=sys.stderr,
            )
            return 2
    prefix = args.topic[:-1] if args.topic.endswith("*") else None
    if any(c in (args.topic if prefix is None else prefix) for c in _GLOB_CHARS):
        print(
            f"logbroker read: --topic {args.topic!r}: only a trailing '*' is supported, as a "
            "prefix (e.g. 'dc1.*', or '*' for every topic); no other glob",
            file=sys.stderr,
        )
        return 2
    try:
        # a prefix ("dc1.*") must be the start of a valid name ('*' is every topic)
        validate_topic_name(args.topic if prefix is None else prefix + "x")
    except InvalidTopicName as exc:
        print(f"logbroker read: {exc}", file=sys.stderr)
        return 2
    if is_internal(args.topic if prefix is None else prefix):
        # never listed nor readable: waiting for one to appear would wait for ever
        print(
            f"logbroker read: --topic {args.topic!r} "
            + (
                "names one of the gateways' internal topics"
                if prefix is None
                else f"(the prefix {prefix!r}) names only the gateways' internal topics"
            )
            + ", which no one reads",
            file=sys.stderr,
        )
        return 2
    if args.group is not None:
        try:
            validate_group(args.group)
        except BadRequest as exc:
            print(f"logbroker read: --group {args.group!r}: {exc}", file=sys.stderr)
            return 2
    topics = () if prefix is not None else (args.topic,)
    stop = {"requested": False}
    out = sys.stdout.buffer
    writing = threading.Lock()
    stop_grace.exit_after_grace(_STOP_GRACE_S, writing, out, "logbroker read")
    stop_signals.on_stop(lambda: stop.update(requested=True))
    started = time.monotonic()
    idle_until = None if args.idle_exit is None else started + args.idle_exit
    client = PullClient(args.server, token=token)
    consumer: Consumer | None = None
    try:
        client.ask_every_gateway()  # a URL of another installation is refused at once
        failures: list[str] = []
        names = _wait_for_gateway(client, stop, idle_until, failures)
        if names is None:
            if stop["requested"]:
                return 0
            # the last failure: a gateway that answers 503 (its Kafka away) did answer
            print(
                f"logbroker read: {args.server} listed no topics within {args.idle_exit:g} s "
                f"(--idle-exit); last: {failures[-1] if failures else 'no answer'}",
                file=sys.stderr,
            )
            return 1
        if topics and "." not in topics[0] and topics[0] not in names:
            # Not a topic name the gateway makes: say what exists instead of waiting.
            print(
                f"logbroker read: no topic {topics[0]!r} on {args.server}"
                f"{_topic_hint(topics[0], names, token is not None)}",
                file=sys.stderr,
            )
            return 2
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
        last_new = started
        caught_up = False  # the last poll found nothing new: idle time counts
        waiting: list[str] = []
        # a prefix read looks once whether any topic matches yet (None: not looked yet)
        prefix_waiting: bool | None = None if prefix is not None else False
        unavailable = False
        while not stop["requested"]:
            wait_ms = _POLL_WAIT_MS
            if args.idle_exit is not None:
                left = args.idle_exit - (time.monotonic() - last_new)
                if left <= 0 and unavailable:
                    # idle because the gateway is gone, not because everything was read
                    print(
                        f"logbroker read: {args.server} was still unavailable after "
                        f"{args.idle_exit:g} s without new data",
                        file=sys.stderr,
                    )
                    return 1
                if left <= 0 and caught_up:
                    break
                wait_ms = max(0, min(wait_ms, int(left * 1000)))
            try:
                messages = consumer.poll(wait_ms)
                # An answer that moved the position short of the end is not idle, also when it
                # held no message (it stopped at a budget of records that are no envelopes or
                # that --where left out): the records after them are a read away.
                caught_up = not messages and not consumer.behind
                if messages:
                    with writing:
                        _write(out, messages, args.format)
                    last_new = time.monotonic()
                # Also after an empty poll: a commit the gateway missed is made again here.
                consumer.commit()
                # the look at the topics behind a "waiting for" hint is retried as a read is
                missing = consumer.missing_topics
                if missing and missing != waiting:
                    names = client.list_topics()
                    # a topic made between the poll and this look is not waited for: say nothing
                    if any(topic not in names for topic in missing):
                        print(
                            f"logbroker read: waiting for topic {', '.join(map(repr, missing))} "
                            f"to appear on {args.server}"
                            f"{_topic_hint(missing[0], names, token is not None)}",
                            file=sys.stderr,
                            flush=True,
                        )
                waiting = missing
                if prefix is not None and consumer.assignment:
                    prefix_waiting = False
                elif prefix is not None and prefix_waiting is None:
                    matching = client.list_topics(prefix)
                    if not matching:
                        hint = _prefix_hint(prefix, client.list_topics(), token is not None)
                        print(
                            f"logbroker read: no topic matches {args.topic!r} on {args.server} "
                            f"yet; waiting for one to appear{hint}",
                            file=sys.stderr,
                            flush=True,
                        )
                    prefix_waiting = not matching
                unavailable = False
            except GatewayUnavailable as exc:
                if not unavailable:
                    print(f"logbroker read: {exc}; retrying", file=sys.stderr, flush=True)
                    unavailable = True
                time.sleep(1.0)
        if consumer.corrupt:
            return _report_damage(consumer)
        if stop["requested"]:
            return 0
        if waiting:
            print(
                f"logbroker read: topic {', '.join(map(repr, waiting))} did not appear within "
                f"{args.idle_exit:g} s",
                file=sys.stderr,
            )
        elif prefix_waiting and not _any_topic(client, prefix):
            print(
                f"logbroker read: no topic matching {args.topic!r} appeared within "
                f"{args.idle_exit:g} s",
                file=sys.stderr,
            )
        return 0
    except RequestRefused as exc:
        print(f"logbroker read: {exc.reason}", file=sys.stderr)
        return 2
    except (MixedInstallations, NotAGateway) as exc:
        print(f"logbroker read: {exc}", file=sys.stderr)
        return 2
    except GatewayUnavailable as exc:
        print(f"logbroker read: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    finally:
        if consumer is not None:
            consumer.close()
        client.close()
