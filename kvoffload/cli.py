"""`kvoffload` command line: run, bench, sim, plan, cache, config check."""

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

#: ``kvoffload bench NAME``: what each measures, against what.
BENCHMARKS = {
    "serve": "a real vllm serve (or the bundled engine) over HTTP: TTFT, throughput vs plain vLLM",
    "e2e": "the bundled engine's chat workload with and without CPU offload",
    "demo": "`kvoffload run`'s workload per model: does offload (auto) lose to none? (the 1.03x bar)",
    "engine": "engine overheads: schedule() per step, prefix lookup per block, model tokens/s",
    "manager": "block-ledger speed and memory vs the textbook OrderedDict design (--vs-vllm: vLLM's)",
    "transfer": "device <-> host block copies: batched vs a per-block loop vs one contiguous copy",
    "disk": "disk-tier record I/O vs sequential file I/O; restart recovery time",
    "remote": "the Mooncake tier's store and load paths vs the raw store calls",
    "fs": "the shared fs tier with 1-4 processes on one directory vs plain file I/O; lookups/s",
    "preemption": "swap vs recompute preemption on a workload that forces it",
    "weights": "the whole-file weight fingerprint at start-up vs reading the checkpoint; a cached start",
    "chaos": "random engines, tiers and faults: every output checked against a reference",
    "profile": "the speeds `kvoffload plan` prices with (prefill, tier loads) vs a plain memory copy; writes the YAML",
    "plan": "`kvoffload plan`'s predictions vs live bundled-engine runs: tokens per tier, returning TTFT p50",
    "mix": "vLLM offline (its Python): returning turns batched with fresh prompts, TTFT per configuration",
    "degrade": "a disk tier that slows down after auto timed it: burst TTFT vs recomputing (plain)",
}


def _engine_config(args: argparse.Namespace, kv_offload: Any):
    from kvoffload.engine import EngineConfig

    swap = args.preemption_mode == "swap" and kv_offload is not None
    return EngineConfig(model=args.model, block_size=args.block_size, num_gpu_blocks=_device_blocks(args),
                        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs, kv_offload=kv_offload, seed=args.seed,
                        preemption_mode="swap" if swap else "recompute")


def _device_blocks(args: argparse.Namespace) -> int:
    """``--num-gpu-blocks`` counts blocks of every layer; a hybrid model's block holds one layer
    slot of one KV-cache group, so the same memory is more (smaller) blocks."""
    from kvoffload.engine.kv_groups import kv_cache_layout
    from kvoffload.engine.model_config import BUILTIN_MODELS, ModelConfig

    cfg = ModelConfig.tiny(args.model) if args.model in BUILTIN_MODELS else ModelConfig.from_pretrained(args.model)
    return args.num_gpu_blocks * cfg.num_hidden_layers // kv_cache_layout(cfg).num_tensors


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


def _model_note(model: str) -> str:
    """What the model's timings stand for: offload pays where recomputing a prefix costs more
    than copying its KV back, and on the bundled test model it barely costs anything."""
    if model == "tiny" or model == "tiny-hybrid":
        return (f"note: {model} is a test model whose prefill is nearly free (a step is mostly fixed costs), so "
                "offload's own per-step work shows in its timings; --model small (the default) is the demo")
    if model == "small":
        return ("small (4 layers, hidden 256): on a CPU its prefill costs far more than loading the same KV "
                "back from host memory, the trade-off a real model has on a GPU server")
    return f"{model}: a checkpoint; offload pays where its prefill costs more than loading its KV back"


def _offload_column(summary: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    for direction, d in stats.get("transfer", {}).items():
        if d.get("jobs"):
            summary[f"{direction} MiB / GB/s"] = f"{d['bytes'] / 2**20:.1f} / {d['gb_per_s']:.2f}"
    summary["stores skipped (reuse filter)"] = stats["connector"].get("filter_skipped_blocks", 0)
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
    blocks = _device_blocks(args)
    per_group = f" ({blocks} blocks of the hybrid model's KV-cache groups)" if blocks != args.num_gpu_blocks else ""
    print(f"model={args.model}, device KV cache {args.num_gpu_blocks} blocks x {args.block_size} tokens{per_group}, "
          f"max_num_seqs={args.max_num_seqs}; workload: {args.conversations} chats x {args.turns} turns, "
          f"system prompt {args.system_tokens} + {args.user_tokens} user tokens per turn, "
          f"{args.max_tokens} generated; offload config: {'none' if args.no_offload else args.config}; "
          f"{args.threads} torch thread(s)"
          + ("; preemption: swap (the run without offload recomputes)" if args.preemption_mode == "swap" else ""))
    print(_model_note(args.model))
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
        print("timings are one run of each column; `kvoffload bench e2e` repeats them (median ± spread)")
        _write_json(args.json, columns, same)
        return 0 if same else 1
    print(format_table(columns))
    _write_json(args.json, columns, None)
    return 0


def _write_json(path: str | None, columns: dict[str, dict[str, Any]], identical: bool | None) -> None:
    """The report's columns as JSON (numbers as numbers), for scripts."""
    if path is None:
        return
    import json

    def value(v: Any) -> Any:
        if isinstance(v, str):
            text = v.rstrip("%")
            try:
                return float(text) / (100 if v.endswith("%") else 1)
            except ValueError:
                return v
        return v

    data = {"columns": {name: {k: value(v) for k, v in col.items()} for name, col in columns.items()},
            "outputs_identical": identical}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"kvoffload.bench.{args.what}_bench")
    return int(module.main(args.rest) or 0)


def cmd_config_check(args: argparse.Namespace) -> int:
    from kvoffload.config import ConfigError, OffloadConfig, check_environment, describe
    from kvoffload.examples import resolve_config

    path = resolve_config(args.file)
    if args.block_size < 1:
        print(f"error: --block-size {args.block_size}: must be a positive number of tokens", file=sys.stderr)
        return 2
    try:
        cfg = OffloadConfig.from_yaml(path)
        block_bytes = args.block_bytes
        if args.model is not None:
            block_bytes = _model_block_bytes(args.model, args.block_size) * cfg.block_size_factor(args.block_size)
        try:
            warnings = check_environment(cfg)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        text = describe(cfg, block_bytes=block_bytes, engine_block_size=args.block_size)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def _model_block_bytes(model: str, block_size: int) -> int:
    """Bytes of one engine block of KV for a checkpoint's ``config.json`` (K and V, every layer)."""
    from kvoffload.config import ConfigError
    from kvoffload.plan.model_shape import ModelShapeError, kv_shape

    try:
        return kv_shape(model).bytes_per_token * block_size
    except ModelShapeError as exc:
        raise ConfigError(str(exc)) from None


def cmd_sim(args: argparse.Namespace) -> int:
    from kvoffload_policies.experiment import main as sim_main

    return sim_main(args.rest)


def cmd_plan(args: argparse.Namespace) -> int:
    from kvoffload.plan.cli import main as plan_main

    return plan_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvoffload", description="KV-cache offload connector and bundled engine")
    parser.add_argument("--version", action="version", version=f"kvoffload {__version__}")
    parser.add_argument("--log-level", choices=LEVELS, default=None,
                        help="kvoffload's log level (default: $KVOFFLOAD_LOG_LEVEL, else warning)")
    sub = parser.add_subparsers(dest="command", required=True)

    from kvoffload.help_format import DefaultsFormatter

    run = sub.add_parser("run", help="run the bundled engine on a multi-turn chat workload and report",
                         description="Run the bundled engine on a multi-turn chat workload without offload and "
                                     "with --config's tiers, and print both side by side.",
                         formatter_class=DefaultsFormatter)
    run.add_argument("--model", default="small",
                     help="small | tiny | tiny-hybrid | a Llama-family or Gemma 3 checkpoint directory (small: its "
                          "prefill costs far more than loading its KV back, as a real model's does on a GPU server; "
                          "tiny is a test model whose prefill is nearly free, so offload's fixed costs show)")
    from kvoffload.examples import known_examples

    engine_examples = [name for name in known_examples() if not name.startswith("vllm_")]  # those are vLLM's
    run.add_argument("--config", default="cpu",
                     help=f"offload YAML, or a packaged example by name ({', '.join(engine_examples)}; default: cpu);"
                          " compared side by side with a run without offload")
    run.add_argument("--no-offload", action="store_true", help="ignore --config and run without offload")
    run.add_argument("--num-gpu-blocks", type=int, default=64,
                     help="device KV cache size in blocks of all layers (a hybrid model gets the same memory "
                          "as smaller per-group blocks)")
    run.add_argument("--block-size", type=int, default=16, help="tokens per engine KV block")
    run.add_argument("--max-model-len", type=int, default=4096, help="longest prompt + output, in tokens")
    run.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens one engine step may compute")
    run.add_argument("--max-num-seqs", type=int, default=3, help="requests running at once")
    run.add_argument("--conversations", type=int, default=12, help="chats in the workload")
    run.add_argument("--turns", type=int, default=3, help="turns per chat")
    run.add_argument("--system-tokens", type=int, default=256, help="each chat's own system prompt, in tokens")
    run.add_argument("--user-tokens", type=int, default=48, help="tokens a user turn adds")
    run.add_argument("--max-tokens", type=int, default=16, help="tokens generated per turn")
    run.add_argument("--seed", type=int, default=0, help="workload and weights seed")
    run.add_argument("--threads", type=int, default=1,
                     help="torch CPU threads (default 1: the bundled models are small, and with more threads "
                          "they run several times slower whenever anything else uses the machine)")
    run.add_argument("--prometheus-port", type=int, default=None,
                     help="serve the offload run's metrics at http://HOST:PORT/metrics (overrides the config's)")
    run.add_argument("--replicas", type=int, default=1,
                     help="run N offload replicas one after another, each a fresh engine with its own CPU tier "
                          "(a shared tier such as mooncake lets the later ones hit what the first computed)")
    run.add_argument("--json", default=None, metavar="FILE", help="also write the report's columns here as JSON")
    run.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                     help="swap: offload a preempted request's KV and restore it (needs --config)")
    run.set_defaults(func=cmd_run)

    benches = "\n".join(f"  {name:<11} {text}" for name, text in BENCHMARKS.items())
    bench = sub.add_parser("bench", help="speed figures with baselines and ratios",
                           description="Each benchmark prints our figure, a baseline measured in the same run and "
                                       "the ratio, as a median with its spread. `kvoffload bench NAME --help` lists "
                                       "its options.\n\n" + benches,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("what", choices=list(BENCHMARKS), metavar="NAME", help="one of: " + ", ".join(BENCHMARKS))
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the benchmark")
    bench.set_defaults(func=cmd_bench)

    sim = sub.add_parser("sim", help="replay a trace over eviction policies and capacities", add_help=False)
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    sim.set_defaults(func=cmd_sim)

    plan = sub.add_parser("plan", help="size the tiers from a request log: hits, bandwidth, prefill saved, TTFT",
                          add_help=False)
    plan.add_argument("rest", nargs=argparse.REMAINDER)
    plan.set_defaults(func=cmd_plan)

    from kvoffload.cache_cli import add_parser as add_cache_parser

    add_cache_parser(sub)

    config = sub.add_parser("config", help="offload config tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a YAML file and print the resolved tiers",
                                  formatter_class=DefaultsFormatter)
    check.add_argument("file")
    check.add_argument("--block-bytes", type=int, default=None,
                       help="bytes per offloaded block (default: the bundled tiny model, or --model's)")
    check.add_argument("--model", default=None,
                       help="a checkpoint directory (or its config.json): size blocks for its KV shape and dtype")
    check.add_argument("--block-size", type=int, default=16,
                       help="the engine's block size in tokens (vLLM: 16 on GPU, 128 on its CPU backend)")
    check.set_defaults(func=cmd_config_check)
    return parser


#: Subcommands that parse their own options: argparse's REMAINDER cannot take options that come
#: right after a subcommand (``kvoffload plan --log F`` would be "unrecognized arguments").
OWN_PARSERS = ("sim", "plan")


def _split_own_parser(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(the global options and the subcommand, its own arguments) where the subcommand is one of
    OWN_PARSERS, after any global options (``--log-level info plan ...``); else (argv, None)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--log-level" else 1
    if i < len(argv) and argv[i] in OWN_PARSERS:
        return argv[: i + 1], argv[i + 1 :]
    return argv, None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "" not in sys.path and os.getcwd() not in sys.path:
        # `module:Class` plugins (policies, specs, tier kinds) next to the user resolve as they
        # would under `python -m kvoffload`; appended, so nothing installed is shadowed.
        sys.path.append(os.getcwd())
    head, own = _split_own_parser(argv)
    args = build_parser().parse_args(head)
    if own is not None:
        args.rest = own
    try:
        configure_cli(args.log_level)
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:  # config, disk tier in use / full / unwritable
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
