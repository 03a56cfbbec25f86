"""``logbroker schemas``: the schema registry of a gateway (see ``docs/schemas.md``).

::

    logbroker schemas register --server URL[,URL...] LOG_TYPE SCHEMA_FILE   # version and id
    logbroker schemas list     --server URL[,URL...] [LOG_TYPE]             # log types, versions
    logbroker schemas show     --server URL[,URL...] LOG_TYPE [VERSION]     # default latest
    logbroker schemas compat   --server URL[,URL...] LOG_TYPE [MODE]        # show or set the mode

A gateway that cannot be reached or answers 502, 503 or 504 is waited out (the next of
``--server`` asked, ``Retry-After`` honoured) for ``--gateway-retry`` seconds (30), see
``ops/gateway_client.py``; registering is safe to repeat (a schema the log type has answers its
version).  Exit 0 on success, 1 when the gateway refuses the request (an incompatible schema, an
unknown log type) or fails otherwise, 2 for bad usage, a file that is not a schema or a token
the gateway refuses (401, 403: a configuration error, as for ``read``, ``mirror``, ``topics``
and ``audit``), 4 when no gateway answered within ``--gateway-retry``; the gateway's reason is
printed on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from log_store.errors import LogbrokerError
from log_store.topic_names import validate_log_type
from ops.gateway_client import (
    EXIT_UNAVAILABLE,
    SERVERS_HELP,
    GatewayClient,
    GatewayStillUnavailable,
    add_gateway_retry,
)
from ops.token_options import add_token_options, token_from
from schema_registry import MODES, InvalidSchema, parse

_USAGE_STATUSES = frozenset({400, 401, 403, 413, 415})
"""Answers that say the command line or its token is wrong (exit 2), not the registry's state."""


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server",
        required=True,
        metavar="URL[,URL...]",
        help="gateway URL, e.g. http://gw:8080" + SERVERS_HELP,
    )
    add_gateway_retry(common)
    add_token_options(common)
    common.add_argument("--json", action="store_true", help="print the gateway's JSON answer")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    register = actions.add_parser(
        "register", help="register a schema version of a log type", parents=[common]
    )
    register.add_argument("log_type")
    register.add_argument("schema_file", type=Path, help="an Avro record schema (.avsc, JSON)")
    listing = actions.add_parser(
        "list", help="structured log types, or one log type's versions", parents=[common]
    )
    listing.add_argument("log_type", nargs="?")
    show = actions.add_parser("show", help="print one version's schema", parents=[common])
    show.add_argument("log_type")
    show.add_argument("version", nargs="?", default="latest", help="a number or 'latest'")
    compat = actions.add_parser(
        "compat", help="show or set a log type's compatibility mode", parents=[common]
    )
    compat.add_argument("log_type")
    compat.add_argument("mode", nargs="?", choices=MODES)


def _call(http: GatewayClient, method: str, path: str, body: Any = None) -> Any:
    response = http.request(method, path, json=body)
    if response.status_code >= 400:
        try:
            doc = response.json()
            text = f"{doc['error']}: {doc['reason']}"
            for problem in doc.get("problems", [])[1:]:
                text += f"\n  also: {problem}"
        except (ValueError, KeyError, TypeError):
            text = response.text[:300]
        raise _Refused(response.status_code, f"{response.status_code} {text}")
    return response.json()


def _print_versions(doc: dict[str, Any]) -> None:
    print(f"{doc['log_type']}: compatibility {doc['compatibility']}")
    print(f"{'version':>7}  {'id':16}  registered (UTC)")
    import datetime as dt

    for v in doc["versions"]:
        when = dt.datetime.fromtimestamp(v["registered_ms"] / 1000, dt.UTC)
        print(f"{v['version']:>7}  {v['id']:16}  {when:%Y-%m-%d %H:%M:%S}")


def _run(args: argparse.Namespace, http: GatewayClient) -> None:
    log_type = args.log_type
    base = f"/v1/schemas/{quote(log_type, safe='')}" if log_type else "/v1/schemas"
    if args.action == "register":
        try:
            schema = parse(args.schema_file.read_bytes())
        except OSError as exc:
            raise InvalidSchema(f"cannot read {args.schema_file}: {exc.strerror}") from None
        doc = _call(http, "POST", base + "/versions", {"schema": json.loads(schema.text)})
        if args.json:
            print(json.dumps(doc))
        else:
            what = "registered" if doc["created"] else "already registered"
            if not doc["created"] and http.asked_again_after_sending:
                what += " (perhaps by this command: an earlier attempt's answer was lost)"
            print(f"{log_type}: {what} as version {doc['version']}, id {doc['id']}")
    elif args.action == "list":
        doc = _call(http, "GET", base)
        if args.json:
            print(json.dumps(doc))
        elif log_type is None:
            for name in doc["log_types"]:
                print(name)
        else:
            _print_versions(doc)
    elif args.action == "show":
        doc = _call(http, "GET", f"{base}/versions/{quote(args.version, safe='')}")
        print(json.dumps(doc if args.json else doc["schema"], indent=None if args.json else 2))
    else:
        if args.mode is None:
            doc = _call(http, "GET", base)
        else:
            doc = _call(http, "PUT", base + "/compatibility", {"compatibility": args.mode})
        print(json.dumps(doc) if args.json else f"{log_type}: {doc['compatibility']}")


def run(args: argparse.Namespace) -> int:
    try:
        if args.log_type is not None:
            validate_log_type(args.log_type)
        with GatewayClient(
            args.server,
            command="schemas",
            token=token_from(args),
            retry_s=args.gateway_retry,
            timeout_s=30,
        ) as http:
            _run(args, http)
    except GatewayStillUnavailable as exc:
        print(f"logbroker schemas: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except LogbrokerError as exc:
        print(f"logbroker schemas: {exc}", file=sys.stderr)
        return 2
    except _Refused as exc:
        print(f"logbroker schemas: the gateway refused: {exc}", file=sys.stderr)
        return 2 if exc.status in _USAGE_STATUSES else 1
    except httpx.HTTPError as exc:
        print(f"logbroker schemas: {args.server}: {exc}", file=sys.stderr)
        return 1
    return 0
