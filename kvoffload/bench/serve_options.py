"""kvoffload bench serve's options: what each sets, and every check made before a run that can
take minutes starts (one-line errors naming the flag and the fix)."""

from __future__ import annotations

import argparse
import os

from kvoffload.bench.measure import add_reps, bench_parser, positive_int
from kvoffload.bench.serve_configs import config_names
from kvoffload.bench.serve_routing import ROUTER_SETTINGS, router_settings
from kvoffload.errors import ConfigError
from kvoffload.output_paths import check_output
from kvoffload.traces import SAMPLE_TRACE

VLLM_BLOCK = 128  # vLLM's CPU backend block size (tokens)
BUNDLED_BLOCK = 16  # the bundled engine's default block size
BUNDLED_BATCH_TOKENS = 2048


def parse_options(argv: list[str] | None, doc: str | None) -> tuple[argparse.ArgumentParser, argparse.Namespace, str | None]:
    """(the parser, its checked arguments, the one configuration ``--replicas`` routes to or None)."""
    p = bench_parser("serve", doc)
    p.add_argument("--workload", choices=["chat", "mix", "rag", "noreuse", "trace", "log"], default="chat",
                   help="mix: returning chat turns batched with fresh long prompts, in rounds (--conversations "
                        "chats, --turns returning rounds, --fresh prompts of --fresh-tokens a round; --context, "
                        "--user-tokens as chat's), the group --first arriving 50 ms before the other")
    p.add_argument("--log", default=None, metavar="FILE",
                   help="log: your own requests, OpenAI-style JSONL (prompt_token_ids, prompt or messages; optional "
                        "timestamp, session or user), replayed at their times x --time-scale")
    p.add_argument("--requests-limit", type=positive_int, default=None, help="log: replay only its first N requests")
    p.add_argument("--fresh", type=int, default=3, help="mix: fresh prompts a round")
    p.add_argument("--fresh-tokens", type=int, default=1024, help="mix: a fresh prompt's length")
    p.add_argument("--first", choices=["turns", "fresh"], default="turns", help="mix: which group arrives first")
    p.add_argument("--configs", default="plain,cpu,cpu+disk",
                   help="comma-separated: plain, cpu, cpu+disk; a kvoffload one may end in :LOAD_MODE "
                        "(cpu+disk:never-recompute), then in @POLICY, the host tier's eviction policy: "
                        "requests to cpu@hinted carry their hints (WEKA's traces)")
    p.add_argument("--also-vs", action="append", default=[], metavar="CONFIG",
                   help="ratios against this configuration too (e.g. cpu:async, beside plain)")
    p.add_argument("--throttle-tier", default=None, metavar="MEDIUM:BW:LATENCY",
                   help="slow a secondary tier's I/O down, e.g. disk:20MB/s:50ms (a test wrapper: "
                        "kvoffload.testing.throttle)")
    p.add_argument("--write-log", default=None, metavar="FILE",
                   help="write the first configuration's first run as a request log (OpenAI JSONL with "
                        "duration_s), for `kvoffload plan --log FILE`")
    p.add_argument("--engine", choices=["vllm", "bundled"], default="vllm",
                   help="vllm: vllm serve over HTTP; bundled: kvoffload's own engine, in process")
    p.add_argument("--threads", type=positive_int, default=1, help="--engine bundled: torch CPU threads")
    p.add_argument("--device", default="cpu",
                   help="--engine bundled: where its model and KV cache live (cpu, cuda, cuda:N)")
    p.add_argument("--url", default=None, help="benchmark this running server instead (one configuration, no ratios)")
    p.add_argument("--model", default=None, help="a checkpoint directory; default: a Llama-shaped config with dummy weights")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--intermediate", type=positive_int, default=None, help="MLP width (default hidden x 8/3)")
    p.add_argument("--reserved-cpus", type=int, default=1,
                   help="VLLM_CPU_NUM_OF_RESERVED_CPU for every server (vLLM's CPU backend): without it vLLM "
                        "reserves one core more for a server with a KV connector, which on a small machine "
                        "changes the cores the model computes on")
    p.add_argument("--memory-utilization", type=float, default=0.3,
                   help="vLLM's --gpu-memory-utilization (on CPU: the share of RAM it may use for weights and KV)")
    p.add_argument("--max-batched-tokens", type=positive_int, default=None,
                   help="tokens a step may compute (vLLM's --max-num-batched-tokens; default: vLLM's own, "
                        f"{BUNDLED_BATCH_TOKENS} on the bundled engine)")
    p.add_argument("--dtype", default="float32", help="float32 keeps greedy tokens stable across batch mixes")
    p.add_argument("--device-fraction", type=float, default=0.25,
                   help="the device KV cache holds this fraction of the workload's working set")
    p.add_argument("--cpu", default="2GiB", help="CPU tier capacity")
    p.add_argument("--disk", default="4GiB", help="disk tier capacity (cpu+disk)")
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--context", type=int, default=1024, help="chat: opening context; rag: document; noreuse: prompt")
    p.add_argument("--user-tokens", type=int, default=128, help="chat: tokens a turn adds; rag: question length")
    p.add_argument("--think", type=float, default=0.5, help="chat: seconds between a conversation's turns")
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--requests", type=int, default=32, help="rag, noreuse, trace: requests per run")
    p.add_argument("--clients", type=int, default=4, help="rag, noreuse, trace: concurrent clients")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--trace", default=SAMPLE_TRACE,
                   help=f"trace: a Mooncake conversation trace (JSONL; default {SAMPLE_TRACE}, 1,500 requests shipped "
                        "with the package), or WEKA's Claude Code sessions (their .tar.gz) replayed with their callers' "
                        "hints (--conversations, --turns each)")
    p.add_argument("--time-scale", type=float, default=0.05,
                   help="WEKA's traces and --log: replay time per logged second (0.05: 20x faster than it "
                        "happened; 1: as it happened)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--plot", default=None, help="write the TTFT plots here (PNG)")
    p.add_argument("--replicas", type=positive_int, default=1,
                   help="several vllm serve replicas of one kvoffload config (--configs names it; default cpu) "
                        "behind a gateway: --router against round robin")
    p.add_argument("--router", choices=["dynamo"], default="dynamo",
                   help="--replicas: the KV-aware router (Dynamo's standalone selection service)")
    p.add_argument("--dynamo-python", default=None,
                   help="--router dynamo: a python with ai-dynamo-runtime==1.6.1 (default: $KVOFFLOAD_DYNAMO_PYTHON)")
    p.add_argument("--router-setting", action="append", default=None, metavar="NAME=VALUE",
                   help="--router dynamo: a selection-service setting, as its environment variable (repeat it; "
                        "given any, they replace the defaults; '--router-setting default': Dynamo's own). Default: "
                        + " ".join(f"{k}={v}" for k, v in ROUTER_SETTINGS.items()))
    p.add_argument("--affinity", action=argparse.BooleanOptionalAction, default=True,
                   help="--router dynamo: the gateway keeps a conversation on the replica of its last turn while "
                        "the selection service sees its KV there (the client names each conversation in OpenAI's "
                        "'user' field)")
    add_reps(p, default=3)
    args = p.parse_args(argv)
    routed_config = None
    args.router_settings = router_settings(p, args.router_setting)
    if args.replicas > 1:
        names = ["cpu"] if args.configs == p.get_default("configs") else config_names(args.configs)
        if len(names) != 1 or names[0] == "plain":
            p.error(f"--replicas {args.replicas} --configs {args.configs}: name one kvoffload configuration, e.g. cpu")
        if args.engine != "vllm" or args.url:
            p.error("--replicas runs vllm serve replicas: drop --engine bundled and --url")
        routed_config = names[0]
    if args.write_log and args.engine == "bundled" and args.workload == "mix":
        p.error("--write-log with --workload mix on --engine bundled: each round restarts its clock there; "
                "write the log of an --engine vllm run, or of another workload")
    for out, flag in ((args.plot, "--plot"), (args.write_log, "--write-log"), (args.json, "--json")):
        try:
            if out:  # written at the end of a run that can take minutes: checked first
                check_output(out, flag, plot=flag == "--plot")
        except (OSError, ValueError) as exc:
            p.error(str(exc))
    if args.reserved_cpus < 0:
        p.error(f"--reserved-cpus {args.reserved_cpus}: must be >= 0")
    if not 0 < args.device_fraction <= 1:
        p.error(f"--device-fraction {args.device_fraction}: must be in (0, 1]")
    if not 0 < args.time_scale <= 1000:
        p.error(f"--time-scale {args.time_scale}: must be in (0, 1000]; 0.05 replays 20x faster than the trace")
    for ref in args.also_vs:
        if ref not in config_names(args.configs):
            p.error(f"--also-vs {ref}: not one of --configs ({args.configs})")
    if args.throttle_tier:
        from kvoffload.testing.throttle import parse_throttles

        try:
            parse_throttles(args.throttle_tier)
        except ConfigError as exc:
            p.error(f"--throttle-tier: {exc}")
        os.environ["KVOFFLOAD_THROTTLE"] = args.throttle_tier  # the servers (child processes) read it too
    if args.device != "cpu":
        if args.engine != "bundled":
            p.error(f"--device {args.device}: only the bundled engine takes a device (vLLM picks its own); "
                    "add --engine bundled")
        import torch

        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            p.error(f"--device {args.device}: no such device here (torch sees CUDA: {torch.cuda.is_available()}); "
                    "use cpu, or cuda on a machine with an NVIDIA GPU")
    return p, args, routed_config
