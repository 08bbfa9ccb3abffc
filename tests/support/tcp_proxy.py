"""A TCP proxy between one process and Redis that a test can cut: a network partition on loopback.

    with TcpProxy(("127.0.0.1", redis_port)) as proxy:
        start_worker(proxy.url_of(redis_url), ...)
        proxy.blackhole()      # bytes stop flowing both ways; new connections hang: a dropped link
        proxy.heal()           # what was held goes through, in order, as TCP's retransmissions would
        proxy.refuse()         # every connection closed, new ones refused: a host that went away
        proxy.heal()           # connections accepted again, on the same port

One thread accepts, two per connection copy bytes; each waits on `flowing` before it passes anything on, so
a blackhole holds bytes (never drops them) until the link heals.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

_CHUNK = 65536


class TcpProxy:
    """Listens on a free loopback port and forwards each connection to `upstream`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.flowing = threading.Event()
        self.flowing.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._listener = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._start_accepting()

    def url_of(self, redis_url: str) -> str:
        """`redis_url` with its host and port replaced by the proxy's."""
        parts = urlsplit(redis_url)
        auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit((parts.scheme, f"{auth}127.0.0.1:{self.port}", parts.path, parts.query, ""))

    # --- faults ----------------------------------------------------------------------------------------

    def blackhole(self) -> None:
        """Stop passing bytes (held, not dropped) and stop accepting: every Redis call through it hangs."""
        self.flowing.clear()

    def refuse(self) -> None:
        """Close every connection and the listener: calls fail at once, reconnects are refused."""
        self.flowing.clear()
        with self._lock:
            listener, self._listener = self._listener, None
            doomed = list(self._sockets)
        if listener is not None:
            listener.close()
        for sock in doomed:
            _close(sock)

    def heal(self) -> None:
        """Let bytes flow again; after `refuse`, listen again on the same port."""
        with self._lock:
            reopen = self._listener is None and not self._closed
            if reopen:
                self._listener = self._listen(self.port)
        if reopen:
            self._start_accepting()
        self.flowing.set()

    # --- plumbing --------------------------------------------------------------------------------------

    @staticmethod
    def _listen(port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        return listener

    def _start_accepting(self) -> None:
        listener = self._listener
        assert listener is not None
        threading.Thread(target=self._accept, args=(listener,), name="proxy-accept", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refused or shut down
            self.flowing.wait()
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._closed or self._listener is not listener:
                    _close(client)
                    _close(server)
                    continue
                self._sockets |= {client, server}
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(_CHUNK):
                self.flowing.wait()
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                _close(sock)
                with self._lock:
                    self._sockets.discard(sock)

    def close(self) -> None:
        """Stop listening and close every connection."""
        with self._lock:
            self._closed = True
        self.refuse()
        self.flowing.set()  # release the pipes' waits: their sockets are closed

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
