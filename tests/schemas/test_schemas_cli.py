"""``logbroker schemas`` against a real gateway: register, list, show, compat; exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import GatewayProcess, logbroker_cmd
from tests.schemas.conftest import ORDER_BROKEN, ORDER_V1, ORDER_V2


def schemas(gateway: GatewayProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("schemas", args[0], "--server", gateway.url, *args[1:]),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_schemas_command_registers_lists_shows_and_sets_compatibility(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    files = {}
    for name, schema in (("v1", ORDER_V1), ("v2", ORDER_V2), ("broken", ORDER_BROKEN)):
        files[name] = tmp_path / f"{name}.avsc"
        files[name].write_text(json.dumps(schema))
    first = schemas(gateway, "register", "orders", str(files["v1"]))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("orders: registered as version 1, id ")
    assert schemas(gateway, "register", "orders", str(files["v2"])).returncode == 0
    refused = schemas(gateway, "register", "orders", str(files["broken"]))
    assert refused.returncode == 1
    assert "incompatible_schema" in refused.stderr and "country" in refused.stderr
    assert schemas(gateway, "list").stdout.split() == ["orders"]
    listed = schemas(gateway, "list", "orders")
    assert listed.returncode == 0
    assert "compatibility backward" in listed.stdout and len(listed.stdout.splitlines()) == 4
    shown = json.loads(schemas(gateway, "show", "orders", "1").stdout)
    assert shown == ORDER_V1
    assert schemas(gateway, "compat", "orders").stdout.strip() == "orders: backward"
    assert schemas(gateway, "compat", "orders", "full").stdout.strip() == "orders: full"
    unknown = schemas(gateway, "show", "nothing")
    assert unknown.returncode == 1 and "unknown_log_type" in unknown.stderr


def test_bad_usage_and_a_file_that_is_not_a_schema_exit_2(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    not_schema = tmp_path / "x.avsc"
    not_schema.write_text('{"type": "record", "name": "X", "fields": [{"name": "a"}]}')
    bad = schemas(gateway, "register", "orders", str(not_schema))
    assert bad.returncode == 2 and "not a valid Avro schema" in bad.stderr
    missing = schemas(gateway, "register", "orders", str(tmp_path / "absent.avsc"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert schemas(gateway, "compat", "orders", "sideways").returncode == 2
    assert schemas(gateway, "list", "Bad/Type").returncode == 2
    assert schemas(gateway, "list").stdout == ""  # nothing was registered
