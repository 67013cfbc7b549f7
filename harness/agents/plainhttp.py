"""A lean transport for the HTTP client, for model servers reached by plain ``http://`` with no
proxy (a local vLLM, Ollama or the fake server): the standard library's ``http.client`` over
kept-alive connections, in place of the client's own connection pool.

The client's pool is built for every case (HTTP/2, TLS, proxies, async) and costs about a
third of a model call's CPU in a trial that does little else; a plain HTTP/1.1 exchange needs
none of it. Everything above the transport is the client's as before: its headers, timeouts,
hooks, redirects and response types; errors are raised as the client's own exception types
(a refused connection as ``ConnectError``, a timeout as ``ConnectTimeout`` or ``ReadTimeout``,
a connection lost as ``RemoteProtocolError`` or ``ReadError``), so they are told as before.
"""

from __future__ import annotations

import functools
import http.client
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

KEEP_ALIVE = 100
"""Idle connections kept per server (the official client's ``max_keepalive_connections``)."""

KEEP_ALIVE_FOR = 4.0
"""Seconds an idle connection is kept (the official client's pool keeps one 5 s): servers
close theirs after a few seconds (uvicorn's default is 5), and one that closes it just as a
request goes out loses the request."""

CHUNK = 65536


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read now (an idle connection: the server closed it)."""
    if hasattr(select, "poll"):  # (no limit on the descriptor's number, as select has)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


@functools.cache
def plain_transport_type(library: Any) -> type:
    """The transport class for the HTTP library ``library`` (``httpx`` or its successor): a
    subclass of its ``BaseTransport`` that raises its exception types."""

    def _lost(exc: BaseException, kind: Any) -> Exception:
        """The library's error for an exchange cut short by ``exc``: a timeout as
        ``ReadTimeout``, anything else as ``kind``."""
        if isinstance(exc, TimeoutError):
            return library.ReadTimeout(str(exc) or "timed out")  # type: ignore[no-any-return]
        return kind(f"{type(exc).__name__}: {exc}")  # type: ignore[no-any-return]

    class _Body(library.SyncByteStream):  # type: ignore[misc]
        """A response's body as it arrives; the connection goes back to the pool once the
        body was read to its end (closed instead when it was not, or the server closes it)."""

        def __init__(self, owner: Any, conn: Any, response: Any) -> None:
            self._owner = owner
            self._conn = conn
            self._response = response
            self._done = False

        def __iter__(self) -> Iterator[bytes]:
            while True:
                try:
                    chunk = self._response.read1(CHUNK)  # (what has come, up to CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    self.close()
                    raise _lost(exc, library.ReadError) from exc
                if not chunk:
                    owed = self._response.length  # (bytes the Content-Length still promises)
                    if owed:
                        self.close()
                        raise library.RemoteProtocolError(
                            f"the server closed the connection {owed} bytes short of the "
                            "body's Content-Length"
                        )
                    self._done = True
                    return
                yield chunk

        def close(self) -> None:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            response = self._response
            response.close()  # (the connection's socket stays open for the next request)
            if self._done and not response.will_close:
                self._owner._give_back(conn)
            else:
                conn.close()

    class PlainHTTPTransport(library.BaseTransport):  # type: ignore[misc]
        """HTTP/1.1 over ``http.client`` connections kept alive per server (thread-safe)."""

        def __init__(self) -> None:
            self._lock = threading.Lock()
            # Idle connections per server, each with when it was given back (monotonic).
            self._idle: dict[tuple[str, int], list[tuple[http.client.HTTPConnection, float]]] = {}
            self._closed = False

        def handle_request(self, request: Any) -> Any:
            url = request.url
            if url.scheme != "http":
                raise library.UnsupportedProtocol(f"plain HTTP only, not {url.scheme!r}")
            key = (url.host, url.port or 80)
            timeout = request.extensions.get("timeout") or {}
            body = request.read()
            target = url.raw_path.decode("ascii")
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
            conn = self._take(key) or self._connect(key, timeout)
            try:
                response = self._exchange(conn, request.method, target, headers, body)
            except (OSError, http.client.HTTPException) as exc:
                # (sent, or partly: never sent again here, as the client's own pool does not)
                conn.close()
                raise _lost(exc, library.RemoteProtocolError) from exc
            return library.Response(
                status_code=response.status,
                headers=response.getheaders(),
                stream=_Body(self, conn, response),
                extensions={
                    "http_version": b"HTTP/1.1",
                    "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
                },
            )

        @staticmethod
        def _exchange(
            conn: http.client.HTTPConnection,
            method: str,
            target: str,
            headers: list[tuple[str, str]],
            body: bytes,
        ) -> http.client.HTTPResponse:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body or None)
            return conn.getresponse()

        def _connect(self, key: tuple[str, int], timeout: dict[str, Any]) -> Any:
            conn = http.client.HTTPConnection(key[0], key[1], timeout=timeout.get("connect"))
            try:
                conn.connect()
            except TimeoutError as exc:
                raise library.ConnectTimeout(str(exc) or "timed out") from exc
            except OSError as exc:
                raise library.ConnectError(f"{type(exc).__name__}: {exc}") from exc
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # (one timeout for writing the request and waiting for each read of the answer:
            # the client's read timeout, which is its write timeout too unless told apart)
            conn.sock.settimeout(timeout.get("read"))
            return conn

        def _take(self, key: tuple[str, int]) -> http.client.HTTPConnection | None:
            """An idle connection to ``key`` the server has not closed meanwhile (one it closed
            reads as ready, at its end: it is dropped, as the client's own pool drops it)."""
            while True:
                with self._lock:
                    idle = self._idle.get(key)
                    conn, since = idle.pop() if idle else (None, 0.0)
                if conn is None:
                    return None
                fresh = time.monotonic() - since < KEEP_ALIVE_FOR
                if fresh and conn.sock is not None and not _readable(conn.sock):
                    return conn
                conn.close()

        def _give_back(self, conn: http.client.HTTPConnection) -> None:
            key = (conn.host, conn.port)
            with self._lock:
                idle = self._idle.setdefault(key, [])
                if not self._closed and len(idle) < KEEP_ALIVE:
                    idle.append((conn, time.monotonic()))
                    return
            conn.close()

        def close(self) -> None:
            with self._lock:
                self._closed = True
                idle = [c for conns in self._idle.values() for c, _ in conns]
                self._idle.clear()
            for conn in idle:
                conn.close()

    return PlainHTTPTransport
