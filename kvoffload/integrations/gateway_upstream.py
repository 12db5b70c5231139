"""The gateway's calls to its upstreams (the selection service, the replicas): every fault is
a ``GatewayError`` carrying the status the client gets and a one-line reason; a replica's own
error status is a ``ReplicaRefused``, relayed as it is.

Each call has one deadline for the whole exchange (``gateway_deadline``), not a bound per
receive, and reads at most ``limit`` bytes of an answer: an upstream that drips its answer or
sends a hundred megabytes holds neither a thread nor memory. A replica that cannot be reached
at all is told apart (``Unreachable``): the request never reached it, so it may go elsewhere.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from typing import Any

from kvoffload.integrations.gateway_deadline import WATCHDOG, Alarm

#: Seconds an upstream call may take: the selection service and /tokenize, and a completion
#: (a non-streaming one answers only when it is done, so it gets longer).
TIMEOUT_S = 10.0
COMPLETION_TIMEOUT_S = 300.0
#: The largest request body taken (a prompt of a million tokens is ~8 MB of JSON), and the
#: largest answer read from a replica; the selection service's answers are far smaller.
MAX_BODY_BYTES = 32 << 20
MAX_SERVICE_ANSWER_BYTES = 4 << 20


class GatewayError(Exception):
    """A request that cannot be served: the HTTP status to answer and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(GatewayError):
    """No connection could be made: the upstream never saw the request."""

    def __init__(self, message: str) -> None:
        super().__init__(502, message)


class ServiceRefused(GatewayError):
    """An upstream answered with an error status where its answer is not relayed."""

    def __init__(self, upstream_status: int, message: str) -> None:
        super().__init__(502, message)
        self.upstream_status = upstream_status


class ReplicaRefused(Exception):
    """The replica answered with an error status: relayed to the client as it is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.content_type = status, body, content_type


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip().splitlines()
    return text[0][:200] if text else "(empty body)"


class Upstream:
    """One open exchange with an upstream whose status was a success: the answer is read
    from ``response``; ``close`` ends the connection. ``alarm`` fired: the call's deadline
    passed and the connection was shut down under the reader."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, alarm: Alarm) -> None:
        self.conn, self.response, self.alarm = conn, response, alarm

    def readline(self, limit: int) -> bytes:
        return self.response.readline(limit)

    def close(self) -> None:
        self.alarm.disarm()
        self.response.close()
        self.conn.close()

    def __enter__(self) -> Upstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    return kind(parts.hostname or "", parts.port, timeout=timeout_s), path + (f"?{parts.query}" if parts.query else "")


def _read_limited(response: http.client.HTTPResponse, limit: int, what: str) -> bytes:
    data = response.read(limit + 1)
    if len(data) > limit:
        raise GatewayError(502, f"{what} sent an answer over {limit} bytes: not one the gateway relays")
    return data


def open_url(url: str, body: Any, method: str, timeout_s: float, what: str,
             limit: int = MAX_SERVICE_ANSWER_BYTES, whole: float | None = None) -> Upstream:
    """An exchange whose answer's head arrived within ``timeout_s`` (the caller reads the rest
    and closes it); faults as GatewayError, an error status as ReplicaRefused (its body read,
    at most ``limit`` bytes). ``whole``: seconds the alarm stays armed, from now, for the
    caller's reads as well (None: only until the head arrived; later reads are then bounded
    by the socket's silence timeout)."""
    data = None if body is None else json.dumps(body).encode()
    conn, path = _connection(url, timeout_s)
    started = time.monotonic()
    try:
        conn.connect()
    except TimeoutError:
        conn.close()
        raise GatewayError(504, f"{what} did not answer within {timeout_s:g} s") from None
    except (OSError, ValueError) as exc:
        conn.close()
        raise Unreachable(f"{what} at {url} is unreachable ({exc})") from None
    assert conn.sock is not None
    # The connection's own time counts: the exchange as a whole stays within its bound.
    alarm = WATCHDOG.arm(conn.sock, max((timeout_s if whole is None else whole) - (time.monotonic() - started), 1e-3))
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status >= 400:
            with response:
                refused = ReplicaRefused(response.status, _read_limited(response, limit, what),
                                         response.getheader("Content-Type", "application/json"))
            raise refused
        if whole is None:
            alarm.disarm()
        return Upstream(conn, response, alarm)
    except (ReplicaRefused, GatewayError):
        alarm.disarm()
        conn.close()
        raise
    except (OSError, http.client.HTTPException) as exc:
        alarm.disarm()
        conn.close()
        raise _fault(exc, alarm, what, timeout_s if whole is None else whole) from None


def _fault(exc: BaseException, alarm: Alarm, what: str, seconds: float) -> GatewayError:
    if alarm.fired or isinstance(exc, TimeoutError):
        return GatewayError(504, f"{what} did not answer within {seconds:g} s")
    return GatewayError(502, f"{what} broke off its answer ({type(exc).__name__})")


def call_raw(url: str, body: Any = None, method: str = "POST", timeout_s: float = TIMEOUT_S,
             what: str = "upstream", relay: bool = False,
             limit: int = MAX_SERVICE_ANSWER_BYTES) -> tuple[bytes, str]:
    """One call's answer as it came (bytes, content type), all of it within ``timeout_s``; any
    fault or error status is a GatewayError (502/504), but an error status is a ReplicaRefused
    where ``relay`` (a replica's answer to its client)."""
    try:
        upstream = open_url(url, body, method, timeout_s, what, limit, whole=timeout_s)
    except ReplicaRefused as exc:
        if relay:
            raise
        raise ServiceRefused(exc.status, f"{what} answered HTTP {exc.status}: {_first_line(exc.body)}") from None
    with upstream:
        try:
            data = _read_limited(upstream.response, limit, what)
        except (OSError, http.client.HTTPException) as exc:
            raise _fault(exc, upstream.alarm, what, timeout_s) from None
        if upstream.alarm.fired:  # an answer without a length ends where the deadline cut it
            raise GatewayError(504, f"{what} did not answer within {timeout_s:g} s")
    return data, upstream.response.getheader("Content-Type", "application/json")


def parse_json(data: bytes, what: str) -> Any:
    """An upstream's JSON answer ({} for an empty one); nonsense, or nesting too deep to
    parse, is a 502."""
    try:
        return json.loads(data) if data.strip() else {}
    except (ValueError, RecursionError):
        raise GatewayError(502, f"{what} sent an answer that is not JSON: {_first_line(data)}") from None


def call(url: str, body: Any = None, method: str = "POST", timeout_s: float = TIMEOUT_S,
         what: str = "upstream", relay: bool = False, limit: int = MAX_SERVICE_ANSWER_BYTES) -> Any:
    """One JSON call (``call_raw``), its answer parsed."""
    return parse_json(call_raw(url, body, method, timeout_s, what, relay, limit)[0], what)

