"""``kvoffload plan --log FILE --model M --tiers SPEC``: what each tier size buys on that traffic."""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
from pathlib import Path

from kvoffload.errors import describe_value
from kvoffload.help_format import DefaultsFormatter
from kvoffload.output_paths import check_output
from kvoffload.plan.log_reader import RequestLog
from kvoffload.plan.planner import QUEUEING_NOTE, Plan
from kvoffload.plan.request_log import MAX_TOKENS, BadLines
from kvoffload.plan.tier_spec import TierSpecError, format_size

DEFAULT_DEVICE_BLOCKS = 64
#: 2^40 blocks: more than any device holds at any block size.
MAX_DEVICE_BLOCKS = 1 << 40


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvoffload plan", formatter_class=DefaultsFormatter,
        description="Replay a request log through the device prefix cache and each tier chain, priced by measured "
                    "speeds: tokens and bytes per tier, prefill saved, time to first token with and without offload, "
                    "and the configuration to buy.")
    p.add_argument("--log", required=True,
                   help="request log: OpenAI-style JSONL, a Mooncake trace (.jsonl[.gz]) or WEKA's traces (.tar.gz)")
    p.add_argument("--model", required=True, help="tiny | small | tiny-hybrid | a checkpoint directory (its config.json)")
    p.add_argument("--tiers", required=True,
                   help="a chain such as cpu:32GiB+disk:1TiB; {a,b,c} sweeps a size (cpu:{16,32,64}GiB); options "
                        "after the size: a policy (lru, arc), wt (write-through)")
    p.add_argument("--profile", default=None,
                   help="speeds YAML from `kvoffload bench profile` (default: the shipped one, this project's CI machine)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per engine block (token logs; traces bring theirs)")
    p.add_argument("--device-blocks", type=int, default=None,
                   help=f"device prefix cache in engine blocks (default {DEFAULT_DEVICE_BLOCKS}; or --device-kv)")
    p.add_argument("--device-kv", default=None, help="device memory for KV, e.g. 20GiB (instead of --device-blocks)")
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype if not the model's (e.g. fp8)")
    p.add_argument("--output-tokens", type=int, default=128,
                   help="tokens each reply generates where the log does not say (max_tokens)")
    p.add_argument("--slo", default=None, metavar="NAME=DURATION,...",
                   help="objectives to meet: ttft_p50, ttft_p95 (returning requests), prefill_saved, e.g. "
                        "ttft_p95=2s; the answer names the cheapest configuration that meets them, or what binds")
    p.add_argument("--price", default=None, metavar="MEDIUM=AMOUNT/UNIT,...",
                   help="each medium's price, e.g. cpu=4/GiB,disk=0.1/GiB (any currency and period): the table "
                        "gets each configuration's price, and --slo picks the cheapest")
    p.add_argument("--scale-profile", action="store_true",
                   help="price another model than the profile's engine was timed on, its times scaled by FLOPs per "
                        "token (every TTFT figure is then a guess, and the report says so)")
    p.add_argument("--skip-bad-lines", type=int, default=0, metavar="N",
                   help="skip up to N lines that are not a valid request (a live log's last line is often cut "
                        "short); each is counted and the first reported")
    p.add_argument("--limit", type=int, default=None, help="read only the first N requests")
    p.add_argument("--within", type=float, default=0.05,
                   help="recommend the smallest configuration within this share of the best's prefill saved")
    p.add_argument("--knee-share", type=float, default=0.1,
                   help="the knee: where another GiB buys less than this share of what a GiB buys at the sweep's "
                        "most efficient size")
    p.add_argument("--json", default=None, metavar="OUT", help="also write every figure here as JSON")
    p.add_argument("--plot", default=None, metavar="PNG", help="hit ratio and TTFT vs size, the knee marked")
    return p


def _device_blocks(args: argparse.Namespace, block_bytes: int) -> int:
    from kvoffload.plan.tier_spec import parse_size

    if args.device_blocks is not None and args.device_kv is not None:
        raise TierSpecError("--device-blocks and --device-kv both given; give one")
    if args.device_kv is not None:
        return parse_size(args.device_kv, "--device-kv") // block_bytes
    n = DEFAULT_DEVICE_BLOCKS if args.device_blocks is None else args.device_blocks
    if not 0 <= n <= MAX_DEVICE_BLOCKS:
        raise TierSpecError(f"--device-blocks {describe_value(n)}: give 0 (no device prefix cache) to "
                            f"{MAX_DEVICE_BLOCKS:,}")
    return n


def _check_tiers_hold_a_block(chains: list, block_bytes: int, block_tokens: int, model: str) -> None:
    for tiers in chains:
        for t in tiers:
            if t.size_bytes < block_bytes:
                raise TierSpecError(f"--tiers {t.label}: smaller than one block ({format_size(block_bytes)}: "
                                    f"{block_tokens} tokens of {model}); give at least {format_size(block_bytes)}")


#: A gap between two requests longer than this is worth a note (a timestamp in another unit?).
LONG_GAP_S = 86_400.0


def _longest_gap(log: RequestLog) -> str | None:
    """A note on the log's longest pause between requests, where it is over a day."""
    if len(log.requests) < 2:
        return None
    gaps = [(b.t - a.t, i + 1) for i, (a, b) in enumerate(itertools.pairwise(log.requests))]
    gap, at = max(gaps)
    if gap <= LONG_GAP_S:
        return None
    return (f"note: the log pauses {gap / 86_400:,.1f} days between its requests {at:,} and {at + 1:,} (in arrival "
            "order); is a timestamp in another unit or clock (epoch among relative times)? The plan idles through it")


def _table(plan: Plan, scaled: bool = False, prices: dict[str, float] | None = None) -> str:
    from kvoffload.plan.advice import rate
    from kvoffload.report import format_table

    cols = {}
    for r in plan.results:
        col: dict[str, str] = {"tokens from device": f"{r.device_tokens:,}"}
        for t in r.tiers:
            col[f"tokens from {t.medium}"] = f"{t.tokens_served:,} ({t.tokens_served / r.prompt_tokens:.1%})"
            col[f"{t.medium} loads (mean / peak)"] = f"{rate(t.load_bytes_per_s)} / {rate(t.peak_load_bytes_per_s)}"
            col[f"{t.medium} stores (mean)"] = rate(t.store_bytes_per_s)
        col["prefill tokens saved"] = f"{r.prefill_tokens_saved:,}"
        col["prefill seconds saved"] = f"{r.prefill_s_saved:,.2f}"
        guess = ", scaled" if scaled else ""  # from another model's profile: a guess, and said so
        col[f"returning TTFT p50 ms (no offload{guess})"] = f"{r.ttft_p50_s * 1e3:,.1f} ({r.base_ttft_p50_s * 1e3:,.1f})"
        col[f"returning TTFT p95 ms (no offload{guess})"] = f"{r.ttft_p95_s * 1e3:,.1f} ({r.base_ttft_p95_s * 1e3:,.1f})"
        if prices:
            from kvoffload.plan.slo import cost

            col["price (--price units)"] = f"{cost(r, prices):,.4g}"
        cols[r.label] = col
    return format_table(cols)


def check_live_command(args: argparse.Namespace, form: str, block_tokens: int, device: int,
                       requests: int, longest_prompt: int) -> str | None:
    """The `bench plan` command that runs this answer's log live with the same model, device
    cache and tiers (its blocks in the live engine's size), where one can: an OpenAI-style log,
    and the bundled engine's model or a checkpoint vLLM serves."""
    if form != "openai" or (args.model != "tiny" and not Path(args.model).is_dir()):
        return None
    engine_tokens = 16 if args.model == "tiny" else 128  # the bundled engine's blocks; vLLM's CPU backend's
    blocks = device * block_tokens // engine_tokens
    if blocks < (longest := longest_prompt // engine_tokens + 3):  # bench plan's replies are 16 tokens
        return (f"note: a live engine needs at least {longest} device blocks of {engine_tokens} tokens for this "
                f"log's longest request, so this device cache cannot be checked live; with --device-blocks "
                f"{longest * engine_tokens // block_tokens} or more, plan prints the `bench plan` command that does")
    head = "kvoffload bench plan" if args.model == "tiny" else \
        f"python -m kvoffload.cli bench plan --engine vllm --model {shlex.quote(args.model)}"
    return (f"{head} --log {shlex.quote(str(args.log))} --tiers {shlex.quote(args.tiers)} "
            f"--device-blocks {blocks} --log-limit {requests}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tqdm import tqdm

    from kvoffload.plan.advice import advise
    from kvoffload.plan.log_reader import read_log
    from kvoffload.plan.model_shape import kv_shape
    from kvoffload.plan.planner import make_plan, require_speeds
    from kvoffload.plan.profile import load_profile
    from kvoffload.plan.profile_model import fit_profile
    from kvoffload.plan.slo import answer, cost, parse_prices, parse_slo
    from kvoffload.plan.tier_spec import expand, parse_chain

    if args.block_size < 1:
        raise ValueError(f"--block-size {args.block_size}: give a positive number of tokens")
    if not 1 <= args.output_tokens <= MAX_TOKENS:
        raise ValueError(f"--output-tokens {args.output_tokens}: give 1 to {MAX_TOKENS:,}")
    if args.skip_bad_lines < 0:
        raise ValueError(f"--skip-bad-lines {args.skip_bad_lines}: give 0 or more lines")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit}: give at least 1 request")
    if not 0 <= args.within < 1:  # NaN fails too
        raise ValueError(f"--within {args.within}: give a share in [0, 1), e.g. 0.05")
    if not 0 < args.knee_share <= 1:
        raise ValueError(f"--knee-share {args.knee_share}: give a share in (0, 1], e.g. 0.1")
    objectives = parse_slo(args.slo) if args.slo is not None else None
    prices = parse_prices(args.price) if args.price is not None else None
    chains = [parse_chain(s) for s in expand(args.tiers)]
    for out, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if out:
            check_output(out, flag, plot=flag == "--plot")  # before the replay, not after it
    shape = kv_shape(args.model, args.kv_dtype)
    profile = load_profile(args.profile)
    source = f"--profile {args.profile or '(shipped)'}"
    fitted = fit_profile(profile, shape, args.model, source, args.scale_profile)
    profile = fitted.profile
    require_speeds(profile, chains, source)  # before the log is read: a large one takes a while
    # Token ids are only hashed here, whatever the model's vocabulary; text is hashed into ids.
    bad = BadLines(args.skip_bad_lines)
    log = read_log(args.log, args.block_size, vocab=1 << 62, output_tokens=args.output_tokens, limit=args.limit,
                   bad=bad)
    block_bytes = shape.bytes_per_token * log.block_tokens
    _check_tiers_hold_a_block(chains, block_bytes, log.block_tokens, shape.name)
    device = _device_blocks(args, shape.bytes_per_token * args.block_size) * args.block_size // log.block_tokens
    total = len(log.requests) * len(chains)
    with tqdm(total=total, unit="req", desc="replaying", disable=None, leave=False) as bar:
        plan = make_plan(log, chains, block_bytes, device, profile, args.output_tokens, bar.update, source)
    print(f"log {args.log}: {plan.requests:,} requests over {log.duration_s:,.1f} s ({log.form}); blocks of "
          f"{log.block_tokens} tokens, {format_size(block_bytes)} each ({shape.name}: {shape.bytes_per_token:,} B "
          f"of KV per token); device prefix cache {device:,} blocks; profile: {args.profile or 'shipped'}"
          + (f" ({profile.machine})" if profile.machine else ""))
    if fitted.note:
        print(fitted.note)
    if bad.note():
        print(bad.note())
    gap = _longest_gap(log)
    if gap is not None:
        print(gap)
    if log.stand_in:
        print("note: the prompts are text, tokenized by the stand-in (words and punctuation, not the model's "
              "tokenizer): prefixes are kept, token counts are words")
    if plan.queueing > QUEUEING_NOTE:
        print(f"note: without offload a request's TTFT is {plan.queueing:,.0f}x its prefill alone (median): with "
              f"the profile's engine ({profile.engine.model or 'unnamed'}) this log's requests queue, so TTFT "
              "measures the queue more than the tiers; price the plan with the profile of the engine you serve "
              "with (--profile)")
    print(_table(plan, scaled=fitted.scaled, prices=prices))
    advice = advise(plan.results, args.within, args.knee_share, plan.working_set_bytes, plan.device_bytes)
    slo = answer(plan.results, objectives, prices, plan.queueing) if objectives else None
    print()
    if slo is not None:  # the decision asked for comes first; the sweep's own advice after it
        print(slo.paragraph)
        print()
        print(f"Without the objectives: {advice.paragraph[0].lower()}{advice.paragraph[1:]}")
    else:
        print(advice.paragraph)
    if args.json:
        doc = {"log": str(args.log), "model": shape.name, "block_tokens": log.block_tokens, "block_bytes": block_bytes,
               "device_blocks": device, "stand_in_tokenizer": log.stand_in,
               "working_set_bytes": plan.working_set_bytes, "device_bytes": plan.device_bytes,
               "ttft_scaled_from": fitted.note if fitted.scaled else None,
               "results": [r.as_dict() for r in plan.results],
               "recommended": advice.buy_label or None, "recommended_bytes": advice.buy_bytes,
               "knee": advice.knee.label if advice.knee else None, "advice": advice.paragraph,
               "prices_per_byte": prices, "costs": {r.label: cost(r, prices) for r in plan.results} if prices else None,
               "slo": None if slo is None else {"objectives": [o.text for o in objectives or ()],
                                                "chosen": slo.chosen.label if slo.chosen else None,
                                                "answer": slo.paragraph}}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    if args.plot:
        from kvoffload.plan.plot import plot_plan

        plot_plan(plan.results, advice, args.plot, slo.chosen if slo is not None else None)
        print(f"plot: {args.plot}")
    live = check_live_command(args, log.form, log.block_tokens, device, plan.requests,
                              max(r.prompt_tokens for r in log.requests))
    if live:
        print("\n" + (live if live.startswith("note:") else
                      f"To check this against a live run of the same model, device cache and tiers:\n  {live}"))
    return 0
