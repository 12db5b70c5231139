"""The routed report's per-replica timeline: exact figures from a hand-made run, a hostile
worker header never trusted, and the header as the real gateway sends it."""

from __future__ import annotations

import asyncio
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kvoffload.bench.replica_timeline import timeline
from kvoffload.bench.serve_report import report
from kvoffload.bench.serve_runs import RunResult, TurnResult
from kvoffload.testing.http_client import Completion, route_ms, seen_blocks, worker_id


def turn(sid: str, i: int, worker: int | None, start: float, ttft: float, end: float, cached: int = 0,
         seen: dict[int, int] | None = None) -> TurnResult:
    return TurnResult(sid, i, Completion(tokens={0: [1, 2]}, start=start, times=[ttft, end], cached_tokens=cached,
                                         status=200, worker=worker, seen=seen))


RUN = [  # two conversations of three turns; b's second turn moved to replica 1, its third came back
    turn("a", 0, 1, 100.0, 0.5, 1.0), turn("a", 1, 1, 101.0, 0.1, 2.0, cached=64),
    turn("a", 2, 1, 103.0, 0.2, 1.0, cached=96),
    turn("b", 0, 2, 100.0, 0.5, 1.0), turn("b", 1, 1, 101.5, 0.9, 2.0), turn("b", 2, 2, 104.0, 0.3, 2.0, cached=32),
]


def test_the_timeline_of_a_hand_made_run():
    tl = timeline(RUN, slices=6)
    assert tl is not None and tl.replicas == [1, 2]
    assert tl.requests == {1: 4, 2: 2} and tl.cached_tokens == {1: 160, 2: 32}
    assert (tl.returning, tl.moved, tl.moved_in) == (4, 2, {1: 1, 2: 1})  # b's turns 1 and 2 each moved
    assert tl.moved_ttft_p50_ms == pytest.approx(600.0) and tl.stayed_ttft_p50_ms == pytest.approx(150.0)
    assert tl.returning_ttft_p50_ms == {1: pytest.approx(200.0), 2: pytest.approx(300.0)}
    assert tl.slice_s == pytest.approx(1.0)  # the run spans 6 s (b's last turn ends at 106)
    # Open at 0.5, 1.5, ... s: replica 1 holds a's turns, and b's moved one beside a's second
    # (1.5-3.5 s after the run's start); replica 2 b's first and last.
    assert tl.in_flight == {1: [1, 2, 2, 1, 0, 0], 2: [1, 0, 0, 0, 1, 1]}


def test_the_routed_report_prints_and_records_it():
    runs = {"round-robin": [RunResult("round-robin", RUN, 6.0)], "dynamo": [RunResult("dynamo", RUN, 6.0)]}
    text, out = report(runs, references=("round-robin",))
    assert "returning turns moved to another replica: 2 of 4 (TTFT p50 600 ms moved, 150 ms stayed)" in text
    assert "requests open, every 0.5 s: r1 " in text
    assert out["configs"]["dynamo"]["timeline_per_run"][0]["moved"] == 2


def test_a_run_without_a_gateway_has_no_timeline():
    plain = [turn("a", 0, None, 0.0, 0.1, 0.2)]
    assert timeline(plain) is None
    assert "timeline" not in report({"plain": [RunResult("plain", plain, 1.0)]})[0]


def test_no_turn_returning_gives_null_figures_not_nan_in_json():
    tl = timeline([turn("a", 0, 3, 0.0, 0.1, 0.2)])
    assert tl is not None and math.isnan(tl.moved_ttft_p50_ms)
    assert tl.as_dict()["moved_ttft_p50_ms"] is None and tl.as_dict()["returning_ttft_p50_ms"] == {3: None}


@pytest.mark.parametrize("header, expected", [("2", 2), ("17", 17), (None, None), ("", None), ("-1", None),
                                              ("1e3", None), ("²", None), ("9" * 40, None), (" 1", None)])
def test_a_worker_header_is_trusted_only_as_a_small_integer(header, expected):
    assert worker_id(header) == expected


def test_the_client_records_the_replica_the_real_gateway_chose():
    aiohttp = pytest.importorskip("aiohttp")
    from kvoffload.integrations import dynamo_gateway as gw
    from kvoffload.testing.http_client import stream_completion

    class Replica(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'data: {"choices": [{"index": 0, "token_ids": [7], "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    replicas = [ThreadingHTTPServer(("127.0.0.1", 0), Replica) for _ in range(2)]
    for r in replicas:
        threading.Thread(target=r.serve_forever, daemon=True).start()
    gateway = gw.serve(gw.Gateway(None, {i + 1: f"http://127.0.0.1:{r.server_address[1]}"
                                         for i, r in enumerate(replicas)}), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{gateway.server_address[1]}"

    async def two() -> list[Completion]:
        async with aiohttp.ClientSession() as http:
            return [await stream_completion(http, url, "m", [1, 2, 3], 1) for _ in range(2)]

    try:
        got = asyncio.run(two())
    finally:
        gateway.shutdown()
        for r in replicas:
            r.shutdown()
    assert [c.tokens for c in got] == [{0: [7]}, {0: [7]}]
    assert sorted(c.worker for c in got) == [1, 2]  # round robin: one each
    assert all(c.route_ms is not None and 0 <= c.route_ms < 1000 for c in got)  # the choice's own time


def test_moved_turns_are_told_apart_by_what_the_router_saw_where_they_left():
    """b's second turn left replica 2 although the router saw 12 of its blocks there (its load
    term won); its third left replica 1, where the router saw none (evicted, or no events yet)."""
    seen = [{1: 0, 2: 0}, {1: 8, 2: 0}, {1: 8, 2: 0}, {1: 0, 2: 0}, {1: 0, 2: 12}, {1: 0, 2: 4}]
    run = [turn(t.sid, t.turn, t.completion.worker, t.completion.start, *t.completion.times,
                cached=t.completion.cached_tokens or 0, seen=s) for t, s in zip(RUN, seen)]
    tl = timeline(run, slices=6)
    assert tl is not None and (tl.moved, tl.moved_from_kv, tl.moved_no_kv) == (2, 1, 1)
    assert tl.as_dict()["moved_from_kv"] == 1
    assert "the router saw their KV on the replica they left for 1, none for 1" in tl.lines()[1]
    plain = timeline(RUN, slices=6)
    assert plain is not None and plain.moved_from_kv is None and "router saw" not in plain.lines()[1]


@pytest.mark.parametrize("header, expected", [
    ("1=0/12/3,2=2/0/0", {1: 15, 2: 2}), ("7=1/1/1", {7: 3}), (None, None), ("", None), ("1=0/12", None),
    ("1=-1/0/0", None), ("x=1/2/3", None), ("1=1/2/3,", None), ("1=" + "9" * 12 + "/0/0", None),
    (",".join(f"{i}=0/0/0" for i in range(70)), None), ("1=²/0/0", None)])
def test_a_seen_header_is_trusted_only_as_small_integers(header, expected):
    assert seen_blocks(header) == expected


@pytest.mark.parametrize("header, expected", [("12.5", 12.5), ("0.0", 0.0), (None, None), ("", None), ("-1", None),
                                              ("nan", None), ("inf", None), ("1e300", None), ("1" * 20, None),
                                              ("²", None), ("abc", None)])
def test_a_route_time_header_is_trusted_only_as_a_finite_count_under_a_day(header, expected):
    assert route_ms(header) == expected


def test_the_timeline_gives_the_gateways_choice_time():
    """A run whose router answered slowly (every choice 400-900 ms) says so beside its turns."""
    run = [TurnResult(t.sid, t.turn, Completion(tokens={0: [1]}, start=t.completion.start, times=t.completion.times,
                                                status=200, worker=t.completion.worker, route_ms=ms))
           for t, ms in zip(RUN, [400.0, 500.0, 900.0, 600.0, 700.0, 800.0])]
    tl = timeline(run, slices=6)
    assert tl is not None and (tl.route_ms_p50, tl.route_ms_max) == (650.0, 900.0)
    assert tl.lines()[1].endswith("; choosing took 650 ms (p50), 900 ms (max)")
    assert tl.as_dict()["route_ms_p50"] == 650.0
    plain = timeline(RUN, slices=6)
    assert plain is not None and "choosing" not in plain.lines()[1] and plain.as_dict()["route_ms_max"] is None
