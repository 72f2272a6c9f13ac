"""The connection layer of `seqrec serve`: uvicorn's h11 protocol with the limits that a server
facing clients it does not trust needs, which uvicorn leaves open (it closes a connection idle
*after* a response, but not one that never completes its request headers, nor one that sends a
byte now and then, and it caps nothing but concurrent requests).

    max_connections   open connections; one more evicts the connection idle the longest (no
                      request in flight), so idle clients can never lock out a real one
    header_timeout    seconds a connection may take to complete its next request's headers
                      (from its opening, or from its last response): idle and half-sent
                      requests are closed
    keep_alive        seconds an idle keep-alive connection is kept (uvicorn's own timer)
    max_requests      requests per connection, then it is closed after its response

Imported only by the server (it needs uvicorn, the `serve` extra). The limits are read from
`LIMITS`, which `seqrec.serving.service` sets in each process before the server starts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from seqrec.errors import ConfigError

__all__ = ["LIMITS", "ConnectionLimits", "GuardedH11Protocol", "guarded_protocol", "set_limits"]


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1000
    header_timeout: float = 10.0
    keep_alive: float = 5.0
    max_requests: int = 1000


LIMITS = ConnectionLimits()


def set_limits(limits: ConnectionLimits) -> None:
    global LIMITS
    LIMITS = limits


class _ConnectionGuard:
    """The limits, over either of uvicorn's HTTP protocols (they share these hooks): the
    connection cap (with eviction of the longest-idle connection), a header timeout and a
    per-connection request limit."""

    connections: Any
    loop: Any

    _header_timer: asyncio.TimerHandle | None = None
    _idle_since: float = 0.0
    _served: int = 0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._idle_since = time.monotonic()
        if len(self.connections) > LIMITS.max_connections:
            idle = [c for c in self.connections if c is not self and _idle(c)]
            if not idle:  # every connection is busy: this one waits for none of them
                self._close()
                return
            _close(min(idle, key=lambda c: getattr(c, "_idle_since", 0.0)))
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        cycle = getattr(self, "cycle", None)
        last = self._served + 1 >= LIMITS.max_requests
        if last and cycle is not None and not cycle.response_started:
            # the connection's last request: its answer says `connection: close`, so a client
            # that keeps connections open knows not to send another on it (httptools answers so
            # when the cycle is not kept alive, h11 when the request asked to close)
            cycle.keep_alive = False
            headers = cycle.scope["headers"]
            if (b"connection", b"close") not in headers:
                headers.append((b"connection", b"close"))

    def on_response_complete(self) -> None:
        self._served += 1
        self._idle_since = time.monotonic()
        if self._served >= LIMITS.max_requests:
            self._close()  # the response is written; a client reconnects for the next
            return
        super().on_response_complete()  # type: ignore[misc]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(LIMITS.header_timeout, self._header_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_late(self) -> None:
        self._header_timer = None
        if _idle(self):  # no request began since: its headers are late, or never coming
            self._close()

    def _close(self) -> None:
        _close(self)


class GuardedH11Protocol(_ConnectionGuard, H11Protocol):
    """uvicorn's pure-Python h11 protocol, guarded."""


_FAST: type | None = None
try:  # the `serve` extra brings httptools: a C parser, much faster than h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(_ConnectionGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol, guarded."""

    _FAST = GuardedHttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is in the serve extra
    pass


def guarded_protocol(kind: str = "auto") -> type:
    """The guarded protocol to serve with: "h11", "httptools", or "auto" (httptools when it is
    installed, else h11)."""
    if kind == "h11" or (kind == "auto" and _FAST is None):
        return GuardedH11Protocol
    if _FAST is None:
        raise ConfigError("--http httptools: httptools is not installed (pip install httptools)")
    return _FAST


def _idle(conn: Any) -> bool:
    """No request in flight on the connection (none begun, or its response complete)."""
    cycle = getattr(conn, "cycle", None)
    return cycle is None or bool(cycle.response_complete)


def _close(conn: Any) -> None:
    transport = getattr(conn, "transport", None)
    if transport is not None and not transport.is_closing():
        transport.close()
