"""A TCP proxy a test can cut and restore: the way between a gateway and its Kafka broker.

Kafka clients connect to whatever address the broker *advertises*, so a proxy in front of a
plain listener would be bypassed after the first metadata answer.  The local cluster's nodes
each have a second listener, ``PROXIED``, advertised at a port nobody listens on; this proxy
listens there and forwards to the node's real ``PROXIED`` port.  A client bootstrapped at
the advertised port then reaches the broker only through the proxy.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Forwards ``listen_port`` to ``target_port`` on loopback until cut."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self._server: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.lose_answers = False
        """While set, whatever the target answers is thrown away and the connection broken:
        the request arrived and was acted on, the client never hears how it went."""
        self.answers_lost = 0

    def start(self) -> TcpProxy:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.listen_port))
        server.listen(64)
        self._server = server
        thread = threading.Thread(target=self._accept, args=(server,), daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # cut: the listening socket was closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(a, b, answers), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if answers and self.lose_answers:
                    with self._lock:
                        self.answers_lost += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
                with self._lock:
                    self._sockets.discard(sock)

    def cut(self) -> None:
        """Refuse new connections and break every open one, as a failed network would."""
        if self._server is not None:
            with contextlib.suppress(OSError):  # wakes the accepting thread: the port is free
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def restore(self) -> None:
        self.start()

    def close(self) -> None:
        self.cut()
