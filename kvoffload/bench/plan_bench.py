"""``kvoffload bench plan``: `kvoffload plan`'s predictions against live runs of the bundled
engine, or of real ``vllm serve`` (``--engine vllm``). Each workload runs without offload (its
request log is written, as a server keeps one; the bundled engine's steps are timed and its
speed fitted on them, vLLM's steps are timed offline with the server's settings), then with
each tier configuration; `plan` replays the log through the same chains, each priced as an
operator calibrates from a running server (``--speeds served``): the engine fitted on that run's
own steps (vLLM's: timed offline, with its load overheads and front end read from the server's
/metrics) and the tiers' loads as that run's cost model timed them; the report shows predicted and measured tokens per tier and
returning-turn TTFT p50, with their ratios (predicted / measured), then the median ratios.
"Prompt tokens cached" is what each request found cached (device and tiers) when first
admitted; a tier's tokens are the engine's counter, which also counts a preempted request's
blocks loaded again (the run's preemptions are shown)."""

from __future__ import annotations

import math
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload.bench.serve_workloads import Workload
from kvoffload.bench.served_log import write_served_log

#: The workloads' token ids (below both engines' vocabularies).
VOCAB = 250


def _workloads(args: Any, block_tokens: int) -> dict[str, Workload]:
    from kvoffload.bench import serve_workloads

    out: dict[str, Workload] = {}
    if not (args.log and (args.tiers or args.device_blocks)):  # checking a plan's answer: that log alone
        out["chat"] = serve_workloads.chat(conversations=args.conversations, turns=4, context=args.context, user=64,
                                           max_tokens=16, think_s=0.2, vocab=VOCAB)
    if args.log:  # the user's own: the bundled engine runs the tiny model (ids below its 258)
        from kvoffload.plan.request_log import RequestLogError

        vocab = 258 if args.engine == "bundled" else 32000
        try:
            from kvoffload.plan.log_reader import sample_path

            out["log"] = serve_workloads.request_log(sample_path(args.log), clients=4, max_tokens=16, vocab=vocab,
                                                     limit=args.log_limit)
        except RequestLogError as exc:
            if "--vocab" not in str(exc):
                raise
            raise RequestLogError(f"--log {args.log}: {str(exc).split(' (pass')[0]}: past the {vocab} token ids of the "
                                  f"{args.engine} engine's model here; use --engine vllm (its model reads 32,000), "
                                  "or a log of text prompts") from None
    if args.weka:  # a trace block of 64 tokens as 1 token (bundled) or 8 (vLLM, prompts up to 2,048 tokens)
        per_block = max(1, block_tokens // 16)
        out["weka"] = serve_workloads.weka(args.weka, conversations=6, turns=6, block_tokens=per_block,
                                           max_blocks=1200 if per_block == 1 else 2048 // per_block, time_scale=0.01,
                                           max_tokens=8, vocab=VOCAB)
    return out


def _cached(turns: list[tuple[str, int, Any]]) -> float:
    """Prompt tokens found cached (device and tiers) when each request was first admitted."""
    return float(sum(c.cached_tokens or 0 for _, _, c in turns))


def _p50_returning(turns: list[tuple[str, int, Any]]) -> float:
    vals = [c.ttft for _, t, c in turns if t > 0 and c.ttft is not None]
    return statistics.median(vals) if vals else 0.0


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("plan", __doc__)
    p.add_argument("--engine", choices=["bundled", "vllm"], default="bundled",
                   help="bundled: kvoffload's engine in process; vllm: real vllm serve over HTTP (run this with the "
                        "python that has vLLM), its steps timed offline with the same settings for the engine's speed")
    p.add_argument("--model", default=None,
                   help="--engine vllm: a checkpoint directory (default: a Llama shape, 8 layers of 512, dummy weights); "
                        "the bundled engine runs tiny (plan's --model tiny)")
    p.add_argument("--profile", default=None,
                   help="tier speeds YAML (default: measure this machine's tiers now); the engine's speed is always "
                        "fitted on the engine's own steps")
    p.add_argument("--conversations", type=int, default=8, help="chat workload: conversations")
    p.add_argument("--context", type=int, default=768, help="chat workload: each conversation's opening tokens")
    p.add_argument("--weka", default=None, help="WEKA traces .tar.gz: also validate on a slice of it")
    p.add_argument("--log", default=None, metavar="FILE",
                   help="your own request log (OpenAI-style JSONL, as plan reads it): also validate on it, served live")
    p.add_argument("--log-limit", type=int, default=200, help="--log: its first N requests")
    p.add_argument("--device-fraction", type=float, default=0.25, help="device cache as a share of the working set")
    p.add_argument("--device-blocks", type=int, default=None,
                   help="device cache in the engine's blocks, as plan's --device-blocks (instead of --device-fraction)")
    p.add_argument("--tiers", default=None, metavar="CHAIN",
                   help="the chains to run and predict, in plan's syntax (cpu:4MiB, cpu:{1,4}MiB+disk:64MiB); default: "
                        "a CPU tier of twice the working set, and a quarter of it in front of a disk. With --log, "
                        "this or --device-blocks checks a plan answer: that log alone runs")
    p.add_argument("--max-batched-tokens", type=int, default=512, help="the engine's step budget")
    p.add_argument("--speeds", choices=["served", "alone"], default="served",
                   help="tier load speeds: as each chain's live run timed them while serving (calibrated from the "
                        "server, as bench profile --from reads them), or as profiled alone")
    add_reps(p, 1)
    args = p.parse_args(argv)
    if args.model and args.engine != "vllm" and args.model != "tiny":
        p.error(f"--model {args.model}: the bundled engine runs tiny; leave --model out, or add --engine vllm")
    if args.engine != "vllm":
        args.model = None
    if args.device_blocks is not None and args.device_blocks < 1:
        p.error(f"--device-blocks {args.device_blocks}: give at least 1 (the engine's blocks)")
    if args.tiers is not None:
        from kvoffload.plan.tier_spec import expand, parse_chain

        args.chains = [parse_chain(spec) for spec in expand(args.tiers)]  # a bad chain: its one line, now
    import torch

    from kvoffload.plan.profile import load_profile

    torch.set_num_threads(1)
    print(preamble(args.reps))
    from kvoffload.bench.plan_runs import BundledRuns, ServedRuns

    block = (ServedRuns if args.engine == "vllm" else BundledRuns).block_tokens
    workloads = _workloads(args, block)
    for name, wl in workloads.items():  # before anything is measured: the engine would refuse it
        longest = wl.max_context // block + 2
        if args.device_blocks is not None and args.device_blocks < longest:
            p.error(f"--device-blocks {args.device_blocks}: the {name} workload's longest request needs {longest} "
                    f"blocks of {block} tokens to run; give at least that")
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile is None:
            from kvoffload.bench.profile_bench import measure_tier

            # The tiers' copy speeds, measured on the bundled engine (bytes a second, whatever the model).
            speeds = {m: measure_tier(m, "tiny", 16, args.max_batched_tokens, 3, tmp) for m in ("cpu", "disk")}
        else:
            speeds = load_profile(args.profile).tiers
        ratios: dict[tuple[str, str, str], list[float]] = {}
        for name, wl in workloads.items():
            _validate(args, name, wl, block, speeds, Path(tmp) / name, ratios)
        print("\nsummary, predicted / measured (median ± half-range of the reps; every rep):")
        for (workload, config, figure), values in ratios.items():
            each = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {workload:<5} {config:<9} {figure:<22} {Sample(tuple(values)).fmt()}x  ({each})")
    return 0


def _validate(args: Any, name: str, wl: Workload, bt: int, speeds: dict[str, Any], work: Path,
              ratios: dict[tuple[str, str, str], list[float]]) -> None:
    """Every rep of one workload: the live runs beside `plan`'s prediction of each."""
    from kvoffload.bench.plan_runs import BundledRuns, LiveRuns, ServedRuns
    from kvoffload.plan.log_reader import read_log
    from kvoffload.plan.model_shape import kv_shape
    from kvoffload.plan.planner import make_plan
    from kvoffload.plan.profile import Profile
    from kvoffload.plan.tier_spec import chain_label, parse_chain

    def note(config: str, figure: str, predicted: float, measured: float) -> str:
        ratio = predicted / measured if measured else 1.0 if predicted == 0 else math.inf
        ratios.setdefault((name, config, figure), []).append(ratio)
        return f"{figure} {predicted:,.1f} vs {measured:,.1f} ({ratio:.2f})"

    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if args.engine == "vllm" and model is None:
        from kvoffload.bench.dummy_model import write_model

        model = str(work / "model")
        write_model(Path(model), layers=8, hidden=512, heads=8, kv_heads=4, vocab=32000)
    shape = kv_shape(model or "tiny")
    block_bytes = shape.bytes_per_token * bt
    # The log holds the engine's answers too: any id of the model's vocabulary (the tiny one's 258).
    vocab = shape.vocab_size or VOCAB + 8
    ws_blocks = math.ceil(wl.working_set_tokens / bt)
    device = args.device_blocks or max(math.ceil(args.device_fraction * ws_blocks), wl.max_context // bt + 2)
    if args.tiers is not None:
        chains = {chain_label(c): c for c in args.chains}
    else:
        big, small = ws_blocks * 2 * block_bytes, max(ws_blocks // 4, 64 * 16 // bt) * block_bytes
        chains = {"cpu": parse_chain(f"cpu:{big}B"), "cpu+disk": parse_chain(f"cpu:{small}B+disk:{big}B")}
    print(f"\n{name} on the {args.engine} engine: {len(wl.sessions)} sessions, working set {ws_blocks} blocks of {bt} "
          f"tokens, device {device} blocks; " + " and ".join(f"{chain_label(c)} ({k})" for k, c in chains.items())
          + "; predicted vs measured (their ratio, predicted / measured, as in the summary)")
    runs: LiveRuns = (ServedRuns(wl, device, args.max_batched_tokens, work, model, args.model is None, chains, VOCAB)
                      if args.engine == "vllm" else BundledRuns(wl, device, args.max_batched_tokens, work))
    try:
        for rep in range(args.reps):
            base_turns, engine = runs.base()
            log = work / f"{name}-{rep}.jsonl"
            write_served_log(wl, base_turns, log)
            rlog = read_log(log, bt, vocab=vocab, output_tokens=wl.max_tokens)
            got = {config: runs.with_tiers(config, chain) for config, chain in chains.items()}
            for i, (config, chain) in enumerate(chains.items()):
                # The operator's way: the engine fitted on the server's steps, and (--speeds
                # served) each tier's loads as that chain's server timed them while serving.
                tiers, served_engine = dict(speeds), engine
                if args.speeds == "served":
                    served_engine = got[config].engine_seen or engine
                    tiers.update({m: replace(tiers.get(m, s), load_gb_per_s=s.load_gb_per_s,
                                             load_latency_s=s.load_latency_s)
                                  for m, s in (got[config].loads_seen or {}).items()})
                res = make_plan(rlog, [chain], block_bytes, device, Profile(served_engine, tiers, "fitted now"),
                                wl.max_tokens).results[0]
                if i == 0:  # the run without offload, priced with its own engine
                    base = make_plan(rlog, [chain], block_bytes, device, Profile(engine, dict(speeds), "fitted now"),
                                     wl.max_tokens).results[0]
                    print(f"  rep {rep + 1} no offload: " + "; ".join([
                        note("none", "returning TTFT p50 ms", base.base_ttft_p50_s * 1e3,
                             _p50_returning(base_turns) * 1e3),
                        note("none", "prompt tokens cached", base.device_tokens, _cached(base_turns))]))
                run = got[config]
                parts = [note(config, "returning TTFT p50 ms", res.ttft_p50_s * 1e3, _p50_returning(run.turns) * 1e3),
                         note(config, "prompt tokens cached", res.device_tokens + res.prefill_tokens_saved,
                              _cached(run.turns))]
                parts += [note(config, f"{t.medium} tokens", t.tokens_served, run.tier_tokens.get(t.medium, 0))
                          for t in res.tiers]
                print(f"  rep {rep + 1} {config}: " + "; ".join(parts) + run.remark)
    finally:
        runs.close()
