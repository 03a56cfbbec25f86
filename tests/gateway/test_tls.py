"""TLS through uvicorn's options: ``--ssl-certfile`` / ``--ssl-keyfile``."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.conftest import meta


def test_gateway_serves_https_with_a_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    # the shared fixture waits on plain-HTTP /healthz, so this gateway is started by hand
    from tests.conftest import GatewayProcess

    gw = GatewayProcess(
        tmp_path / "data",
        ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
        tmp_path / "gateway.log",
    )
    gw.url = gw.url.replace("http://", "https://")
    try:
        _start_https(gw, cert)
        with httpx.Client(
            base_url=gw.url, verify=ssl.create_default_context(cafile=str(cert))
        ) as client:
            response = client.post("/v1/sessions", json=meta("tls-source"))
            assert response.status_code == 200
            assert response.json()["last_seqno"] == 0
        with httpx.Client(base_url=gw.url.replace("https://", "http://")) as plain:
            try:
                refused = plain.get("/healthz").status_code
            except httpx.HTTPError:
                refused = -1
            assert refused != 200
    finally:
        gw.kill()


def _start_https(gw: Any, cert: Path) -> None:
    import time

    from tests.conftest import REPO, logbroker_cmd

    cmd = logbroker_cmd(
        "serve", "--data-dir", str(gw.data_dir), "--port", str(gw.port), *gw.extra_args
    )
    log = open(gw.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
    gw.proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if (
                httpx.get(
                    gw.url + "/healthz",
                    verify=ssl.create_default_context(cafile=str(cert)),
                    timeout=1,
                ).status_code
                == 200
            ):
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"https gateway did not start: {gw.log()}")
