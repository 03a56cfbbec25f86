"""Before a gateway on Kafka joins the gateways' group: does its ``advertised_url`` reach it?

The other gateways send the transactions of the partitions a gateway owns to the URL it
advertises, and the push-clients that write to owners directly go there too.  A URL that
reaches another gateway (two started with one URL by mistake) or nothing (a typo in the port)
used to be found out only by the writes of the partitions the gateway was given, which then
failed for as long as it ran.  So, before joining, the gateway listens on its bound socket with
a stand-in that answers every request 503 "starting" with a random id of this start, asks
``advertised_url + "/healthz"`` for it, and refuses to start (exit 2) unless it hears its own
id back:

- another gateway answers there (its ``/healthz``, or another stand-in): at once, "two
  gateways cannot share an advertised_url";
- nothing that names this start answers within the wait (a load balancer or a NAT in front may
  take a moment): "does not reach this gateway".

The stand-in answers 503, so a monitor or a test that waits for ``/healthz`` 200 does not take
the gateway for started.  A front that routes to the gateway only once it is *ready* (a
load balancer whose health check asks ``/readyz``, a Kubernetes Service behind a readiness
probe) cannot pass this check: such deployments turn it off (``--advertised-url-check 0``)
and make sure of the URL another way.
"""

from __future__ import annotations

import secrets
import socket
import ssl
import threading
import time

import httpx
import orjson

_ASK_TIMEOUT_S = 2.0
_PAUSE_S = 0.25
_HEAD_LIMIT = 16 * 1024
_CONNECTION_S = 1.0
DEFAULT_WAIT_S = 10.0


class AdvertisedUrlWrong(Exception):
    """The advertised URL does not reach this gateway; the message says what it reaches."""


def check_advertised_url(
    sock: socket.socket,
    url: str,
    *,
    wait_s: float,
    stopped: threading.Event,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> bool:
    """Return True once ``url`` reaches the listener of ``sock`` (bound, made to listen
    here); False if ``stopped`` is set first; ``AdvertisedUrlWrong`` if it reaches another
    gateway, or nothing of this one within ``wait_s``."""
    start_id = secrets.token_hex(8)
    tls = None
    if ssl_certfile:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(ssl_certfile, ssl_keyfile)
    sock.listen(2048)
    stand_in = _StandIn(sock, start_id, tls)
    stand_in.start()
    try:
        return _ask(url.rstrip("/") + "/healthz", start_id, wait_s, stopped)
    finally:
        stand_in.stop()


def _ask(healthz: str, start_id: str, wait_s: float, stopped: threading.Event) -> bool:
    deadline = time.monotonic() + wait_s
    last = "no answer"
    with httpx.Client(timeout=httpx.Timeout(_ASK_TIMEOUT_S)) as client:
        while not stopped.is_set():
            try:
                response = client.get(healthz)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                verdict = _verdict(response, start_id)
                if verdict is None:
                    return True
                if verdict.startswith("another gateway"):
                    raise AdvertisedUrlWrong(
                        f"{verdict} at {healthz.removesuffix('/healthz')}: two gateways cannot "
                        "share an advertised_url; give this one its own (--advertised-url), "
                        "or stop the other"
                    )
                last = verdict
            if time.monotonic() >= deadline:
                raise AdvertisedUrlWrong(
                    f"{healthz.removesuffix('/healthz')} does not reach this gateway: check "
                    f"--advertised-url (asked for {wait_s:g} s; last: {last}).  A front that "
                    "routes to the gateway only once it is ready cannot be checked before: "
                    "--advertised-url-check 0 turns the check off"
                )
            stopped.wait(_PAUSE_S)
    return False


def _verdict(response: httpx.Response, start_id: str) -> str | None:
    """None if the answer is this start's stand-in; else what answered."""
    try:
        doc = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return f"HTTP {response.status_code}, not a gateway's answer"
    instance = doc.get("instance")
    if instance == start_id:
        return None
    if response.status_code == 200 and doc.get("status") == "ok":
        named = f" (instance {instance})" if isinstance(instance, str) else ""
        return f"another gateway{named} answers"
    if doc.get("error") == "not_ready" and isinstance(instance, str):
        return f"another gateway starting (start {instance}) answers"
    return f"HTTP {response.status_code}: {response.text[:200]}"


class _StandIn:
    """Answers every request on the listening socket 503 "starting", naming ``start_id``,
    one connection at a time, until stopped; what connects after that waits for the server."""

    def __init__(self, sock: socket.socket, start_id: str, tls: ssl.SSLContext | None) -> None:
        self._sock = sock
        self._tls = tls
        self._stop = threading.Event()
        body = orjson.dumps(
            {
                "error": "not_ready",
                "reason": "the gateway is starting (checking its advertised_url)",
                "instance": start_id,
            }
        )
        self._answer = (
            b"HTTP/1.1 503 Service Unavailable\r\n"
            b"Content-Type: application/json\r\n"
            b"Retry-After: 1\r\n"
            b"Connection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self._thread = threading.Thread(target=self._run, name="logbroker-url-check", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        self._sock.settimeout(0.1)
        try:
            while not self._stop.is_set():
                try:
                    conn, _addr = self._sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                self._serve(conn)
        finally:
            self._sock.settimeout(None)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(_CONNECTION_S)
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            conn.sendall(self._answer)
        except OSError:
            return  # a client that sends nothing, or no TLS: not this check's business
        finally:
            conn.close()
