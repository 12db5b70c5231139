"""The gateway stays up when a replica or the selection service misbehaves (hostile round 7):
a replica the service will not choose, a replica that died while the service still lists its
blocks, a hung or dripping service seen by many requests at once, and a service stuck on its
reservations. Every request is answered within about ``--timeout``, whatever the others do, and
no conversation fails while some replica can serve it."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from tests.test_dynamo_gateway import Stub, replica
from tests.test_gateway_faults import TIMEOUT_S, RawServer, _read_request, dead_url, gateway, hang, request, servers

__all__ = ["servers"]  # the fixture, shared


def kill(stub: Stub) -> None:
    """The replica's process is gone: its port refuses connections."""
    stub.server.shutdown()
    stub.server.server_close()


def no_overlap(extra: dict[str, Any] | None = None) -> Any:
    """A service that sees nothing cached and chooses the first allowed replica (or 1)."""
    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == "/overlap_scores":
            return 200, {"workers": []}, "application/json"
        if path == "/select_and_reserve":
            return 200, {"worker_id": (body.get("allowed_worker_ids") or [1])[0]}, "application/json"
        return 200, {}, "application/json"
    return reply


def test_a_replica_the_service_will_not_choose_fails_no_new_conversation(servers):
    """Replicas 1 and 2 alive, the service knows only 1 and answers 503 when asked to choose
    among replicas it cannot serve (as Dynamo 1.6.1 does). With affinity, 7 of 8 openings got
    502: replica 2 stayed 'least loaded' for ever, since a conversation was counted only after
    the service chose for it."""
    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == "/select_and_reserve":
            allowed = body.get("allowed_worker_ids")
            if allowed is not None and 1 not in allowed:
                return 503, {"error": "no worker available among allowed_worker_ids"}, "application/json"
            return 200, {"worker_id": 1}, "application/json"
        return no_overlap()(method, path, body)

    selector, r1, r2 = Stub(reply), replica("r1"), replica("r2")
    servers += [selector, r1, r2]
    port = gateway(servers, selector.url, {1: r1.url, 2: r2.url}, affinity=True)
    answers = [request(port, json.dumps({"prompt": [100 + c, 1], "user": f"c{c}"}).encode()) for c in range(8)]
    assert [a[0] for a in answers] == [200] * 8
    assert all(json.loads(a[1]) == {"served_by": "r1"} for a in answers)
    refused = [c for c in selector.calls if c[1] == "/select_and_reserve" and c[2].get("allowed_worker_ids") == [2]]
    assert len(refused) == 1  # asked once; then left out while the service will not choose it


def test_a_dead_replica_costs_no_request_and_the_conversation_moves(servers):
    """A conversation's home dies; the service still lists its blocks there (a dead vLLM sends
    no removal events) and chooses it as the affinity target. Every later turn used to get 502
    (6 of 6): the request never reached a replica and was not retried."""
    home = {"held_on": 1}

    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == "/overlap_scores":
            return 200, {"workers": [{"worker_id": home["held_on"], "device_blocks": 4}]}, "application/json"
        if path == "/select_and_reserve":
            target = (body.get("affinity_target") or {}).get("worker_id")
            allowed = body.get("allowed_worker_ids") or [1, 2]
            return 200, {"worker_id": target if target in allowed else allowed[0]}, "application/json"
        return 200, {}, "application/json"

    selector, r1, r2 = Stub(reply), replica("r1"), replica("r2")
    servers += [selector, r2]
    port = gateway(servers, selector.url, {1: r1.url, 2: r2.url}, affinity=True)
    turn = json.dumps({"prompt": [7, 8, 9], "user": "alice"}).encode()
    assert request(port, turn)[0] == 200 and r1.calls  # served on its home
    kill(r1)
    for _ in range(6):
        status, data, seconds = request(port, turn)
        assert status == 200 and json.loads(data) == {"served_by": "r2"} and seconds < 3
    selects = [c[2] for c in selector.calls if c[1] == "/select_and_reserve"]
    assert selects[-1].get("affinity_target") is None and selects[-1]["allowed_worker_ids"] == [2]
    # A stream's replica dead at the open: the stream goes to the live one, whole.
    status, data, _ = request(port, json.dumps({"prompt": [7, 8, 9], "user": "bob", "stream": True}).encode())
    assert status == 200 and data == b"data: r2-1\n\ndata: [DONE]\n\n"
    # Every replica dead: one 502 naming it, in bounded time.
    port = gateway(servers, selector.url, {1: dead_url(), 2: dead_url()})
    status, data, seconds = request(port, b'{"prompt": [1]}')
    assert status == 502 and b"is unreachable" in data and seconds < 3


def test_a_hung_service_answers_concurrent_openings_each_within_the_timeout(servers):
    """One lock was held across the service call: six openings against a hung service got their
    504s after 1, 2, 3, 4, 5, 6 s."""
    hung, r1, r2 = RawServer(hang), replica("r1"), replica("r2")
    servers += [hung, r1, r2]
    port = gateway(servers, hung.url, {1: r1.url, 2: r2.url}, affinity=True)
    got: list[tuple[int, float]] = []

    def opening(c: int) -> None:
        status, _, seconds = request(port, json.dumps({"prompt": [c, 1], "user": f"c{c}"}).encode())
        got.append((status, seconds))

    threads = [threading.Thread(target=opening, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _ in got] == [504] * 6
    assert max(seconds for _, seconds in got) < TIMEOUT_S + 1.0, got


def drip(answer: bytes, every_s: float):  # type: ignore[no-untyped-def]
    """Answer with ``answer`` a byte every ``every_s`` (never silent for a whole timeout)."""
    def handle(sock: socket.socket, release: threading.Event) -> None:
        _read_request(sock)
        data = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer
        for i in range(len(data)):
            if release.wait(every_s):
                return
            try:
                sock.sendall(data[i:i + 1])
            except OSError:
                return
    return handle


def test_a_service_dripping_its_answer_is_cut_at_the_timeout(servers):
    """A 16-byte answer sent a byte every 0.5 s held the request 8 s: the timeout bounded each
    receive, not the call."""
    slow, r1 = RawServer(drip(b'{"worker_id": 1}', 0.05)), replica("r1")
    servers += [slow, r1]
    port = gateway(servers, slow.url, {1: r1.url})
    status, data, seconds = request(port, b'{"prompt": [1, 2]}')
    assert status == 504 and b"did not answer within 1 s" in data
    assert seconds < TIMEOUT_S + 0.8 and r1.calls == []


def test_bookkeeping_is_off_the_clients_path(servers):
    """The service chooses at once but hangs on /reservations/*: non-streamed answers arrived
    after 2 x --timeout, streamed ones stalled before the first and the last chunk."""
    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path.startswith("/reservations/"):
            time.sleep(3)
        return 200, {"worker_id": 1} if path == "/select_and_reserve" else {}, "application/json"

    selector, r1 = Stub(reply), replica("r1")
    servers += [selector, r1]
    port = gateway(servers, selector.url, {1: r1.url})
    for stream in (False, True):
        status, data, seconds = request(port, json.dumps({"prompt": [1], "stream": stream}).encode())
        assert status == 200 and seconds < 0.5, (stream, seconds)
