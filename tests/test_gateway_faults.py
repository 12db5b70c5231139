"""The routing gateway under faults, against stand-ins: every request gets an HTTP status within a
bounded time — 4xx for malformed bodies of every JSON type, the replica's own status where it
refuses, 502/503/504 with a one-line reason for dead, hung or nonsensical upstreams — and a
stream whose replica dies or stalls mid-way ends in an error the client can see."""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import struct
import threading
import time
from typing import Any

import pytest

from kvoffload.integrations import dynamo_gateway as gw
from tests.test_dynamo_gateway import Stub, replica

TIMEOUT_S = 1.0


def dead_url() -> str:
    """A loopback port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


class RawServer:
    """A TCP server whose handler is a function of the connected socket (hangs, half answers)."""

    def __init__(self, handle) -> None:  # type: ignore[no-untyped-def]
        self.release = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                handle(self.request, outer.release)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _read_request(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
                  0)
    while len(rest) < length:
        rest += sock.recv(65536)


def hang(sock: socket.socket, release: threading.Event) -> None:
    """Accept, read the request, never answer."""
    _read_request(sock)
    release.wait(30)


def stream_then(action: str):  # type: ignore[no-untyped-def]
    """Answer a streaming completion with one event, then die (close) or stall."""
    def handle(sock: socket.socket, release: threading.Event) -> None:
        _read_request(sock)
        event = b"data: {\"text\": \"a\"}\n\n"
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(event):x}\r\n".encode() + event + b"\r\n")
        if action == "stall":
            release.wait(30)
        sock.close()  # dies mid-stream: no terminating chunk
    return handle


def request(port: int, body: bytes | None, headers: dict[str, str] | None = None,
            path: str = "/v1/completions") -> tuple[int, bytes, float]:
    """(status, body, seconds) of one request to the gateway; a broken body reads as far as it got."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Content-Type": "application/json", **(headers or {})}
    if body is not None and "Content-Length" not in h:
        h["Content-Length"] = str(len(body))
    conn.putrequest("POST", path)
    for k, v in h.items():
        conn.putheader(k, v)
    conn.endheaders(body)
    resp = conn.getresponse()
    try:
        data = resp.read()
    except http.client.IncompleteRead as exc:
        data = exc.partial + b"<INCOMPLETE>"
    conn.close()
    return resp.status, data, time.monotonic() - t0


@pytest.fixture
def servers():
    made: list[Any] = []
    yield made
    for s in made:
        s.close()


GATEWAYS: list[gw.Gateway] = []


def gateway(servers, selector: str | None, workers: dict[int, str], **options: Any) -> int:
    g = gw.Gateway(selector, workers, timeout_s=TIMEOUT_S, completion_timeout_s=TIMEOUT_S, **options)
    GATEWAYS.append(g)
    server = gw.serve(g, "127.0.0.1", 0)
    servers.append(type("S", (), {"close": lambda self: server.shutdown()})())
    return server.server_address[1]


def settled() -> bool:
    """The last gateway's reservation calls were sent (they go after the client's answer)."""
    return GATEWAYS[-1].settle()


def selector_choosing(wid: Any) -> Stub:
    return Stub(lambda m, p, b: (200, {"worker_id": wid} if p == "/select_and_reserve" else {}, "application/json"))


@pytest.mark.parametrize("body, status, reason", [
    (b"[1, 2, 3]", 400, "the body is a JSON list"),
    (b'"hi"', 400, "the body is a JSON str"),
    (b"7", 400, "the body is a JSON int"),
    (b"7.5", 400, "the body is a JSON float"),
    (b"true", 400, "the body is a JSON bool"),
    (b"null", 400, "the body is a JSON NoneType"),
    (b"{}", 400, "prompt null: give one prompt"),
    (b'{"prompt": {"a": 1}}', 400, "prompt a dict: give one prompt"),
    (b'{"prompt": [1, "x"]}', 400, "prompt a list: give one prompt"),
    (b'{"prompt": [1, -5]}', 400, "give one prompt"),
    (b'{"prompt": ""}', 400, "give one prompt"),
    (b"{not json", 400, "the body is not JSON"),
    (b"[" * 100000 + b"]" * 100000, 400, "the body is"),
])
def test_malformed_bodies_get_a_4xx_naming_the_fault(servers, body, status, reason):
    selector = selector_choosing(1)
    r1 = replica("r1")
    servers += [selector, r1]
    port = gateway(servers, selector.url, {1: r1.url})
    got, data, seconds = request(port, body)
    assert got == status and reason in json.loads(data)["error"], data[:200]
    assert seconds < 5 and r1.calls == [] and selector.calls == []


def test_a_missing_or_absurd_length_is_refused(servers):
    r1 = replica("r1")
    servers.append(r1)
    port = gateway(servers, None, {1: r1.url})
    assert request(port, None)[0] == 411
    assert request(port, b"", {"Content-Length": "12abc"})[0] == 400
    status, data, _ = request(port, b"{}", {"Content-Length": str(1 << 40)})
    assert status == 413 and b"bytes is over" in data
    status, data, _ = request(port, b"{}", path="/v1/chat/completions")
    assert status == 404


def test_text_prompts_are_tokenized_by_a_live_replica(servers):
    """Replica 1 is dead: text prompts were always tokenized through the first worker, so every
    text request got 502 even when the service picked the live replica."""
    r2 = Stub(lambda m, p, b: (200, {"tokens": [4, 5, 6]} if p == "/tokenize" else {"served_by": "r2"},
                               "application/json"))
    selector = selector_choosing(2)
    servers += [r2, selector]
    port = gateway(servers, selector.url, {1: dead_url(), 2: r2.url})
    for _ in range(3):
        status, data, _ = request(port, json.dumps({"prompt": "hello"}).encode())
        assert status == 200 and json.loads(data) == {"served_by": "r2"}
    assert selector.calls[0][2]["token_ids"] == [4, 5, 6]
    # With no replica able to tokenize: 503, naming each replica's fault.
    port = gateway(servers, selector.url, {1: dead_url(), 2: dead_url()})
    status, data, _ = request(port, json.dumps({"prompt": "hello"}).encode())
    assert status == 503 and b"replica 1" in data and b"replica 2" in data


def test_a_hung_selection_service_gets_a_504_within_the_timeout(servers):
    """It used to hold the client 600 s and then drop it with no response (a TimeoutError is
    not a URLError)."""
    hung = RawServer(hang)
    r1 = replica("r1")
    servers += [hung, r1]
    port = gateway(servers, hung.url, {1: r1.url})
    status, data, seconds = request(port, b'{"prompt": [1, 2]}')
    assert status == 504 and b"the selection service did not answer within 1 s" in data
    assert seconds < TIMEOUT_S + 2 and r1.calls == []


@pytest.mark.parametrize("answer, reason", [
    ({"worker_id": 9}, b"chose worker 9, which is not one of this gateway's --worker ids (1)"),
    ({"worker_id": "1"}, b"chose worker 1, which is not one of"),
    ({}, b"chose worker None"),
])
def test_a_selection_the_gateway_cannot_follow_is_a_502(servers, answer, reason):
    selector = Stub(lambda m, p, b: (200, answer if p == "/select_and_reserve" else {}, "application/json"))
    r1 = replica("r1")
    servers += [selector, r1]
    port = gateway(servers, selector.url, {1: r1.url})
    status, data, _ = request(port, b'{"prompt": [1]}')
    assert status == 502 and reason in data
    assert settled() and [c[0] for c in selector.calls] == ["POST", "DELETE"]  # its reservation freed


def test_upstream_errors_and_nonsense(servers):
    broken = Stub(lambda m, p, b: (500, b"<html>oops</html>", "text/html"))
    garbage = Stub(lambda m, p, b: (200, b"not json at all", "text/plain"))
    refusing = Stub(lambda m, p, b: (400, {"error": {"message": "max_tokens too large"}}, "application/json"))
    servers += [broken, garbage, refusing]
    status, data, _ = request(gateway(servers, broken.url, {1: refusing.url}), b'{"prompt": [1]}')
    assert status == 502 and b"the selection service answered HTTP 500: <html>oops</html>" in data
    status, data, _ = request(gateway(servers, garbage.url, {1: refusing.url}), b'{"prompt": [1]}')
    assert status == 502 and b"not JSON: not json at all" in data
    # A replica's own refusal is the client's answer, status and body as they are.
    for stream in (False, True):
        status, data, _ = request(gateway(servers, None, {1: refusing.url}),
                                  json.dumps({"prompt": [1], "stream": stream}).encode())
        assert status == 400 and json.loads(data) == {"error": {"message": "max_tokens too large"}}


def test_dead_and_hung_replicas_get_a_status_in_bounded_time(servers):
    hung = RawServer(hang)
    servers.append(hung)
    for url, status, reason in ((dead_url(), 502, b"is unreachable"), (hung.url, 504, b"did not answer within 1 s")):
        for stream in (False, True):
            got, data, seconds = request(gateway(servers, None, {1: url}),
                                         json.dumps({"prompt": [1], "stream": stream}).encode())
            assert got == status and reason in data and seconds < TIMEOUT_S + 2


@pytest.mark.parametrize("action, reason", [("die", b"ended the stream before [DONE]"), ("stall", b"went silent for 1 s")])
def test_a_replica_failing_mid_stream_ends_the_stream_with_a_visible_error(servers, action, reason):
    """A replica dying mid-stream used to end the client's stream as if it were done."""
    bad = RawServer(stream_then(action))
    selector = selector_choosing(1)
    servers += [bad, selector]
    port = gateway(servers, selector.url, {1: bad.url})
    status, data, seconds = request(port, b'{"prompt": [1], "stream": true}')
    assert status == 200 and seconds < TIMEOUT_S + 3
    assert data.startswith(b'data: {"text": "a"}\n\n')
    assert b'"type": "upstream_error"' in data and reason in data
    assert data.endswith(b"<INCOMPLETE>")  # no terminating chunk: any HTTP client sees a broken response
    assert settled() and [c[0] for c in selector.calls][-1] == "DELETE"  # the reservation is freed


def test_a_whole_stream_ends_cleanly(servers):
    r1 = replica("r1")
    servers.append(r1)
    status, data, _ = request(gateway(servers, None, {1: r1.url}), b'{"prompt": [1], "stream": true}')
    assert status == 200 and data == b"data: r1-1\n\ndata: [DONE]\n\n"


def test_clients_that_reset_their_connection_leave_no_traceback_and_the_gateway_serves_on(servers, capfd, caplog):
    """A client that resets (a pool dropping a keep-alive connection, a killed client) before or
    after its request: the standard server printed a traceback to stderr per reset (seven in a
    routed benchmark run), burying the gateway's own errors."""
    r1 = replica("r1")
    servers.append(r1)
    port = gateway(servers, None, {1: r1.url})
    for payload in (b"", b"POST /v1/comp"):  # nothing sent, or half a request line
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(payload)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        s.close()
    time.sleep(0.3)  # the handler threads meet the resets
    status, data, _ = request(port, b'{"prompt": [1]}')
    assert status == 200 and json.loads(data) == {"served_by": "r1"}
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
