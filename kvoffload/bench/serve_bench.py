"""kvoffload bench serve: does kvoffload make a real ``vllm serve`` faster, and what does it cost
where it cannot help?

Starts ``vllm serve`` once per configuration (plain vLLM with prefix caching, and each
kvoffload configuration), all with the same engine settings, the same device cache size
(``--num-gpu-blocks-override``: a connector must not change how much KV the device holds) and
the same CPU reservation (vLLM's CPU backend reserves one core more for a server with any KV
connector: on 2 cores that gave the kvoffload server both cores and plain vLLM one), checks
that vLLM's effective configs are equal field by field, and drives each with the same
workload of concurrent streaming clients over HTTP (token-id prompts, no tokenizer). Every
repetition runs every configuration once, in a rotating order, after resetting its caches;
ratios to plain vLLM are taken run by run. Reports TTFT p50/p95/p99 (all requests, and the
returning turns of a chat), inter-token latency, request and token throughput, prefix hits by
tier from ``/metrics``, and whether every response's tokens equal plain vLLM's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvoffload.bench.dummy_model import write_model_of
from kvoffload.bench.measure import preamble
from kvoffload.bench.serve_configs import (
    config_names,
    configurations,
    effective_differences,
    offload_config,
    sends_hints,
    server_flags,
    tier_sets,
)
from kvoffload.bench.serve_options import BUNDLED_BATCH_TOKENS, BUNDLED_BLOCK, VLLM_BLOCK, parse_options
from kvoffload.bench.serve_report import plot, report
from kvoffload.bench.serve_routing import run_routed
from kvoffload.bench.serve_runs import RunResult, TurnResult, run_once
from kvoffload.bench.serve_workloads import Workload, chat, in_rounds, mix, noreuse, rag, request_log, trace, weka
from kvoffload.testing.vllm_server import VllmServer
from kvoffload.traces import resolve_trace


# ---- the caches and the servers --------------------------------------------------------------
def cache_geometry(wl: Workload, block: int, device_fraction: float) -> tuple[int, int, int]:
    """(max_model_len, working set in blocks, device cache in blocks) for ``block``-token
    blocks: the device cache holds ``device_fraction`` of the working set, and at least one
    longest request plus two blocks (else it could not run at all)."""
    max_len = math.ceil((wl.max_context + 1) / block) * block
    ws_blocks = math.ceil(wl.working_set_tokens / block)
    return max_len, ws_blocks, max(math.ceil(device_fraction * ws_blocks), max_len // block + 2)


def rotation(names: list[str], rep: int) -> list[str]:
    """Configurations in the order repetition ``rep`` runs them: each goes first in turn."""
    k = rep % len(names)
    return names[k:] + names[:k]


def build_workload(args: argparse.Namespace) -> Workload:
    if args.workload == "chat":
        return chat(args.conversations, args.turns, args.context, args.user_tokens, args.max_tokens, args.think,
                    args.vocab, args.seed)
    if args.workload == "rag":
        return rag(args.documents, args.requests, args.context, args.user_tokens, args.max_tokens, args.zipf,
                   args.clients, args.vocab, args.seed)
    if args.workload == "mix":
        return mix(args.conversations, args.fresh, args.turns, args.context, args.user_tokens, args.fresh_tokens,
                   args.max_tokens, args.first, args.vocab, args.seed)
    if args.workload == "log":
        if not args.log:
            raise ValueError("--workload log needs --log FILE (OpenAI-style JSONL: prompt_token_ids, prompt or "
                             "messages a line; optional timestamp, session)")
        wl = request_log(args.log, args.clients, args.max_tokens, args.time_scale, args.vocab, args.requests_limit)
        print(f"note: {wl.note}")  # the replay's span, and the pauses it cuts
        return wl
    if args.workload == "noreuse":
        return noreuse(args.requests, args.context, args.max_tokens, args.clients, args.vocab, args.seed)
    path = resolve_trace(args.trace)
    if path.name.endswith(".tar.gz"):
        return weka(path, args.conversations, args.turns, time_scale=args.time_scale, max_tokens=args.max_tokens,
                    vocab=args.vocab)
    return trace(path, args.requests, max_tokens=args.max_tokens, clients=args.clients, vocab=args.vocab)


def _workload(p: argparse.ArgumentParser, args: argparse.Namespace) -> Workload:
    try:
        return build_workload(args)
    except ValueError as exc:
        p.error(str(exc))


def hints_section(args: argparse.Namespace, wl: Workload) -> dict[str, Any] | None:
    """The servers' ``hints`` config: a replayed trace runs ``1 / --time-scale`` times faster
    than it happened, and so does the hints' clock (the hints are in trace seconds)."""
    return {"clock_speed": 1 / args.time_scale} if wl.name == "weka" else None


def main(argv: list[str] | None = None) -> int:
    p, args, routed_config = parse_options(argv, __doc__)
    if args.engine == "bundled":
        if args.url:
            p.error("--url measures a running vLLM server; drop it for --engine bundled")
        wl = _workload(p, args)
        print(preamble(args.reps))
        with tempfile.TemporaryDirectory(prefix="kvoffload-serve-") as tmp:
            return _run_bundled(args, wl, Path(tmp))
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("error: bench serve needs aiohttp and vLLM (pip install 'kvoffload[vllm]')", file=sys.stderr)
        return 2
    wl = _workload(p, args)
    print(preamble(args.reps))
    with tempfile.TemporaryDirectory(prefix="kvoffload-serve-") as tmp:
        if routed_config is not None:
            return _run_routed(args, wl, Path(tmp), routed_config)
        return _run(args, wl, Path(tmp))


def _engine(args: argparse.Namespace, wl: Workload, work: Path) -> tuple[str, dict[str, Any], int, int]:
    """(model, vLLM engine settings, working-set blocks, device blocks) every server shares: a
    checkpoint of the given shape with dummy weights unless ``--model``, and a device cache sized
    to ``--device-fraction`` of the workload."""
    model = args.model
    engine: dict[str, Any] = {"dtype": args.dtype, "max_num_seqs": max(8, wl.concurrency),
                              "gpu_memory_utilization": args.memory_utilization}
    if model is None:
        model = str(work / "model")
        write_model_of(Path(model), args)
        engine["load_format"] = "dummy"
    max_len, ws_blocks, device_blocks = cache_geometry(wl, VLLM_BLOCK, args.device_fraction)
    engine.update(max_model_len=max_len, num_gpu_blocks_override=device_blocks)
    if args.max_batched_tokens:
        engine["max_num_batched_tokens"] = args.max_batched_tokens
    return model, engine, ws_blocks, device_blocks


def _run_routed(args: argparse.Namespace, wl: Workload, work: Path, config_name: str) -> int:
    model, engine, ws_blocks, device_blocks = _engine(args, wl, work)
    kv = configurations([config_name], args.cpu, args.disk, work, bool(args.throttle_tier))[config_name]
    assert kv is not None, "main() refuses plain vLLM as the replicas' configuration"
    print(f"workload {wl.name}: {len(wl.sessions)} sessions, {sum(len(s.turns) for s in wl.sessions)} requests, "
          f"concurrency {wl.concurrency}, working set {ws_blocks} blocks of {VLLM_BLOCK} tokens; {args.replicas} "
          f"replicas ({config_name}), each a device cache of {device_blocks} blocks and one core; model {model}; "
          f"router settings: {' '.join(f'{k}={v}' for k, v in args.router_settings.items()) or 'Dynamo defaults'}")
    runs = run_routed(args, wl, work, model, server_flags(engine), kv, VLLM_BLOCK)
    if runs is None:
        return 2
    return _finish(args, wl, runs, device_blocks, ws_blocks, references=("round-robin",))


def _run(args: argparse.Namespace, wl: Workload, work: Path) -> int:
    from tqdm import tqdm

    total_turns = sum(len(s.turns) for s in wl.sessions)
    if args.url:
        server = VllmServer.attach(args.url, args.model or "")
        with tqdm(total=total_turns * args.reps, desc="requests", unit="req", disable=None) as bar:
            attached = {"url": [run_once("url", server, wl, bar) for _ in range(args.reps)]}
        print(report(attached)[0])
        return 0
    model, engine, ws_blocks, device_blocks = _engine(args, wl, work)
    extra = server_flags(engine)
    configs = configurations(config_names(args.configs), args.cpu, args.disk, work, bool(args.throttle_tier),
                             hints_section(args, wl))
    for line in effective_differences(model, engine, configs):
        print(f"warning: engine settings differ: {line}")
    print(f"workload {wl.name}: {len(wl.sessions)} sessions, {total_turns} requests, concurrency {wl.concurrency}, "
          f"working set {ws_blocks} blocks of {VLLM_BLOCK} tokens; device cache {device_blocks} blocks "
          f"({device_blocks / ws_blocks:.0%}); model {model}")
    servers: dict[str, VllmServer] = {}
    try:
        for name, kv in configs.items():
            print(f"starting vllm serve: {name} ...", flush=True)
            servers[name] = VllmServer(model, work / f"{name.replace('+', '_')}.log", kv,
                                       extra_args=extra,
                                       gpu_memory_utilization=args.memory_utilization,
                                       env={"VLLM_CPU_NUM_OF_RESERVED_CPU": str(args.reserved_cpus)})
            servers[name].start()
        runs: dict[str, list[RunResult]] = {n: [] for n in servers}
        names = list(servers)
        with tqdm(total=total_turns * args.reps * len(names), desc="requests", unit="req", disable=None) as bar:
            for rep in range(args.reps):
                for name in rotation(names, rep):
                    runs[name].append(run_once(name, servers[name], wl, bar, sends_hints(name)))
    finally:
        for s in servers.values():
            s.stop()
    return _finish(args, wl, runs, device_blocks, ws_blocks)


def _finish(args: argparse.Namespace, wl: Workload, runs: dict[str, list[RunResult]], device_blocks: int,
            ws_blocks: int, references: tuple[str, ...] = ("plain",)) -> int:
    text, data = report(runs, "vLLM" if args.engine == "vllm" else "engine", (*references, *args.also_vs))
    print(text)
    data.update(engine=args.engine, workload=wl.name, device_blocks=device_blocks, working_set_blocks=ws_blocks,
                reps=args.reps, command=" ".join(sys.argv))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    if args.write_log:
        from kvoffload.bench.served_log import save_first_run

        print(save_first_run(args, wl, next(iter(runs.values()))[0]))
    if args.plot:
        plot(runs, Path(args.plot), wl.name)
        print(f"plot: {args.plot}")
    return 0


def _run_bundled(args: argparse.Namespace, wl: Workload, work: Path) -> int:
    """The same workload on the bundled engine: one engine per configuration, reset before each
    run, as the vLLM servers are."""
    import torch
    from tqdm import tqdm

    from kvoffload.bench.serve_bundled import reset_cold, run_bundled
    from kvoffload.engine.config import EngineConfig
    from kvoffload.engine.llm import LLM

    torch.set_num_threads(args.threads)
    model, load_format = args.model, "auto"
    if model is None:
        model, load_format = str(work / "model"), "dummy"
        write_model_of(Path(model), args)
    names = config_names(args.configs)
    tiers = tier_sets(args.cpu, args.disk, work)
    offload = {name: offload_config(name, tiers, bool(args.throttle_tier), hints_section(args, wl)) for name in names}
    max_len, ws_blocks, device_blocks = cache_geometry(wl, BUNDLED_BLOCK, args.device_fraction)
    total_turns = sum(len(s.turns) for s in wl.sessions)
    print(f"workload {wl.name} on the bundled engine: {len(wl.sessions)} sessions, {total_turns} requests, "
          f"concurrency {wl.concurrency}, working set {ws_blocks} blocks of {BUNDLED_BLOCK} tokens; device cache "
          f"{device_blocks} blocks ({device_blocks / ws_blocks:.0%}) on {args.device}; {args.threads} thread(s)")
    engines: dict[str, LLM] = {}
    try:
        for name in names:
            engines[name] = LLM(EngineConfig(
                model=model, load_format=load_format, dtype=args.dtype, block_size=BUNDLED_BLOCK,
                num_gpu_blocks=device_blocks + 1, max_model_len=max_len, max_num_seqs=max(8, wl.concurrency),
                max_num_batched_tokens=args.max_batched_tokens or BUNDLED_BATCH_TOKENS, device=args.device,
                kv_offload=offload[name]))
        runs: dict[str, list[RunResult]] = {n: [] for n in names}
        with tqdm(total=total_turns * args.reps * len(names), desc="requests", unit="req", disable=None) as bar:
            for rep in range(args.reps):
                for name in rotation(names, rep):
                    llm = engines[name]
                    reset_cold(llm, name)  # every run starts cold
                    before = dict(llm.stats()["prefix_hit_tokens"])
                    hinted = sends_hints(name)

                    def run(sub: Workload, llm: LLM = llm, hinted: bool = hinted) -> tuple[list[Any], float]:
                        return run_bundled(llm, sub, bar, hinted)

                    turns, wall = in_rounds(wl, run) if wl.rounds else run(wl)
                    hits = {k: v - before.get(k, 0) for k, v in llm.stats()["prefix_hit_tokens"].items()}
                    runs[name].append(RunResult(name, [TurnResult(*t) for t in turns], wall, hits))
    finally:
        for llm in engines.values():
            llm.close()
    return _finish(args, wl, runs, device_blocks, ws_blocks)
