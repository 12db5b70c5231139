"""The gateway's calls to its upstreams (the selection service, the replicas): every fault is
a ``GatewayError`` carrying the status the client gets and a one-line reason; a replica's own
error status is a ``ReplicaRefused``, relayed as it is."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

#: Seconds an upstream call may stay silent: the selection service and /tokenize, and a
#: completion (a non-streaming one answers only when it is done, so it gets longer).
TIMEOUT_S = 10.0
COMPLETION_TIMEOUT_S = 300.0
#: The largest request body taken (a prompt of a million tokens is ~8 MB of JSON).
MAX_BODY_BYTES = 32 << 20


class GatewayError(Exception):
    """A request that cannot be served: the HTTP status to answer and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ReplicaRefused(Exception):
    """The replica answered with an error status: relayed to the client as it is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.content_type = status, body, content_type


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip().splitlines()
    return text[0][:200] if text else "(empty body)"


def open_url(url: str, body: Any, method: str, timeout_s: float, what: str) -> http.client.HTTPResponse:
    """The response of one upstream call (the caller closes it); faults as GatewayError,
    an error status as ReplicaRefused (the caller decides whether to relay it)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        with exc:
            raise ReplicaRefused(exc.code, exc.read(), exc.headers.get("Content-Type", "application/json")) from None
    except TimeoutError:
        raise GatewayError(504, f"{what} did not answer within {timeout_s:g} s") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise GatewayError(504, f"{what} did not answer within {timeout_s:g} s") from None
        raise GatewayError(502, f"{what} at {url} is unreachable ({exc.reason})") from None
    except (OSError, http.client.HTTPException) as exc:
        raise GatewayError(502, f"{what} at {url} failed ({type(exc).__name__}: {exc})") from None


def call(url: str, body: Any = None, method: str = "POST", timeout_s: float = TIMEOUT_S,
         what: str = "upstream", relay: bool = False) -> Any:
    """One JSON call; any fault, error status or non-JSON answer is a GatewayError (502/504),
    but an error status is a ReplicaRefused where ``relay`` (a replica's answer to its client)."""
    try:
        with open_url(url, body, method, timeout_s, what) as resp:
            text = resp.read()
    except ReplicaRefused as exc:
        if relay:
            raise
        raise GatewayError(502, f"{what} answered HTTP {exc.status}: {_first_line(exc.body)}") from None
    except TimeoutError:
        raise GatewayError(504, f"{what} did not answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise GatewayError(502, f"{what} broke off its answer ({type(exc).__name__})") from None
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        raise GatewayError(502, f"{what} sent an answer that is not JSON: {_first_line(text)}") from None
