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
could tokenize) or 504 (an upstream did not answer within `--timeout` seconds in all; a completion
within `--completion-timeout`), each with a one-line reason. A stream whose replica dies or
stalls mid-way ends with an SSE error event and a broken chunked encoding, never a normal end.
A replica that cannot be reached never saw the request: it goes to another, and the dead one,
like one the selection service will not choose, is left out for a while (``gateway_health``).
The reservation's bookkeeping is sent after the answer, off the client's path.

    python examples/routing/gateway.py --port 8000 --selector http://127.0.0.1:8092 \\
        --worker 1=http://127.0.0.1:8101 --worker 2=http://127.0.0.1:8102

(``examples/routing/gateway.py`` runs ``gateway_cli``; ``kvoffload bench serve --replicas 2``
serves it in process.)
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any, TypeVar

from kvoffload.integrations.gateway_health import ReplicaHealth
from kvoffload.integrations.gateway_http import Routed, make_handler
from kvoffload.integrations.gateway_overlap import cached_blocks, overlap_rows
from kvoffload.integrations.gateway_reservations import ReservationCalls
from kvoffload.integrations.gateway_server import MAX_CONNECTIONS, GatewayServer
from kvoffload.integrations.gateway_sessions import Conversations
from kvoffload.integrations.gateway_upstream import (
    COMPLETION_TIMEOUT_S,
    MAX_BODY_BYTES,
    TIMEOUT_S,
    GatewayError,
    ServiceRefused,
    Unreachable,
    Upstream,
    call,
    call_raw,
    open_url,
    parse_json,
)

logger = logging.getLogger("kvoffload.gateway")


#: Conversations a gateway remembers the replica of (``affinity``), the least recent dropped first.
MAX_SESSIONS = 65536
#: Seconds a conversation counts toward its replica's conversations after its last turn.
SESSION_IDLE_S = 300.0
#: The longest timeout taken (a day); inf or 1e300 overflowed every socket's timeout.
MAX_TIMEOUT_S = 86400.0

T = TypeVar("T")


def _session_of(body: dict[str, Any]) -> str | None:
    """The request's conversation: OpenAI's ``user`` field, a string of 1-256 characters."""
    user = body.get("user")
    return user if isinstance(user, str) and 0 < len(user) <= 256 else None


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
            if not 0 < value <= MAX_TIMEOUT_S:  # inf or 1e300 overflowed every socket's timeout
                raise ValueError(f"{name} {value}: give seconds > 0 and at most {MAX_TIMEOUT_S:g}, e.g. 10")
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
        #: conversations (a turn within ``session_idle_s``), counted before the service is asked.
        self.affinity = affinity
        self._conversations = Conversations(self.workers, MAX_SESSIONS, session_idle_s)
        self.health = ReplicaHealth(self.workers)
        self._reservations = ReservationCalls(self._reservation_call)
        self._opening = threading.Lock()
        self._openings = itertools.count()
        self._next = itertools.cycle(sorted(self.workers))
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def _turn(self, usable: list[int] | None = None) -> int:
        with self._lock:
            for _ in self.workers:
                wid = next(self._next)
                if usable is None or wid in usable:
                    return wid
        assert usable
        return usable[0]

    def _left(self, deadline: float) -> float:
        """Seconds left of the choice's ``--timeout``: the calls one choice makes share it, so a
        slow service costs a request one timeout, not one per call."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise GatewayError(504, f"the selection service did not answer within {self.timeout_s:g} s")
        return left

    def token_ids(self, prompt: str | list[int], deadline: float | None = None) -> list[int]:
        """Token ids of the prompt; a text prompt is tokenized by the first replica (in turn)
        that answers, so one dead replica does not fail every text request."""
        if isinstance(prompt, list):
            return prompt
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        order = self.health.usable()
        start = self._turn(order)
        order = order[order.index(start):] + order[:order.index(start)]
        order += [w for w in sorted(self.workers) if w not in order]
        faults = []
        for wid in order:
            try:
                out = call(f"{self.workers[wid]}/tokenize", {"prompt": prompt},
                           timeout_s=max(deadline - time.monotonic(), 1e-3), what=f"replica {wid}",
                           limit=MAX_BODY_BYTES)
            except GatewayError as exc:
                faults.append(str(exc))
                continue
            tokens = out.get("tokens") if isinstance(out, dict) else None
            if isinstance(tokens, list) and all(type(t) is int for t in tokens):
                return tokens
            faults.append(f"replica {wid}'s /tokenize answer has no token list")
        raise GatewayError(503, f"no replica could tokenize the prompt: {'; '.join(faults)}")

    def choose(self, body: dict[str, Any], avoid: frozenset[int] = frozenset()) -> Routed:
        """Where one completion request goes (round robin without a selection service), never
        to a replica in ``avoid`` (it failed this request) nor, while another can serve, to one
        left out (``health``)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        prompt = prompt_of(body)
        usable = self.health.usable(avoid)
        if not usable:
            raise GatewayError(502, "no replica is left to try: each one failed this request")
        if self.selector is None:
            return Routed(self._turn(usable), route_ms=(time.perf_counter() - t0) * 1e3)
        token_ids = self.token_ids(prompt, deadline)
        session = _session_of(body) if self.affinity else None
        home = self._conversations.home(session) if session is not None else None
        # The question takes at most half of what is left: the choice still has time.
        cached = self._cached(token_ids, self._left(deadline) / 2) if self.explain or session is not None else None
        request: dict[str, Any] = {"selection_id": uuid.uuid4().hex, "model_name": self.model,
                                   "token_ids": token_ids}
        if len(usable) < len(self.workers):
            request["allowed_worker_ids"] = usable
        if session is not None and cached is not None and not any(any(c) for c in cached.values()):
            # A conversation that opens where no replica holds any of its prompt: the service
            # would go by load alone, and a burst of openings chosen against the same load split
            # unevenly. Its replica is one with the fewest conversations, counted at once (no
            # call is made under the lock, so a slow service holds up no other request).
            with self._opening:
                fewest = self._conversations.least_loaded(session, usable)
                target = fewest[next(self._openings) % len(fewest)]
                self._conversations.record(session, target)
            wid = self._select_opening(request, target, usable, deadline)
            if wid != target:
                self._conversations.record(session, wid)
        else:
            if home is not None and home in usable and cached is not None and any(cached.get(home, ())):
                request["affinity_target"] = {"worker_id": home, "dp_rank": 0}
            wid = self._select(request, deadline)
            if session is not None:
                self._conversations.record(session, wid)
        seen = None
        if self.explain and cached:
            seen = ",".join(f"{w}=" + "/".join(map(str, counts)) for w, counts in sorted(cached.items()))
        return Routed(wid, request["selection_id"], seen, (time.perf_counter() - t0) * 1e3)

    def _select_opening(self, request: dict[str, Any], target: int, usable: list[int], deadline: float) -> int:
        """The service's reservation on ``target``; if it will not choose that replica (it does
        not know it, or lost it), the replica is left out and the service chooses among the
        others: no conversation fails while some replica can serve it."""
        try:
            return self._select({**request, "allowed_worker_ids": [target]}, deadline)
        except ServiceRefused as exc:
            self.health.leave_out(target, f"the selection service will not choose it ({exc})")
            others = [w for w in usable if w != target]
            if not others:
                raise
            return self._select({**request, "allowed_worker_ids": others}
                                if len(others) < len(self.workers) else request, deadline)

    def _select(self, request: dict[str, Any], deadline: float) -> int:
        """The selection service's choice (reserved), checked to be one of this gateway's replicas."""
        try:
            chosen = call(f"{self.selector}/select_and_reserve", request, timeout_s=self._left(deadline),
                          what="the selection service")
        except GatewayError as exc:
            if exc.status == 504:  # named by the choice's whole timeout, not the part that was left
                raise GatewayError(504, f"the selection service did not answer within {self.timeout_s:g} s") from None
            raise
        wid = chosen.get("worker_id") if isinstance(chosen, dict) else None
        if type(wid) is not int or wid not in self.workers:
            self.release(request["selection_id"])
            raise GatewayError(502, f"the selection service chose worker {str(wid)[:40]}, which is not one of "
                                    f"this gateway's --worker ids ({', '.join(map(str, sorted(self.workers)))})")
        return wid

    def _cached(self, token_ids: list[int], timeout_s: float) -> dict[int, tuple[int, int, int]] | None:
        """The service's cached blocks of this prompt on this gateway's replicas (device, host,
        disk; rows for other workers are not this gateway's to send to or to show); None if
        it does not say (never fails the request)."""
        assert self.selector is not None
        try:
            rows = overlap_rows(self.selector, self.model, token_ids, timeout_s)
        except GatewayError:
            return None
        return {row["worker_id"]: cached_blocks(row) for row in rows if row["worker_id"] in self.workers}

    def _reservation_call(self, path: str, method: str) -> None:
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
            self._reservations.post(f"/reservations/{selection_id}/prefill_complete", "POST")

    def release(self, selection_id: str | None) -> None:
        if selection_id is not None:
            self._reservations.post(f"/reservations/{selection_id}", "DELETE")

    def settle(self, timeout_s: float = 10.0) -> bool:
        """Wait until the reservation calls made so far were sent (tests, shutdown)."""
        return self._reservations.settle(timeout_s)

    def _attempts(self, body: dict[str, Any], send: Callable[[Routed], T]) -> tuple[Routed, T]:
        """Choose and send; a replica that could not be reached never saw the request, so it
        is left out and the request goes to another (each replica tried at most once)."""
        avoid: frozenset[int] = frozenset()
        while True:
            routed = self.choose(body, avoid)
            try:
                return routed, send(routed)
            except Unreachable as exc:
                self.release(routed.selection_id)
                self.health.leave_out(routed.worker, str(exc))
                avoid |= {routed.worker}
                if len(avoid) == len(self.workers):
                    raise
            except BaseException:
                self.release(routed.selection_id)
                raise

    def route(self, body: dict[str, Any]) -> tuple[Routed, bytes, str]:
        """Where one non-streaming completion request went, and the replica's answer (bytes,
        content type), checked to be JSON and relayed as it came."""
        def send(routed: Routed) -> tuple[bytes, str]:
            data, content_type = call_raw(f"{self.workers[routed.worker]}/v1/completions", body,
                                          timeout_s=self.completion_timeout_s, what=f"replica {routed.worker}",
                                          relay=True, limit=MAX_BODY_BYTES)
            parse_json(data, f"replica {routed.worker}")
            return data, content_type

        routed, (data, content_type) = self._attempts(body, send)
        self.prefilled(routed.selection_id)
        self.release(routed.selection_id)
        return routed, data, content_type

    def open_stream(self, body: dict[str, Any]) -> tuple[Routed, Upstream]:
        """A streaming completion opened on its replica (its reservation held: the caller marks
        it prefilled and releases it)."""
        return self._attempts(body, lambda routed: open_url(
            f"{self.workers[routed.worker]}/v1/completions", body, "POST", self.completion_timeout_s,
            f"replica {routed.worker}", MAX_BODY_BYTES))


def serve(gateway: Gateway, host: str, port: int, max_connections: int = MAX_CONNECTIONS) -> ThreadingHTTPServer:
    server = GatewayServer((host, port), make_handler(gateway), max_connections)
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

