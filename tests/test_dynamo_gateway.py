"""The example gateway against stand-ins for a selection service and two replicas (plain HTTP
servers on loopback): what it asks the service, where it forwards, the reservation's lifecycle,
streaming relayed line by line, and bad input answered with one line naming it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kvoffload.integrations import dynamo_gateway as gw
from kvoffload.integrations import gateway_overlap


class Stub:
    """One HTTP server recording (method, path, body) and answering from ``reply``."""

    def __init__(self, reply: Any) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                stub.calls.append((self.command, self.path, body))
                status, out, ctype = reply(self.command, self.path, body)
                data = out if isinstance(out, bytes) else json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


def replica(name: str) -> Stub:
    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if body and body.get("stream"):
            return 200, f"data: {name}-1\n\ndata: [DONE]\n\n".encode(), "text/event-stream"
        return 200, {"served_by": name}, "application/json"

    return Stub(reply)


@pytest.fixture
def fleet():
    selector = Stub(lambda m, p, b: (200, {"worker_id": 2} if p == "/select_and_reserve" else {}, "application/json"))
    r1, r2 = replica("r1"), replica("r2")
    yield selector, r1, r2
    for s in (selector, r1, r2):
        s.close()


def post(url: str, body: Any) -> tuple[int, bytes, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def test_the_gateway_forwards_where_the_service_says_and_frees_the_reservation(fleet):
    selector, r1, r2 = fleet
    g = gw.Gateway(selector.url, {1: r1.url, 2: r2.url})
    server = gw.serve(g, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    try:
        status, body, headers = post(url, {"model": "m", "prompt": [5, 6, 7]})
        assert status == 200 and json.loads(body) == {"served_by": "r2"} and headers["x-kvoffload-worker"] == "2"
        assert g.settle()  # the reservation's bookkeeping is sent after the answer
        (select, prefill, free) = selector.calls
        assert select[:2] == ("POST", "/select_and_reserve")
        assert select[2]["token_ids"] == [5, 6, 7] and select[2]["model_name"] == "default"
        sid = select[2]["selection_id"]
        assert prefill[:2] == ("POST", f"/reservations/{sid}/prefill_complete") and free[:2] == (
            "DELETE", f"/reservations/{sid}")
        assert r1.calls == [] and r2.calls[0][2] == {"model": "m", "prompt": [5, 6, 7]}
        selector.calls.clear()
        status, body, headers = post(url, {"model": "m", "prompt": [5], "stream": True})
        assert status == 200 and body == b"data: r2-1\n\ndata: [DONE]\n\n"
        assert g.settle() and [c[0] for c in selector.calls] == ["POST", "POST", "DELETE"]
        status, body, _ = post(url, {"model": "m", "prompt": [[1], [2]]})
        assert status == 400 and b"give one prompt" in body
        status, body, _ = post(url.replace("/v1/completions", "/v1/chat/completions"), {})
        assert status == 404 and b"only /v1/completions is routed" in body
    finally:
        server.shutdown()


def test_round_robin_alternates_and_asks_no_service(fleet):
    selector, r1, r2 = fleet
    g = gw.Gateway(None, {1: r1.url, 2: r2.url})
    assert [g.route({"prompt": [1]})[0].worker for _ in range(4)] == [1, 2, 1, 2]
    assert selector.calls == []


def test_bad_worker_specs_fail_with_one_line_naming_them():
    with pytest.raises(ValueError, match="no --worker given"):
        gw.Gateway(None, {})
    import argparse

    from kvoffload.integrations import gateway_cli

    with pytest.raises(argparse.ArgumentTypeError, match="--worker '1:http://x'"):
        gateway_cli.worker_spec("1:http://x")
    assert gateway_cli.worker_spec("3=http://127.0.0.1:9") == (3, "http://127.0.0.1:9")


def test_explain_sends_what_the_service_saw_on_each_replica_with_a_streamed_answer():
    """With ``explain`` the gateway asks /overlap_scores before it selects, and the stream's
    headers carry each replica's cached blocks (device/host/disk) as the service saw them; a
    service that does not answer the question still routes the request, without the header."""
    scores = {"block_size": 16, "workers": [
        {"worker_id": 1, "device_blocks": 0, "host_pinned_blocks": 12, "disk_blocks": 15},  # cumulative
        {"worker_id": 2, "device_blocks": 2, "host_pinned_blocks": 2, "disk_blocks": 2},
        {"worker_id": "3; drop", "device_blocks": 1}]}  # not a worker id: left out
    answers = {"/select_and_reserve": (200, {"worker_id": 2}), "/overlap_scores": (200, scores)}
    selector = Stub(lambda m, p, b: (*answers.get(p, (200, {})), "application/json"))
    r1, r2 = replica("r1"), replica("r2")
    server = gw.serve(gw.Gateway(selector.url, {1: r1.url, 2: r2.url}, explain=True), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    try:
        status, body, headers = post(url, {"model": "m", "prompt": [5, 6], "stream": True})
        assert status == 200 and headers["x-kvoffload-worker"] == "2"
        assert headers["x-kvoffload-seen"] == "1=0/12/15,2=2/2/2"
        assert [c[1] for c in selector.calls][:2] == ["/overlap_scores", "/select_and_reserve"]
        assert selector.calls[0][2] == {"model_name": "default", "token_ids": [5, 6]}
        answers["/overlap_scores"] = (500, {"error": "no"})
        status, body, headers = post(url, {"model": "m", "prompt": [5, 6], "stream": True})
        assert status == 200 and body == b"data: r2-1\n\ndata: [DONE]\n\n" and "x-kvoffload-seen" not in headers
    finally:
        server.shutdown()
        for s in (selector, r1, r2):
            s.close()


def test_affinity_keeps_a_conversation_where_the_service_sees_its_kv(monkeypatch):
    """A conversation (OpenAI's ``user``) whose last turn went to replica 2 asks the service for
    replica 2 while the service sees its blocks there, and lets it choose freely once it sees
    none; requests without a usable ``user`` never ask; the gateway remembers at most
    MAX_SESSIONS conversations, the least recent dropped first."""
    held = {"blocks": 5}

    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == "/overlap_scores":
            return 200, {"workers": [{"worker_id": 1, "device_blocks": 0, "host_pinned_blocks": 0, "disk_blocks": 0},
                                     {"worker_id": 2, "device_blocks": 0, "host_pinned_blocks": held["blocks"],
                                      "disk_blocks": 0}]}, "application/json"
        return 200, {"worker_id": 2} if path == "/select_and_reserve" else {}, "application/json"

    monkeypatch.setattr(gw, "MAX_SESSIONS", 2)
    selector = Stub(reply)
    r1, r2 = replica("r1"), replica("r2")
    g = gw.Gateway(selector.url, {1: r1.url, 2: r2.url}, affinity=True)

    def selects() -> list[Any]:
        return [c[2] for c in selector.calls if c[1] == "/select_and_reserve"]

    try:
        assert g.choose({"prompt": [1, 2], "user": "c1"}).worker == 2
        assert "affinity_target" not in selects()[-1]  # a first turn: nothing remembered
        # held somewhere (replica 2): the service chooses among all replicas
        assert [c[1] for c in selector.calls] == ["/overlap_scores", "/select_and_reserve"]
        assert "allowed_worker_ids" not in selects()[-1]
        g.choose({"prompt": [1, 2, 3], "user": "c1"})
        assert selects()[-1]["affinity_target"] == {"worker_id": 2, "dp_rank": 0}
        held["blocks"] = 0  # evicted there: the service chooses on its own
        g.choose({"prompt": [1, 2, 3, 4], "user": "c1"})
        assert "affinity_target" not in selects()[-1]
        for hostile in (["c1"], "", "x" * 257, 7, None):
            before = len(selector.calls)
            g.choose({"prompt": [1], "user": hostile})
            assert [c[1] for c in selector.calls[before:]] == ["/select_and_reserve"]
            assert "affinity_target" not in selects()[-1]
        held["blocks"] = 5
        g.choose({"prompt": [9], "user": "c2"})
        g.choose({"prompt": [9], "user": "c3"})  # c1, the least recent of three, is forgotten
        g.choose({"prompt": [1, 2, 3, 4, 5], "user": "c1"})
        assert "affinity_target" not in selects()[-1]
    finally:
        for s in (selector, r1, r2):
            s.close()


def test_a_burst_of_openings_is_spread_evenly_and_returning_turns_stay():
    """Twelve conversations opening at once, where the service sees none of their prompts and
    (like Dynamo choosing a burst against the same load) would put each on replica 1: the
    gateway offers it only the replicas with the fewest conversations, one opening at a time,
    so they split 6 / 6. A returning turn asks for its home; a new conversation whose prompt is
    cached somewhere, or any without a ``user``, lets the service choose among all."""
    cached: dict[str, int] = {}  # first prompt token -> the replica holding it

    def reply(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        if path == "/overlap_scores":
            holder = cached.get(str(body["token_ids"][0]))
            return 200, {"workers": [{"worker_id": w, "device_blocks": 0, "host_pinned_blocks": 4 * (holder == w),
                                      "disk_blocks": 0} for w in (1, 2)]}, "application/json"
        if path == "/select_and_reserve":
            return 200, {"worker_id": (body.get("allowed_worker_ids") or [1])[0]}, "application/json"
        return 200, {}, "application/json"

    selector = Stub(reply)
    g = gw.Gateway(selector.url, {1: "http://127.0.0.1:9", 2: "http://127.0.0.1:9"}, affinity=True)
    chosen: dict[str, int] = {}

    def opening(c: int) -> None:
        chosen[f"c{c}"] = g.choose({"prompt": [100 + c, 1], "user": f"c{c}"}).worker

    threads = [threading.Thread(target=opening, args=(c,)) for c in range(12)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(chosen.values()) == [1] * 6 + [2] * 6
        selects = [c[2] for c in selector.calls if c[1] == "/select_and_reserve"]
        assert all(set(s.get("allowed_worker_ids", [1, 2])) <= {1, 2} for s in selects)
        home = chosen["c11"]
        cached["111"] = home
        before = len(selector.calls)
        assert g.choose({"prompt": [111, 1, 2], "user": "c11"}).worker == 1  # the stand-in picks 1 when free
        last = selector.calls[-1][2]
        assert last["affinity_target"] == {"worker_id": home, "dp_rank": 0} and "allowed_worker_ids" not in last
        cached["500"] = 2
        g.choose({"prompt": [500, 1], "user": "new"})  # opens on a prefix the service sees: its choice
        assert "allowed_worker_ids" not in selector.calls[-1][2]
        g.choose({"prompt": [600, 1]})  # no conversation: no question, no restriction
        assert [c[1] for c in selector.calls[before:]][-1:] == ["/select_and_reserve"]
        assert "allowed_worker_ids" not in selector.calls[-1][2]
    finally:
        selector.close()


def test_without_affinity_openings_are_the_services_choice():
    selector = Stub(lambda m, p, b: (200, {"worker_id": 1} if p == "/select_and_reserve" else {}, "application/json"))
    g = gw.Gateway(selector.url, {1: "http://127.0.0.1:9", 2: "http://127.0.0.1:9"})
    try:
        assert [g.choose({"prompt": [c], "user": f"c{c}"}).worker for c in range(4)] == [1, 1, 1, 1]
        assert [c[1] for c in selector.calls] == ["/select_and_reserve"] * 4
    finally:
        selector.close()


def test_cached_blocks_are_read_as_dynamo_reports_them_cumulative():
    """Dynamo's host count includes the device's and its disk count the host's (the extension
    fields are the differences): a replica's cached run is the largest, counted once."""
    from kvoffload.bench.serve_routing import router_cold

    held = {"n": 1}

    def rows(method: str, path: str, body: Any) -> tuple[int, Any, str]:
        d, he, de = 2 * held["n"], 3 * held["n"], 1 * held["n"]
        return 200, {"workers": [
            {"worker_id": 1, "device_blocks": d, "host_pinned_blocks": d + he, "disk_blocks": d + he + de,
             "host_pinned_extension_blocks": he, "disk_extension_blocks": de, "shared_beyond_device_blocks": None},
            {"worker_id": 2, "device_blocks": 0, "host_pinned_blocks": 0, "disk_blocks": 0,
             "host_pinned_extension_blocks": 0, "disk_extension_blocks": 0, "shared_beyond_device_blocks": None},
            {"worker_id": 3, "device_blocks": -4, "host_pinned_blocks": "9", "disk_blocks": 1e9}]}, "application/json"

    selector = Stub(rows)
    try:
        got = gateway_overlap.overlap_rows(selector.url, "default", [1, 2], 5.0)
        assert [gateway_overlap.cached_blocks(r) for r in got] == [(2, 5, 6), (0, 0, 0), (0, 0, 0)]
        assert router_cold(selector.url, [[1, 2], [3, 4]], timeout_s=0.0)[1] == 12  # 6 a prompt, not 36
        held["n"] = 0
        waited, left = router_cold(selector.url, [[1, 2]], timeout_s=5.0)
        assert left == 0 and waited < 1.0
    finally:
        selector.close()
