"""Hostile round 7 against the gateway: upstream answers nested past any parser, huge or dripped;
Content-Length written in other digits; flags that passed the parser and then killed every
request; a header listing every worker a foreign service knows; clients that hold a thread.
Each request gets an HTTP status (no traceback, no thread held), in bounded time and memory."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.integrations import dynamo_gateway as gw
from kvoffload.integrations import gateway_cli
from tests.test_dynamo_gateway import Stub, replica
from tests.test_gateway_faults import TIMEOUT_S, RawServer, _read_request, gateway, request, servers, settled

__all__ = ["servers"]

NESTED = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("where", ["/select_and_reserve", "/overlap_scores", "/tokenize", "completion"])
def test_answers_nested_past_the_parser_are_a_502(servers, where, caplog):
    """200 KB of nested brackets: RecursionError escaped `except ValueError`, the request died
    with a traceback and its reservation was never released."""
    def service(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == where:
            return 200, NESTED, "application/json"
        if path == "/overlap_scores":
            return 200, {"workers": []}, "application/json"
        return 200, {"worker_id": 1} if path == "/select_and_reserve" else {}, "application/json"

    def rep(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if (path == "/tokenize" and where == "/tokenize") or (path == "/v1/completions" and where == "completion"):
            return 200, NESTED, "application/json"
        return 200, {"tokens": [1, 2]} if path == "/tokenize" else {"ok": 1}, "application/json"

    selector, r1 = Stub(service), Stub(rep)
    servers += [selector, r1]
    port = gateway(servers, selector.url, {1: r1.url}, explain=True)
    status, data, _ = request(port, json.dumps({"prompt": "hello"}).encode())
    expected = {"/select_and_reserve": 502, "/overlap_scores": 200, "/tokenize": 503, "completion": 502}[where]
    assert status == expected and (status == 200 or b"not JSON" in data), data[:200]
    if where == "completion":  # its reservation was released
        assert settled() and [c[0] for c in selector.calls][-1] == "DELETE"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def answer_of(s: socket.socket) -> bytes:
    """What the gateway sent on a raw connection, up to its body's end (or 2 s)."""
    s.settimeout(2)
    data = b""
    try:
        while chunk := s.recv(4096):
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and b"Content-Length: " in head and len(body) >= int(head.split(b"Content-Length: ")[1].split()[0]):
                break
    except OSError:
        pass
    return data


@pytest.mark.parametrize("length", ["\u00b2", "\u00b9", "\u00b3", "9" * 5000, "\u0661\u0662", " 12 3"])
def test_a_content_length_in_other_digits_is_a_400(servers, length, caplog):
    r1 = replica("r1")
    servers.append(r1)
    port = gateway(servers, None, {1: r1.url})
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length.encode() + b"\r\n\r\n{}")
    head = answer_of(s)
    s.close()
    assert head.startswith(b"HTTP/1.1 400") and b"is not a byte count" in head
    s = socket.create_connection(("127.0.0.1", port), timeout=5)  # the 404 path reads lengths too
    s.sendall(b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: " + length.encode() + b"\r\n\r\n")
    assert answer_of(s).startswith(b"HTTP/1.1 404")
    s.close()
    assert not [r for r in caplog.records if r.levelname == "ERROR"] and r1.calls == []


@pytest.mark.parametrize("argv, says", [
    (["--timeout", "inf"], "--timeout inf: give seconds > 0 and at most 86400"),
    (["--timeout", "1e300"], "--timeout 1e+300: give seconds"),
    (["--timeout", "nan"], "--timeout nan: give seconds"),
    (["--completion-timeout", "inf"], "--completion-timeout inf: give seconds"),
    (["--events", "2=tcp://127.0.0.1:1,tcp://127.0.0.1:2"], "--events names replica 2, which no --worker gives"),
    (["--worker", "1=http://127.0.0.1:2"], "replica 1 is already http://127.0.0.1:1"),
    (["--max-connections", "0"], "--max-connections 0: give a count from 1 to 65536"),
    (["--worker", "\u00b2=http://x"], "write ID=URL"),
])
def test_flags_that_would_kill_every_request_are_refused_at_start(argv, says, capsys):
    """--timeout inf started a gateway whose every request died in socket.settimeout;
    --events for a replica no --worker names was a KeyError; a replica named twice kept one."""
    with pytest.raises(SystemExit) as exc:
        gateway_cli.main(["--selector", "http://127.0.0.1:9", "--worker", "1=http://127.0.0.1:1", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and says in err and "Traceback" not in err


def endless(chunk: bytes, sent: list[int]):  # type: ignore[no-untyped-def]
    """A chunked answer that never ends, counting what it managed to send."""
    def handle(sock: socket.socket, release: threading.Event) -> None:
        _read_request(sock)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        try:
            while not release.is_set() and sent[0] < 200 << 20:
                sock.sendall(frame)
                sent[0] += len(chunk)
        except OSError:
            return
    return handle


def test_a_huge_answer_is_not_read_whole(servers):
    """A 100 MB answer took the gateway from 29 MB to 602 MB: answers were read whole."""
    sent = [0]
    big, selector = RawServer(endless(b" " * (1 << 20), sent)), Stub(lambda m, p, b: (200, {"worker_id": 1}, "x/y"))
    servers += [big, selector]
    port = gateway(servers, selector.url, {1: big.url})
    status, data, seconds = request(port, b'{"prompt": [1]}')
    assert status == 502 and b"sent an answer over" in data
    time.sleep(0.2)
    assert sent[0] < 64 << 20  # it stopped reading: the replica could not push more


def test_the_seen_header_lists_only_this_gateways_replicas(servers):
    """A service that reports 8,000 workers: the header passed 64 KiB (no Python client could read
    the answer) and foreign rows counted as 'cached somewhere' for the opening rule."""
    rows = [{"worker_id": w, "device_blocks": 3} for w in range(3, 8003)]
    rows.append({"worker_id": 1, "device_blocks": 0})

    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == "/overlap_scores":
            return 200, {"workers": rows}, "application/json"
        return 200, {"worker_id": (body.get("allowed_worker_ids") or [2])[0]} if path == "/select_and_reserve" \
            else {}, "application/json"

    selector, r1, r2 = Stub(reply), replica("r1"), replica("r2")
    servers += [selector, r1, r2]
    g = gw.Gateway(selector.url, {1: r1.url, 2: r2.url}, explain=True, affinity=True, timeout_s=5)
    routed = g.choose({"prompt": [1, 2], "user": "new"})
    assert routed.seen == "1=0/0/0"
    selects = [c[2] for c in selector.calls if c[1] == "/select_and_reserve"]
    assert selects[-1]["allowed_worker_ids"] == [routed.worker]  # nothing cached here: an opening


def test_connections_are_bounded_in_number_and_time(servers, caplog):
    """A thread per connection without bound, each held as long as the client dripped a byte
    within every timeout."""
    r1 = replica("r1")
    servers.append(r1)
    g = gw.Gateway(None, {1: r1.url}, timeout_s=TIMEOUT_S)
    server = gw.serve(g, "127.0.0.1", 0, max_connections=3)
    servers.append(type("S", (), {"close": lambda self: server.shutdown()})())
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    time.sleep(0.2)
    t0 = time.monotonic()
    extra = socket.create_connection(("127.0.0.1", port))
    refused = answer_of(extra)  # answered at once, before it sends a byte
    extra.close()
    assert refused.startswith(b"HTTP/1.1 503") and b"--max-connections" in refused
    assert time.monotonic() - t0 < 0.5
    dripping = idle[0]
    t0 = time.monotonic()
    try:
        for byte in b"POST /v1/completions HTTP/1.1\r\nContent-Length: 20\r\n\r\n":
            dripping.sendall(bytes([byte]))
            time.sleep(0.05)
    except OSError:
        pass
    assert time.monotonic() - t0 < TIMEOUT_S + 1.5  # cut at the timeout, not at each byte's
    time.sleep(TIMEOUT_S)
    assert request(port, b'{"prompt": [1]}')[0] == 200  # the idle ones were closed: slots free
    for s in idle:
        s.close()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=12)
answers = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"worker_id": st.one_of(st.integers(-3, 3), st.text(max_size=5), st.floats(), st.none())},
                          optional={"workers": json_values}).map(lambda v: json.dumps(v).encode()),
)


@pytest.fixture(scope="module")
def hostile_fleet():
    holder: dict[str, Any] = {"service": (200, b"{}", "application/json"), "replica": (200, b"{}", "text/plain")}
    selector = Stub(lambda m, p, b: holder["service"])
    r1 = Stub(lambda m, p, b: holder["replica"])
    g = gw.Gateway(selector.url, {1: r1.url, 2: r1.url}, timeout_s=TIMEOUT_S, completion_timeout_s=TIMEOUT_S,
                   explain=True, affinity=True)
    server = gw.serve(g, "127.0.0.1", 0)
    yield holder, server.server_address[1]
    server.shutdown()
    selector.close()
    r1.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(service=answers, service_status=st.sampled_from([200, 200, 200, 404, 500, 503]), replica_answer=answers,
       replica_status=st.sampled_from([200, 200, 400, 500]),
       content_type=st.sampled_from(["application/json", "text/html", "\u00e9/\u00e9", ""]),
       stream=st.booleans())
def test_any_upstream_answer_gets_the_client_a_status(hostile_fleet, service, service_status, replica_answer,
                                                       replica_status, content_type, stream):
    holder, port = hostile_fleet
    holder["service"] = (service_status, service, "application/json")
    holder["replica"] = (replica_status, replica_answer, content_type)
    handler = logging.getLogger("kvoffload.gateway")
    errors: list[logging.LogRecord] = []
    catch = logging.Handler(logging.ERROR)
    catch.emit = errors.append  # type: ignore[method-assign]
    handler.addHandler(catch)
    try:
        status, data, seconds = request(port, json.dumps({"prompt": [1, 2], "user": "u", "stream": stream}).encode())
    finally:
        handler.removeHandler(catch)
    assert status in (200, 400, 500, 502, 503, 504) and seconds < 3 * TIMEOUT_S and not errors
    if status in (502, 503, 504):
        assert len(json.loads(data)["error"].splitlines()) == 1
