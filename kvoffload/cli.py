"""`kvoffload` command line: run, bench, sim, plan, cache, config check."""

from __future__ import annotations

import argparse
import os
import sys

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
    from kvoffload.run_command import add_parser as add_run_parser

    add_run_parser(sub)

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
