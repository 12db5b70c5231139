"""`kvoffload` command line: run, bench, config check (and sim, once policies land)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from typing import Any

from kvoffload import __version__
from kvoffload.logs import LEVELS, configure_cli


def _engine_config(args: argparse.Namespace, kv_offload: Any):
    from kvoffload.engine import EngineConfig

    swap = args.preemption_mode == "swap" and kv_offload is not None
    return EngineConfig(model=args.model, block_size=args.block_size, num_gpu_blocks=args.num_gpu_blocks,
                        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs, kv_offload=kv_offload, seed=args.seed,
                        preemption_mode="swap" if swap else "recompute")


def _run_once(args: argparse.Namespace, kv_offload: Any,
              keep_open: contextlib.ExitStack | None = None) -> tuple[dict[str, Any], list[list[int]], dict[str, Any]]:
    """One engine over the workload; with ``keep_open`` the engine is closed only when that
    stack is (a replica whose lent store memory must outlive its run)."""
    from kvoffload.engine import LLM
    from kvoffload.report import summarize
    from kvoffload.workload import ChatWorkload, run_chat_workload

    wl = ChatWorkload(conversations=args.conversations, turns=args.turns, system_tokens=args.system_tokens,
                      user_tokens=args.user_tokens, max_tokens=args.max_tokens, seed=args.seed)
    with contextlib.ExitStack() as own:
        llm = (keep_open or own).enter_context(LLM(_engine_config(args, kv_offload)))
        t0 = time.perf_counter()
        generated = run_chat_workload(llm, wl)
        wall = time.perf_counter() - t0
        stats = llm.stats()
    return summarize(stats, wall), generated, stats


def _offload_column(summary: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    for direction, d in stats.get("transfer", {}).items():
        if d.get("jobs"):
            summary[f"{direction} MiB / GB/s"] = f"{d['bytes'] / 2**20:.1f} / {d['gb_per_s']:.2f}"
    summary["stores skipped (reuse filter)"] = stats["connector"].get("stores_skipped_by_filter", 0)
    return summary


def _media(config: str) -> list[str]:
    from kvoffload.config import OffloadConfig

    return [t.medium for t in OffloadConfig.coerce(config).tiers]


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    from kvoffload.examples import resolve_config
    from kvoffload.report import format_table

    if args.threads < 1:
        print(f"error: --threads {args.threads}: give at least 1", file=sys.stderr)
        return 2
    args.config = resolve_config(args.config)
    if args.replicas < 1:
        print(f"error: --replicas {args.replicas}: give at least 1", file=sys.stderr)
        return 2
    if args.replicas > 1 and not args.no_offload and "disk" in _media(args.config):
        print(f"error: --replicas {args.replicas} runs the replicas side by side in this process, and a disk tier "
              "has one owner; use a config without one (e.g. --config mooncake)", file=sys.stderr)
        return 2
    if args.preemption_mode == "swap" and args.no_offload:
        print("error: --preemption-mode swap saves preempted requests' KV to an offload tier; drop --no-offload "
              "or use --preemption-mode recompute", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    columns: dict[str, dict[str, Any]] = {}
    print(f"model={args.model}, device KV cache {args.num_gpu_blocks} blocks x {args.block_size} tokens, "
          f"max_num_seqs={args.max_num_seqs}; workload: {args.conversations} chats x {args.turns} turns, "
          f"system prompt {args.system_tokens} + {args.user_tokens} user tokens per turn, "
          f"{args.max_tokens} generated; offload config: {'none' if args.no_offload else args.config}; "
          f"{args.threads} torch thread(s)"
          + ("; preemption: swap (the run without offload recomputes)" if args.preemption_mode == "swap" else ""))
    base_summary, base_tokens, _ = _run_once(args, None)
    columns["no offload"] = base_summary
    if args.config and not args.no_offload:
        offload: Any = args.config
        if args.prometheus_port is not None:
            from kvoffload.config import OffloadConfig

            if not 0 < args.prometheus_port < 65536:
                print(f"error: --prometheus-port {args.prometheus_port} is not a TCP port (1-65535)", file=sys.stderr)
                return 2

            cfg = OffloadConfig.coerce(args.config)
            offload = dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics, prometheus_port=args.prometheus_port))
        same = True
        with contextlib.ExitStack() as replicas:  # every replica stays up until the last has run
            for r in range(args.replicas):
                summary, tokens, stats = _run_once(args, offload, replicas)
                columns["offload" if args.replicas == 1 else f"replica {r + 1}"] = _offload_column(summary, stats)
                same = same and tokens == base_tokens
        print(format_table(columns))
        print(f"outputs identical to the run without offload: {'yes' if same else 'NO'}")
        return 0 if same else 1
    print(format_table(columns))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"kvoffload.bench.{args.what}_bench")
    return int(module.main(args.rest) or 0)


def cmd_config_check(args: argparse.Namespace) -> int:
    from kvoffload.config import ConfigError, OffloadConfig, check_environment, describe
    from kvoffload.examples import resolve_config

    try:
        cfg = OffloadConfig.from_yaml(resolve_config(args.file))
        warnings = check_environment(cfg)
        text = describe(cfg, block_bytes=args.block_bytes)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    from kvoffload_policies.experiment import main as sim_main

    return sim_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvoffload", description="KV-cache offload connector and bundled engine")
    parser.add_argument("--version", action="version", version=f"kvoffload {__version__}")
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help="kvoffload's log level (default: $KVOFFLOAD_LOG_LEVEL, else warning)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the bundled engine on a multi-turn chat workload and report")
    run.add_argument("--model", default="tiny", help="tiny | small | path to a Llama checkpoint directory")
    run.add_argument("--config", default="cpu",
                     help="offload YAML, or a packaged example by name (cpu, cpu_disk, mooncake, research_arc; default: cpu);"
                          " compared side by side with a run without offload")
    run.add_argument("--no-offload", action="store_true", help="ignore --config and run without offload")
    run.add_argument("--num-gpu-blocks", type=int, default=64, help="device KV cache size in blocks")
    run.add_argument("--block-size", type=int, default=16)
    run.add_argument("--max-model-len", type=int, default=4096)
    run.add_argument("--max-num-batched-tokens", type=int, default=512)
    run.add_argument("--max-num-seqs", type=int, default=3)
    run.add_argument("--conversations", type=int, default=12)
    run.add_argument("--turns", type=int, default=3)
    run.add_argument("--system-tokens", type=int, default=256)
    run.add_argument("--user-tokens", type=int, default=48)
    run.add_argument("--max-tokens", type=int, default=16)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--threads", type=int, default=1,
                     help="torch CPU threads (default 1: the bundled models are small, and with more threads "
                          "they run several times slower whenever anything else uses the machine)")
    run.add_argument("--prometheus-port", type=int, default=None,
                     help="serve the offload run's metrics at http://HOST:PORT/metrics (overrides the config's)")
    run.add_argument("--replicas", type=int, default=1,
                     help="run N offload replicas one after another, each a fresh engine with its own CPU tier "
                          "(a shared tier such as mooncake lets the later ones hit what the first computed)")
    run.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                     help="swap: offload a preempted request's KV and restore it (needs --config)")
    run.set_defaults(func=cmd_run)

    bench = sub.add_parser("bench", help="speed figures with baselines and ratios")
    bench.add_argument("what", choices=["engine", "manager", "transfer", "e2e", "disk", "remote", "preemption", "chaos", "serve"])
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the benchmark")
    bench.set_defaults(func=cmd_bench)

    sim = sub.add_parser("sim", help="replay a trace over eviction policies and capacities", add_help=False)
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    sim.set_defaults(func=cmd_sim)

    config = sub.add_parser("config", help="offload config tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a YAML file and print the resolved tiers")
    check.add_argument("file")
    check.add_argument("--block-bytes", type=int, default=None,
                       help="bytes per offloaded block (default: the bundled tiny model at block size 16)")
    check.set_defaults(func=cmd_config_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        # `module:Class` plugins (policies, specs, tier kinds) next to the user resolve as they
        # would under `python -m kvoffload`; appended, so nothing installed is shadowed.
        sys.path.append(os.getcwd())
    if argv[:1] == ["sim"]:  # its own parser: options start right after the subcommand
        from kvoffload_policies.experiment import main as sim_main

        try:
            return sim_main(argv[1:])
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    try:
        configure_cli(args.log_level)
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:  # config, disk tier in use / full / unwritable
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
