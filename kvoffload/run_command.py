"""`kvoffload run`: the bundled engine on a multi-turn chat workload, without offload and with
the config's tiers, side by side. Its defaults are named once here: `kvoffload bench demo`
measures exactly this run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from typing import Any

from kvoffload.workload import ChatWorkload

#: The engine `kvoffload run` starts by default (device cache and batch limits).
ENGINE = {"num_gpu_blocks": 64, "block_size": 16, "max_model_len": 4096, "max_num_batched_tokens": 512,
          "max_num_seqs": 3}
#: Its default workload: chats with their own system prompts, returning for more turns.
WORKLOAD = ChatWorkload(conversations=12, turns=3, system_tokens=256, user_tokens=48, max_tokens=16, seed=0)
#: Its default model and offload config (one CPU tier, load_mode auto), and torch threads.
MODEL = "small"
OFFLOAD = "cpu"
THREADS = 1


def add_parser(sub: Any) -> None:
    """The `run` subcommand, its options and their defaults."""
    from kvoffload.examples import known_examples
    from kvoffload.help_format import DefaultsFormatter

    run = sub.add_parser("run", help="run the bundled engine on a multi-turn chat workload and report",
                         description="Run the bundled engine on a multi-turn chat workload without offload and "
                                     "with --config's tiers, and print both side by side.",
                         formatter_class=DefaultsFormatter)
    run.add_argument("--model", default=MODEL,
                     help="small | tiny | tiny-hybrid | a Llama-family or Gemma 3 checkpoint directory (small: its "
                          "prefill costs far more than loading its KV back, as a real model's does on a GPU server; "
                          "tiny is a test model whose prefill is nearly free, so offload's fixed costs show)")
    engine_examples = [name for name in known_examples() if not name.startswith("vllm_")]  # those are vLLM's
    run.add_argument("--config", default=OFFLOAD,
                     help=f"offload YAML, or a packaged example by name ({', '.join(engine_examples)}; default: cpu);"
                          " compared side by side with a run without offload")
    run.add_argument("--no-offload", action="store_true", help="ignore --config and run without offload")
    run.add_argument("--num-gpu-blocks", type=int, default=ENGINE["num_gpu_blocks"],
                     help="device KV cache size in blocks of all layers (a hybrid model gets the same memory "
                          "as smaller per-group blocks)")
    run.add_argument("--block-size", type=int, default=ENGINE["block_size"], help="tokens per engine KV block")
    run.add_argument("--max-model-len", type=int, default=ENGINE["max_model_len"], help="longest prompt + output, in tokens")
    run.add_argument("--max-num-batched-tokens", type=int, default=ENGINE["max_num_batched_tokens"],
                     help="tokens one engine step may compute")
    run.add_argument("--max-num-seqs", type=int, default=ENGINE["max_num_seqs"], help="requests running at once")
    run.add_argument("--conversations", type=int, default=WORKLOAD.conversations, help="chats in the workload")
    run.add_argument("--turns", type=int, default=WORKLOAD.turns, help="turns per chat")
    run.add_argument("--system-tokens", type=int, default=WORKLOAD.system_tokens, help="each chat's own system prompt, in tokens")
    run.add_argument("--user-tokens", type=int, default=WORKLOAD.user_tokens, help="tokens a user turn adds")
    run.add_argument("--max-tokens", type=int, default=WORKLOAD.max_tokens, help="tokens generated per turn")
    run.add_argument("--seed", type=int, default=WORKLOAD.seed, help="workload and weights seed")
    run.add_argument("--threads", type=int, default=THREADS,
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
    offload: Any = args.config
    if args.config and not args.no_offload:
        from kvoffload.config import OffloadConfig

        if args.prometheus_port is not None and not 0 < args.prometheus_port < 65536:
            print(f"error: --prometheus-port {args.prometheus_port} is not a TCP port (1-65535)", file=sys.stderr)
            return 2
        cfg = OffloadConfig.coerce(args.config)
        if args.prometheus_port is not None:
            offload = cfg = dataclasses.replace(cfg, metrics=dataclasses.replace(cfg.metrics,
                                                                                  prometheus_port=args.prometheus_port))
        if cfg.metrics.prometheus_port:  # a port in use, said now: not after the baseline run
            _check_port_free(cfg.metrics.prometheus_port)
    base_summary, base_tokens, _ = _run_once(args, None)
    columns["no offload"] = base_summary
    if args.config and not args.no_offload:
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


def _check_port_free(port: int) -> None:
    """The metrics port can be listened on (the offload run binds it after the baseline's ~20 s)."""
    import socket

    from kvoffload.errors import ConfigError

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            raise ConfigError(f"metrics.prometheus_port: cannot listen on 0.0.0.0:{port} ({exc.strerror}); "
                              "pick a free port") from None


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
