"""``python examples/routing/gateway.py``: the gateway's command line (``dynamo_gateway``).

Every flag is checked before anything starts, each fault in one line naming the value and the
fix: a timeout that overflows a socket's, a replica named twice, event endpoints for a
replica that is not one.
"""

from __future__ import annotations

import argparse
import threading

from kvoffload.integrations.dynamo_gateway import SESSION_IDLE_S, Gateway, register, serve
from kvoffload.integrations.gateway_server import MAX_CONNECTIONS
from kvoffload.integrations.gateway_upstream import COMPLETION_TIMEOUT_S, TIMEOUT_S


def worker_spec(text: str) -> tuple[int, str]:
    wid, sep, url = text.partition("=")
    if not sep or not (wid.isascii() and wid.isdigit()) or len(wid) > 9 or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"--worker {text!r}: write ID=URL, e.g. 1=http://127.0.0.1:8101")
    return int(wid), url


def events_spec(text: str) -> tuple[int, tuple[str, str]]:
    wid, _, endpoints = text.partition("=")
    pub, _, replay = endpoints.partition(",")
    if not (wid.isascii() and wid.isdigit()) or len(wid) > 9 or not pub.startswith("tcp://") \
            or not replay.startswith("tcp://"):
        raise argparse.ArgumentTypeError(f"--events {text!r}: write ID=PUB,REPLAY with tcp:// endpoints")
    return int(wid), (pub, replay)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="A KV-aware gateway in front of vllm serve replicas, choosing by "
                                             "Dynamo's standalone selection service.")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--selector", help="the selection service's URL (e.g. http://127.0.0.1:8092)")
    ap.add_argument("--worker", type=worker_spec, action="append", default=[], help="ID=URL of a replica (repeat)")
    ap.add_argument("--events", type=events_spec, action="append", default=[],
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
                    help="seconds a call to the selection service or /tokenize may take in all before a 504, and "
                         "a client may take to send its request")
    ap.add_argument("--completion-timeout", type=float, default=COMPLETION_TIMEOUT_S,
                    help="seconds a replica may take on a completion (a stream: may stay silent between chunks)")
    ap.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                    help="client connections served at once; more are answered 503")
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    workers: dict[int, str] = {}
    for wid, url in args.worker:
        if wid in workers:
            ap.error(f"--worker {wid}={url}: replica {wid} is already {workers[wid]}; give each replica its own ID")
        workers[wid] = url
    events = dict(args.events)
    if len(events) < len(args.events):
        ap.error("--events names a replica twice: give each replica's endpoints once")
    if events and not args.selector:
        ap.error("--events needs --selector")
    if unknown := sorted(set(events) - set(workers)):
        ap.error(f"--events names replica {unknown[0]}, which no --worker gives: add --worker {unknown[0]}=URL")
    try:
        gateway = Gateway(None if args.round_robin else args.selector, workers, timeout_s=args.timeout,
                          completion_timeout_s=args.completion_timeout, explain=args.explain,
                          affinity=args.affinity, session_idle_s=args.session_idle)
        if gateway.selector is None and not args.round_robin:
            ap.error("give --selector (KV-aware) or --round-robin")
        if events:
            register(args.selector, {w: workers[w] for w in events}, events, args.block_size)
        serve(gateway, args.host, args.port, args.max_connections)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"gateway on http://{args.host}:{args.port} -> {workers}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
