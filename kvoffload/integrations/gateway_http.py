"""The gateway's HTTP side: read and check a client's request, answer it with a status it can
act on, relay a stream chunk by chunk.

HTTP/1.1 with chunked streams, so a client can tell a stream that ended from one that broke: a
replica that dies or stalls mid-stream gets the client an SSE ``error`` event and then a
connection closed without the terminating chunk (an incomplete response to any HTTP client).
"""

from __future__ import annotations

import http.client
import json
import re
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from kvoffload.integrations.gateway_deadline import WATCHDOG, Alarm
from kvoffload.integrations.gateway_upstream import MAX_BODY_BYTES, GatewayError, ReplicaRefused, Upstream

#: A stream's line longer than this is relayed in pieces (the client joins them).
MAX_LINE_BYTES = 1 << 20
_LENGTH = re.compile(r"[0-9]{1,15}")


@dataclass(frozen=True, slots=True)
class Routed:
    """Where one request goes: the replica, the selection service's reservation (None: round
    robin), with ``explain`` what the service saw cached for the prompt on each replica when it
    chose (``x-kvoffload-seen``: ``ID=DEVICE/HOST/DISK`` blocks, comma-separated), and the
    milliseconds the choice took (``x-kvoffload-route-ms``: tokenizing and the service's calls,
    part of the client's time to first token)."""

    worker: int
    selection_id: str | None = None
    seen: str | None = None
    route_ms: float | None = None


class Router(Protocol):
    """What the HTTP side asks of the gateway (``dynamo_gateway.Gateway``)."""

    timeout_s: float
    completion_timeout_s: float

    def route(self, body: dict[str, Any]) -> tuple[Routed, bytes, str]: ...
    def open_stream(self, body: dict[str, Any]) -> tuple[Routed, Upstream]: ...
    def prefilled(self, selection_id: str | None) -> None: ...
    def release(self, selection_id: str | None) -> None: ...


def _route_headers(routed: Routed) -> dict[str, str]:
    """The replica a response came from, and what the router saw when it chose (``explain``)."""
    headers = {"x-kvoffload-worker": str(routed.worker)}
    if routed.seen is not None:
        headers["x-kvoffload-seen"] = routed.seen
    if routed.route_ms is not None:
        headers["x-kvoffload-route-ms"] = f"{routed.route_ms:.1f}"
    return headers


class HalfBody(Exception):
    """The client's body stopped short of its Content-Length (it left, or ran out of time)."""


def _length(handler: BaseHTTPRequestHandler) -> int | None:
    """The request's Content-Length in ASCII digits (a superscript digit passes ``isdigit``
    and fails ``int``), None where absent."""
    length = handler.headers.get("Content-Length")
    if length is None:
        return None
    if not _LENGTH.fullmatch(length.strip()):
        raise GatewayError(400, f"Content-Length {length[:20]!r} is not a byte count")
    return int(length)


def _read_body(handler: BaseHTTPRequestHandler) -> dict[str, Any]:
    n = _length(handler)
    if n is None:
        raise GatewayError(411, "no Content-Length: send the JSON body with its length")
    if n > MAX_BODY_BYTES:
        raise GatewayError(413, f"a body of {n} bytes is over the gateway's {MAX_BODY_BYTES} bytes")
    data = handler.rfile.read(n)
    if len(data) < n:
        raise HalfBody()
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise GatewayError(400, "the body is not JSON: send one JSON object") from None
    if not isinstance(body, dict):
        raise GatewayError(400, f"the body is a JSON {type(body).__name__}: give a JSON object with a prompt")
    return body


def make_handler(gateway: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        #: A client that sends half a body is dropped after this long.
        timeout = gateway.timeout_s
        _alarm: Alarm | None = None

        def handle_one_request(self) -> None:
            """The request, its headers and its body must all arrive within the timeout (a
            socket timeout bounds each receive only: a byte every few seconds held a thread)."""
            self._alarm = WATCHDOG.arm(self.connection, gateway.timeout_s)
            try:
                super().handle_one_request()
            finally:
                self._alarm.disarm()
                if self._alarm.fired:
                    self.close_connection = True

        def _read(self) -> dict[str, Any]:
            """The request's body, read; the rest of the exchange is not the client's deadline."""
            try:
                return _read_body(self)
            finally:
                assert self._alarm is not None
                self._alarm.disarm()

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._drain()
                return self._reply(404, {"error": f"{self.path[:80]}: only /v1/completions is routed"})
            try:
                body = self._read()
                if body.get("stream"):
                    return self._stream(body)
                routed, data, content_type = gateway.route(body)
            except HalfBody:
                self.close_connection = True
                return None
            except GatewayError as exc:
                return self._reply(exc.status, {"error": str(exc)})
            except ReplicaRefused as exc:
                return self._raw(exc.status, exc.body, exc.content_type)
            self._raw(200, data, content_type, _route_headers(routed))

        def do_GET(self) -> None:
            self._drain()
            self._reply(405, {"error": f"GET {self.path[:80]}: POST /v1/completions"})

        def _drain(self) -> None:
            try:
                length = _length(self)
            except GatewayError:
                length = None
            if length is not None and (length > MAX_BODY_BYTES or len(self.rfile.read(length)) < length):
                self.close_connection = True  # a body not read whole: the next request cannot be found
            if self._alarm is not None:
                self._alarm.disarm()

        def _stream(self, body: dict[str, Any]) -> None:
            """Relay the replica's server-sent events as they come; the reservation's prefill
            ends with the first one, and it is freed before the client sees the end. Errors
            before the first byte get a status; after it, an error event and a broken chunked
            encoding."""
            try:
                routed, upstream = gateway.open_stream(body)
            except ReplicaRefused as exc:
                return self._raw(exc.status, exc.body, exc.content_type)
            wid, selection_id = routed.worker, routed.selection_id
            reserved = True
            try:
                with upstream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    for name, value in _route_headers(routed).items():
                        self.send_header(name, value)
                    self.end_headers()
                    fault = self._relay(upstream, selection_id, wid)
                reserved = False
                gateway.release(selection_id)
                if fault is None:
                    self._chunk(b"")  # the terminating chunk: a complete response
                    return
                self.close_connection = True  # no terminating chunk: the response is incomplete
                event = {"error": {"message": fault, "type": "upstream_error", "code": 502}}
                self._chunk(f"data: {json.dumps(event)}\n\n".encode())
            except OSError:
                self.close_connection = True  # the client left: nobody to tell
            finally:
                if reserved:
                    gateway.release(selection_id)

        def _relay(self, upstream: Upstream, selection_id: str | None, wid: int) -> str | None:
            """Copy the stream; None if it ended with ``[DONE]``, else what went wrong."""
            first, done = True, False
            try:
                while line := upstream.readline(MAX_LINE_BYTES):
                    try:
                        self._chunk(line)
                    except OSError:
                        return None  # the client left: the replica's stream is closed with ours
                    done = done or line.strip() == b"data: [DONE]"
                    if first:
                        first = False
                        gateway.prefilled(selection_id)
            except TimeoutError:
                return f"replica {wid} went silent for {gateway.completion_timeout_s:g} s mid-stream"
            except (OSError, http.client.HTTPException) as exc:
                return f"replica {wid} broke off the stream ({type(exc).__name__})"
            return None if done else f"replica {wid} ended the stream before [DONE]"

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            self._raw(status, json.dumps(body).encode(), "application/json", headers)

        def _raw(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
