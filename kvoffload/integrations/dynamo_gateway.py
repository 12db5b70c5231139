"""A small KV-aware gateway: each OpenAI completion request goes to the `vllm serve` replica that
Dynamo's standalone selection service (`python -m dynamo.select_service`) picks from the
replicas' KV events (device blocks, and kvoffload's host, disk and shared tiers).

Standard library only. Per request: the prompt's token ids (a text prompt is tokenized by a
live replica's /tokenize), `POST /select_and_reserve` to the selection service, the request
forwarded to the chosen replica, then the reservation's prefill marked complete and freed, so
the service balances load between replicas as well as prefix hits. The response carries the
chosen worker in the `x-kvoffload-worker` header and the milliseconds the choice took in
`x-kvoffload-route-ms`. `--round-robin` skips the selection service
(the baseline the benchmark compares against).

Every request gets an answer: 4xx naming what is wrong with the body, the replica's own status
and body where it refused the request, 502 (an upstream failed or sent nonsense), 503 (no replica
could tokenize) or 504 (an upstream did not answer within `--timeout` seconds; a completion
within `--completion-timeout`), each with a one-line reason. A stream whose replica dies or
stalls mid-way ends with an SSE error event and a broken chunked encoding, never a normal end.

    python examples/routing/gateway.py --port 8000 --selector http://127.0.0.1:8092 \\
        --worker 1=http://127.0.0.1:8101 --worker 2=http://127.0.0.1:8102

(``examples/routing/gateway.py`` runs this module; ``kvoffload bench serve --replicas 2`` serves
it in process.)
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import logging
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from typing import Any

from kvoffload.integrations.gateway_http import Routed, make_handler
from kvoffload.integrations.gateway_sessions import Conversations
from kvoffload.integrations.gateway_upstream import (
    COMPLETION_TIMEOUT_S,
    TIMEOUT_S,
    GatewayError,
    call,
    open_url,
)

logger = logging.getLogger("kvoffload.gateway")


#: Conversations a gateway remembers the replica of (``affinity``), the least recent dropped first.
MAX_SESSIONS = 65536
#: Seconds a conversation counts toward its replica's conversations after its last turn.
SESSION_IDLE_S = 300.0


def _session_of(body: dict[str, Any]) -> str | None:
    """The request's conversation: OpenAI's ``user`` field, a string of 1-256 characters."""
    user = body.get("user")
    return user if isinstance(user, str) and 0 < len(user) <= 256 else None


def _count(value: object) -> int:
    """A block count from the selection service (anything else counts 0)."""
    return value if type(value) is int and value >= 0 else 0


def overlap_rows(selector: str, model: str, token_ids: list[int], timeout_s: float) -> list[dict[str, Any]]:
    """The selection service's ``/overlap_scores`` for a prompt: a row per replica (its id and
    its cached blocks by tier), rows without an integer ``worker_id`` left out; a failed call
    raises ``GatewayError``."""
    out = call(f"{selector}/overlap_scores", {"model_name": model, "token_ids": token_ids}, timeout_s=timeout_s,
               what="the selection service")
    rows = out.get("workers") if isinstance(out, dict) else None
    if not isinstance(rows, list):
        return []
    return [row for row in rows if isinstance(row, dict) and type(row.get("worker_id")) is int]


def cached_blocks(row: dict[str, Any]) -> tuple[int, int, int]:
    """One ``/overlap_scores`` row's cached blocks of the prompt: (device, host, disk), as the
    service reports them: cumulative (Dynamo 1.6's host count is the device's plus its
    ``host_pinned_extension_blocks``, its disk count the host's plus ``disk_extension_blocks``),
    so the largest is the replica's cached run and the extensions are not added again."""
    return _count(row.get("device_blocks")), _count(row.get("host_pinned_blocks")), _count(row.get("disk_blocks"))


def prompt_of(body: object) -> str | list[int]:
    """The request's one prompt, checked: a string or a list of token ids."""
    if not isinstance(body, dict):
        raise GatewayError(400, f"the body is a JSON {type(body).__name__}: give a JSON object with a prompt")
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 1 << 31 for t in prompt):
        return prompt
    shown = json.dumps(prompt)[:40] if isinstance(prompt, (str, int, float, bool, type(None))) else \
        f"a {type(prompt).__name__}"
    raise GatewayError(400, f"prompt {shown}: give one prompt, a string or a list of token ids")


class Gateway:
    def __init__(self, selector: str | None, workers: dict[int, str], model: str = "default",
                 timeout_s: float = TIMEOUT_S, completion_timeout_s: float = COMPLETION_TIMEOUT_S,
                 explain: bool = False, affinity: bool = False, session_idle_s: float = SESSION_IDLE_S) -> None:
        if not workers:
            raise ValueError("no --worker given; name each replica as ID=URL, e.g. --worker 1=http://127.0.0.1:8101")
        for name, value in (("--timeout", timeout_s), ("--completion-timeout", completion_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} {value}: give seconds > 0, e.g. 10")
        self.selector = selector.rstrip("/") if selector else None
        self.workers = {wid: url.rstrip("/") for wid, url in workers.items()}
        self.model = model
        self.timeout_s = timeout_s
        self.completion_timeout_s = completion_timeout_s
        #: Ask the selection service what it sees cached on every replica before each choice (one
        #: more call a request): why a conversation moved shows in the ``x-kvoffload-seen`` header.
        self.explain = explain
        #: Keep a conversation (the request's OpenAI ``user``) on the replica that served its last
        #: turn while the selection service sees its KV there: the service's cost weighs a
        #: replica's pending prompt work against the prefix, and moved turns away from their KV
        #: while a replica was still prefilling other conversations' first turns. A conversation
        #: that opens where the service sees none of its prompt goes to a replica with the fewest
        #: conversations (a turn within ``session_idle_s``), the service choosing among them.
        self.affinity = affinity
        self._conversations = Conversations(self.workers, MAX_SESSIONS, session_idle_s)
        self._opening = threading.Lock()
        self._next = itertools.cycle(sorted(self.workers))
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def _turn(self) -> int:
        with self._lock:
            return next(self._next)

    def token_ids(self, prompt: str | list[int]) -> list[int]:
        """Token ids of the prompt; a text prompt is tokenized by the first replica (in turn)
        that answers, so one dead replica does not fail every text request."""
        if isinstance(prompt, list):
            return prompt
        start = self._turn()
        order = sorted(self.workers)
        order = order[order.index(start):] + order[:order.index(start)]
        faults = []
        for wid in order:
            try:
                out = call(f"{self.workers[wid]}/tokenize", {"prompt": prompt}, timeout_s=self.timeout_s,
                           what=f"replica {wid}")
            except GatewayError as exc:
                faults.append(str(exc))
                continue
            tokens = out.get("tokens") if isinstance(out, dict) else None
            if isinstance(tokens, list) and all(type(t) is int for t in tokens):
                return tokens
            faults.append(f"replica {wid}'s /tokenize answer has no token list")
        raise GatewayError(503, f"no replica could tokenize the prompt: {'; '.join(faults)}")

    def choose(self, body: dict[str, Any]) -> Routed:
        """Where one completion request goes (round robin without a selection service)."""
        t0 = time.perf_counter()
        prompt = prompt_of(body)
        if self.selector is None:
            return Routed(self._turn(), route_ms=(time.perf_counter() - t0) * 1e3)
        selection_id = uuid.uuid4().hex
        token_ids = self.token_ids(prompt)
        session = _session_of(body) if self.affinity else None
        home = self._conversations.home(session) if session is not None else None
        cached = self._cached(token_ids) if self.explain or session is not None else None
        request: dict[str, Any] = {"selection_id": selection_id, "model_name": self.model, "token_ids": token_ids}
        if session is not None and cached is not None and not any(any(c) for c in cached.values()):
            # A conversation that opens where no replica holds any of its prompt: the service
            # would go by load alone, and a burst of openings chosen against the same load
            # split unevenly; one opening at a time, among the replicas with fewest.
            with self._opening:
                fewest = self._conversations.least_loaded(session)
                if len(fewest) < len(self.workers):
                    request["allowed_worker_ids"] = fewest
                wid = self._select(request)
                self._conversations.record(session, wid)
        else:
            if home is not None and cached is not None and any(cached.get(home, ())):
                request["affinity_target"] = {"worker_id": home, "dp_rank": 0}
            wid = self._select(request)
            if session is not None:
                self._conversations.record(session, wid)
        seen = None
        if self.explain and cached:
            seen = ",".join(f"{w}=" + "/".join(map(str, counts)) for w, counts in cached.items())
        return Routed(wid, selection_id, seen, (time.perf_counter() - t0) * 1e3)

    def _select(self, request: dict[str, Any]) -> int:
        """The selection service's choice (reserved), checked to be one of this gateway's replicas."""
        chosen = call(f"{self.selector}/select_and_reserve", request, timeout_s=self.timeout_s,
                      what="the selection service")
        wid = chosen.get("worker_id") if isinstance(chosen, dict) else None
        if type(wid) is not int or wid not in self.workers:
            self.release(request["selection_id"])
            raise GatewayError(502, f"the selection service chose worker {str(wid)[:40]}, which is not one of "
                                    f"this gateway's --worker ids ({', '.join(map(str, sorted(self.workers)))})")
        return wid

    def _cached(self, token_ids: list[int]) -> dict[int, tuple[int, int, int]] | None:
        """The service's cached blocks of this prompt per replica (device, host, disk); None if
        it does not say (never fails the request)."""
        assert self.selector is not None
        try:
            rows = overlap_rows(self.selector, self.model, token_ids, self.timeout_s)
        except GatewayError:
            return None
        return {row["worker_id"]: cached_blocks(row) for row in rows}

    def _best_effort(self, path: str, method: str) -> None:
        """Reservation bookkeeping: a failure is logged once per kind, and the client's answer
        stands (the service expires reservations on its own)."""
        try:
            call(f"{self.selector}{path}", method=method, timeout_s=self.timeout_s, what="the selection service")
        except GatewayError as exc:
            kind = f"{method}:{exc.status}"
            if kind not in self._warned:
                self._warned.add(kind)
                logger.warning("kvoffload gateway: %s %s failed (%s); requests are still served (logged once)",
                               method, path.split("/")[1], exc)

    def prefilled(self, selection_id: str | None) -> None:
        if selection_id is not None:
            self._best_effort(f"/reservations/{selection_id}/prefill_complete", "POST")

    def release(self, selection_id: str | None) -> None:
        if selection_id is not None:
            self._best_effort(f"/reservations/{selection_id}", "DELETE")

    def open_completion(self, wid: int, body: dict[str, Any]) -> http.client.HTTPResponse:
        return open_url(f"{self.workers[wid]}/v1/completions", body, "POST", self.completion_timeout_s,
                        f"replica {wid}")

    def route(self, body: dict[str, Any]) -> tuple[Routed, Any]:
        """Where one non-streaming completion request went, and the replica's response."""
        routed = self.choose(body)
        try:
            out = call(f"{self.workers[routed.worker]}/v1/completions", body, timeout_s=self.completion_timeout_s,
                       what=f"replica {routed.worker}", relay=True)
            self.prefilled(routed.selection_id)
            return routed, out
        finally:
            self.release(routed.selection_id)


class GatewayServer(ThreadingHTTPServer):
    """A client that leaves (a reset or a closed pipe, e.g. a keep-alive connection its pool
    dropped) ends its connection and nothing else: the standard server printed a traceback to
    stderr for each, which buried the gateway's own errors. Anything else is logged once, with
    its cause."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            logger.debug("client %s left: %s", client_address, exc)
            return
        logger.error("gateway: request from %s failed", client_address, exc_info=True)


def serve(gateway: Gateway, host: str, port: int) -> ThreadingHTTPServer:
    server = GatewayServer((host, port), make_handler(gateway))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def register(selector: str, workers: dict[int, str], events: dict[int, tuple[str, str]], block_size: int,
             model: str = "default") -> None:
    """Register each replica with the selection service: its HTTP endpoint and its KV event
    (PUB) and replay (ROUTER) endpoints."""
    for wid, url in workers.items():
        pub, replay = events[wid]
        call(f"{selector.rstrip('/')}/workers",
             {"worker_id": wid, "model_name": model, "endpoint": url, "block_size": block_size,
              "data_parallel_start_rank": 0, "data_parallel_size": 1, "kv_events_endpoints": {"0": pub},
              "replay_endpoint": replay}, timeout_s=60.0, what="the selection service")


def _worker(text: str) -> tuple[int, str]:
    wid, sep, url = text.partition("=")
    if not sep or not wid.isdigit() or not url.startswith("http"):
        raise argparse.ArgumentTypeError(f"--worker {text!r}: write ID=URL, e.g. 1=http://127.0.0.1:8101")
    return int(wid), url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--selector", help="the selection service's URL (e.g. http://127.0.0.1:8092)")
    ap.add_argument("--worker", type=_worker, action="append", default=[], help="ID=URL of a replica (repeat)")
    ap.add_argument("--events", action="append", default=[],
                    help="ID=PUB,REPLAY: register replica ID's KV event endpoints with the selection service "
                         "(e.g. 1=tcp://127.0.0.1:5557,tcp://127.0.0.1:5567)")
    ap.add_argument("--block-size", type=int, default=128, help="the replicas' KV block size in tokens")
    ap.add_argument("--round-robin", action="store_true", help="ignore the selection service: alternate replicas")
    ap.add_argument("--explain", action="store_true",
                    help="ask the selection service what it sees cached on each replica before each choice and "
                         "send it back in the x-kvoffload-seen header (ID=DEVICE/HOST/DISK blocks, each including the "
                         "one before as Dynamo counts them; one more call a request)")
    ap.add_argument("--affinity", action="store_true",
                    help="keep a conversation (the request's 'user' field) on the replica of its last turn while "
                         "the selection service sees its KV there (asks it before each choice), and open a "
                         "conversation whose prompt no replica holds on a replica with the fewest conversations")
    ap.add_argument("--session-idle", type=float, default=SESSION_IDLE_S,
                    help="seconds after its last turn a conversation still counts toward its replica's "
                         "conversations (--affinity)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S,
                    help="seconds the selection service and /tokenize may stay silent before a 504")
    ap.add_argument("--completion-timeout", type=float, default=COMPLETION_TIMEOUT_S,
                    help="seconds a replica may stay silent on a completion (a stream: between chunks)")
    args = ap.parse_args()
    workers = dict(args.worker)
    if args.events:
        if not args.selector:
            ap.error("--events needs --selector")
        events = {}
        for text in args.events:
            wid, _, endpoints = text.partition("=")
            pub, _, replay = endpoints.partition(",")
            if not wid.isdigit() or not pub.startswith("tcp://") or not replay.startswith("tcp://"):
                ap.error(f"--events {text!r}: write ID=PUB,REPLAY with tcp:// endpoints")
            events[int(wid)] = (pub, replay)
        register(args.selector, {w: workers[w] for w in events}, events, args.block_size)
    try:
        gateway = Gateway(None if args.round_robin else args.selector, workers, timeout_s=args.timeout,
                          completion_timeout_s=args.completion_timeout, explain=args.explain,
                          affinity=args.affinity, session_idle_s=args.session_idle)
    except ValueError as exc:
        ap.error(str(exc))
    if gateway.selector is None and not args.round_robin:
        ap.error("give --selector (KV-aware) or --round-robin")
    serve(gateway, args.host, args.port)
    print(f"gateway on http://{args.host}:{args.port} -> {workers}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
