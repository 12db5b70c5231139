"""A small KV-aware gateway: each OpenAI completion request goes to the `vllm serve` replica that
Dynamo's standalone selection service (`python -m dynamo.select_service`) picks from the
replicas' KV events (device blocks, and kvoffload's host, disk and shared tiers).

Standard library only. Per request: the prompt's token ids (a text prompt is tokenized by a
replica's /tokenize), `POST /select_and_reserve` to the selection service, the request forwarded
to the chosen replica, then the reservation's prefill marked complete and freed, so the service
balances load between replicas as well as prefix hits. The response carries the chosen worker in
the `x-kvoffload-worker` header. `--round-robin` skips the selection service (the baseline the
benchmark compares against).

    python examples/routing/gateway.py --port 8000 --selector http://127.0.0.1:8092 \\
        --worker 1=http://127.0.0.1:8101 --worker 2=http://127.0.0.1:8102

(``examples/routing/gateway.py`` runs this module; ``kvoffload bench serve --replicas 2`` serves
it in process.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TIMEOUT_S = 600


def call(url: str, body: Any = None, method: str = "POST") -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
        text = resp.read().decode()
    return json.loads(text) if text.strip() else {}


class Gateway:
    def __init__(self, selector: str | None, workers: dict[int, str], model: str = "default") -> None:
        if not workers:
            raise ValueError("no --worker given; name each replica as ID=URL, e.g. --worker 1=http://127.0.0.1:8101")
        self.selector = selector.rstrip("/") if selector else None
        self.workers = {wid: url.rstrip("/") for wid, url in workers.items()}
        self.model = model
        self._next = itertools.cycle(sorted(self.workers))
        self._lock = threading.Lock()

    def token_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if isinstance(prompt, str):
            base = next(iter(self.workers.values()))
            return call(f"{base}/tokenize", {"prompt": prompt})["tokens"]
        raise ValueError(f"prompt {str(prompt)[:40]!r}: give one prompt, a string or a list of token ids")

    def choose(self, body: dict[str, Any]) -> tuple[int, str | None]:
        """(worker id, reservation id: None for round robin) for one completion request."""
        if self.selector is None:
            with self._lock:
                return next(self._next), None
        selection_id = uuid.uuid4().hex
        chosen = call(f"{self.selector}/select_and_reserve",
                      {"selection_id": selection_id, "model_name": self.model,
                       "token_ids": self.token_ids(body.get("prompt"))})
        return int(chosen["worker_id"]), selection_id

    def prefilled(self, selection_id: str | None) -> None:
        if selection_id is not None:
            call(f"{self.selector}/reservations/{selection_id}/prefill_complete")

    def release(self, selection_id: str | None) -> None:
        if selection_id is not None:
            call(f"{self.selector}/reservations/{selection_id}", method="DELETE")

    def route(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(worker id, the replica's response) for one non-streaming completion request."""
        wid, selection_id = self.choose(body)
        try:
            out = call(f"{self.workers[wid]}/v1/completions", body)
            self.prefilled(selection_id)
            return wid, out
        finally:
            self.release(selection_id)


def serve(gateway: Gateway, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                return self._reply(404, {"error": f"{self.path}: only /v1/completions is routed"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if body.get("stream"):
                    return self._stream(body)
                wid, out = gateway.route(body)
            except (ValueError, KeyError) as exc:
                return self._reply(400, {"error": str(exc)})
            except urllib.error.URLError as exc:
                return self._reply(502, {"error": f"upstream: {exc}"})
            self._reply(200, out, {"x-kvoffload-worker": str(wid)})

        def _stream(self, body: dict[str, Any]) -> None:
            """Relay the replica's server-sent events as they come; the reservation's prefill
            ends with the first one."""
            wid, selection_id = gateway.choose(body)
            try:
                req = urllib.request.Request(f"{gateway.workers[wid]}/v1/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=TIMEOUT_S) as upstream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("x-kvoffload-worker", str(wid))
                    self.end_headers()  # HTTP/1.0: the body ends when the connection closes
                    first = True
                    while line := upstream.readline():
                        self.wfile.write(line)
                        self.wfile.flush()
                        if first:
                            first = False
                            gateway.prefilled(selection_id)
            finally:
                gateway.release(selection_id)

        def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
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
              "replay_endpoint": replay})


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
    gateway = Gateway(None if args.round_robin else args.selector, workers)
    if gateway.selector is None and not args.round_robin:
        ap.error("give --selector (KV-aware) or --round-robin")
    serve(gateway, args.host, args.port)
    print(f"gateway on http://{args.host}:{args.port} -> {workers}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
