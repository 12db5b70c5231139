"""kvoffload bench serve --replicas 2 --router dynamo: does KV-aware routing over kvoffload's
tiers beat round robin on the same replicas?

Starts the replicas (``vllm serve`` with the same kvoffload configuration, each with every
process it starts bound to a core of its own, publishing KV events over ZMQ), Dynamo's
standalone selection service (``python -m dynamo.select_service`` from ``--dynamo-python``:
ai-dynamo-runtime 1.6.1 in a venv of its own) with every replica registered, and two gateways
in this process (``kvoffload.integrations.dynamo_gateway``): one asks the selection service,
one alternates replicas. Every repetition runs both, in rotating order, after resetting every
replica's caches (the router sees the resets as events); ratios are taken run by run against
round robin, and every response's tokens are compared between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from kvoffload.bench.serve_runs import (
    RunResult,
    decode_seconds,
    hit_tokens,
    preemptions,
    requests_served,
    reset_caches,
    run_http,
    tokens_by_turn,
)
from kvoffload.bench.serve_workloads import Workload
from kvoffload.integrations import dynamo_gateway, gateway_overlap
from kvoffload.testing.health import StartError, wait_healthy
from kvoffload.testing.vllm_server import VllmServer, free_port

ROUTERS = ("round-robin", "dynamo")
#: The selection service's policy for the routed runs (docs/routing.md says why): a block in
#: kvoffload's host tier counts as one on the device, and prompt work weighs eight times a block
#: of decode load. Dynamo 1.6.1 reads it from a file; the variables that set these are deprecated.
POLICY = Path(__file__).resolve().parent.parent / "examples" / "routing" / "dynamo_policy.yaml"
ROUTER_SETTINGS = {"DYN_ROUTER_POLICY_CONFIG": str(POLICY)}


def router_settings(p: argparse.ArgumentParser, given: list[str] | None) -> dict[str, str]:
    """The selection service's settings: ``--router-setting`` NAME=VALUE pairs (``DYN_`` names),
    else :data:`ROUTER_SETTINGS`; ``default`` alone: none (Dynamo's own defaults). A policy file
    must exist (the service would stop at start with a traceback)."""
    if given is None:
        return dict(ROUTER_SETTINGS)
    if given == ["default"]:
        return {}
    out = {}
    for item in given:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("DYN_") or not value.strip():
            p.error(f"--router-setting {item[:80]!r}: give NAME=VALUE with a Dynamo variable, e.g. "
                    f"DYN_ROUTER_POLICY_CONFIG={POLICY.name}, or 'default' for Dynamo's own defaults")
        out[name] = value.strip()
    policy = out.get("DYN_ROUTER_POLICY_CONFIG")
    if policy is not None and not Path(policy).expanduser().is_file():
        p.error(f"--router-setting DYN_ROUTER_POLICY_CONFIG={policy[:80]!r}: no such file; give a Dynamo policy "
                f"YAML, e.g. {POLICY}")
    return out


def start_selector(python: str, log: Path, settings: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Dynamo's selection service, with ``settings`` (its environment variables) over this
    process's environment."""
    port = free_port()
    out = open(log, "wb")  # noqa: SIM115 - the service writes it until it stops
    proc = subprocess.Popen([python, "-m", "dynamo.select_service", "--port", str(port), "--threads", "1"],
                            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(settings or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, f"dynamo.select_service ({python})", 60, lambda: log.read_text()[-2000:])
    except StartError:
        proc.kill()
        raise
    return proc, url


def run_routed(args: argparse.Namespace, wl: Workload, work: Path, model: str, engine_args: list[str],
               kv: dict[str, Any], block_size: int) -> dict[str, list[RunResult]] | None:
    """Every repetition of both routers over ``args.replicas`` replicas of kvoffload config
    ``kv``; None (and a message) when no Dynamo is to be had."""
    from tqdm import tqdm

    python = args.dynamo_python or os.environ.get("KVOFFLOAD_DYNAMO_PYTHON")
    if not python:
        print("error: --router dynamo needs --dynamo-python PATH (a python with ai-dynamo-runtime==1.6.1) or "
              "KVOFFLOAD_DYNAMO_PYTHON")
        return None
    total = sum(len(s.turns) for s in wl.sessions)
    servers: list[VllmServer] = []
    events: dict[int, tuple[str, str]] = {}
    selector: subprocess.Popen[bytes] | None = None
    gateways = []
    cores = _cores()
    try:
        for i in range(args.replicas):
            pub, replay = free_port(), free_port()
            events[i + 1] = (f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
            cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "",
                   "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
            print(f"starting vllm serve: replica {i + 1} ...", flush=True)
            core = cores[i % len(cores)]
            server = VllmServer(model, work / f"replica{i + 1}.log", kv,
                                extra_args=[*engine_args, "--kv-events-config", json.dumps(cfg)],
                                gpu_memory_utilization=args.memory_utilization,
                                env={"VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
                                cpus={core})
            servers.append(server)
            server.start()
        workers = {i + 1: s.url for i, s in enumerate(servers)}
        selector, selector_url = start_selector(python, work / "select_service.log", args.router_settings)
        dynamo_gateway.register(selector_url, workers, events, block_size, model="default")
        urls = {}
        for name in ROUTERS:
            port = free_port()
            gw = dynamo_gateway.Gateway(selector_url if name == "dynamo" else None, workers, explain=True,
                                        affinity=args.affinity)
            gateways.append(dynamo_gateway.serve(gw, "127.0.0.1", port))
            urls[name] = f"http://127.0.0.1:{port}"
        runs: dict[str, list[RunResult]] = {n: [] for n in ROUTERS}
        with tqdm(total=total * args.reps * len(ROUTERS), desc="requests", unit="req", disable=None) as bar:
            for rep in range(args.reps):
                for name in ROUTERS if rep % 2 == 0 else ROUTERS[::-1]:
                    runs[name].append(_run_once(name, urls[name], model, servers, wl, bar,
                                                selector_url if name == "dynamo" else None))
    finally:
        for g in gateways:
            g.shutdown()
        if selector is not None:
            selector.terminate()
            selector.wait(timeout=30)
        for s in servers:
            s.stop()
    same = sum(tokens_by_turn(a) == tokens_by_turn(b) for a, b in zip(runs["round-robin"], runs["dynamo"]))
    print(f"tokens identical, dynamo vs round-robin: {same}/{len(runs['dynamo'])} runs")
    return runs


def _cores() -> list[int]:
    """The cores this process may use (where the platform says; else 0..cpu_count-1)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _counters(server: VllmServer) -> tuple[dict[str, float], dict[str, float]]:
    """A replica's prefix hit tokens by tier; and the requests it finished, those it preempted
    and its seconds of decoding; from one scrape."""
    m = server.metrics()
    return hit_tokens(m), {"requests": requests_served(m), "preemptions": preemptions(m), "decode_s": decode_seconds(m)}


def router_cold(selector: str, prompts: list[list[int]], timeout_s: float = 20.0) -> tuple[float, int]:
    """Wait until the selection service sees none of ``prompts`` cached on any replica (the
    replicas' resets reach it as KV events); (seconds waited, blocks it still saw at the end)."""
    t0 = time.monotonic()
    while True:
        seen = 0
        for tokens in prompts:
            for row in gateway_overlap.overlap_rows(selector, "default", tokens, 10.0):
                seen += max(gateway_overlap.cached_blocks(row))
        if not seen or time.monotonic() - t0 > timeout_s:
            return time.monotonic() - t0, seen
        time.sleep(0.2)


def _run_once(name: str, url: str, model: str, servers: list[VllmServer], wl: Workload, bar: Any,
              selector: str | None = None) -> RunResult:
    for s in servers:
        reset_caches(s, external=True)  # every run starts cold, for the router too:
        # vLLM publishes a reset's KV events with the engine's next step, and an idle engine takes
        # none: one token of a one-token prompt makes it step (and stores no block).
        s.post("/v1/completions", {"model": model, "prompt": [1], "max_tokens": 1})
    if selector is not None:
        waited, left = router_cold(selector, [sess.prompt(0, list(sess.prefix)) for sess in wl.sessions])
        if left:
            print(f"warning: {waited:.0f} s after the resets the router still sees {left} blocks of the workload's "
                  "first prompts cached: this run's first turns are routed by them", flush=True)
    before = [_counters(s) for s in servers]
    turns, wall = run_http(url, model, wl, bar)
    time.sleep(1.5)  # counters reach /metrics with the engines' next stats reports
    hits: dict[str, float] = {}
    replicas = []
    for s, (hits0, other0) in zip(servers, before):
        hits1, other1 = _counters(s)
        found = {k: v - hits0.get(k, 0) for k, v in hits1.items()}
        replicas.append({**found, **{k: v - other0.get(k, 0) for k, v in other1.items()}})
        for k, v in found.items():
            hits[k] = hits.get(k, 0) + v
    return RunResult(name, turns, wall, hits, replicas)


__all__ = ["ROUTERS", "ROUTER_SETTINGS", "router_settings", "run_routed"]
