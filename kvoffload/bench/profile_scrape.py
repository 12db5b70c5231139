"""``kvoffload bench profile --from URL``: a profile from what a running server measured while
serving, read from its Prometheus ``/metrics`` (the bundled engine's, or ``vllm serve``'s with
kvoffload's connector): the speeds under the server's real load, not a machine timed alone.

- The engine: the connector's cost model publishes the forward throughput it measured by step
  size (``kvoffload_prefill_tokens_per_second{tokens}``): a step of N tokens took N / rate
  seconds, and a step's fixed cost and a token's cost are fitted on those steps.
- Each tier's loads: the cost model's fit of the loads it timed
  (``kvoffload_tier_load_bytes_per_second`` and ``..._latency_seconds``).
- A load's way through the engine besides its copy: ``kvoffload_step_overhead_seconds`` (an
  empty step while a load is on its way, and what sending one off adds to its step).
- Stores into host memory: the copies' own histogram (``kvoffload_transfer_*`` of
  ``device_to_host``); a lower tier's stores are not published, so its load speed stands in.

The profile says where each figure came from (``sources``), and the model is named by the
caller (a server's metrics do not say its shape).
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import replace
from typing import Any

from kvoffload.bench.step_fit import TERMS, fit_steps
from kvoffload.plan.profile import EngineSpeed, Profile, ProfileError, TierSpeed

#: A /metrics page larger than this is not a server's (a scrape reads no more).
MAX_PAGE_BYTES = 32 << 20


def scrape(url: str, timeout_s: float = 10.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of every kvoffload_* and vllm:* metric on the page: name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    page = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    if not page.startswith(("http://", "https://")):
        raise ProfileError(f"--from {url!r}: give the server's address, e.g. http://127.0.0.1:8000")
    try:
        with urllib.request.urlopen(page, timeout=timeout_s) as resp:
            body = resp.read(MAX_PAGE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ProfileError(f"--from {url}: cannot read {page} ({getattr(exc, 'reason', exc)}); is the server up, "
                           "with its metrics on that port?") from None
    if len(body) > MAX_PAGE_BYTES:
        raise ProfileError(f"--from {url}: {page} is larger than {MAX_PAGE_BYTES >> 20} MiB: not a metrics page")
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for s in family.samples:
                if s.name.startswith(("kvoffload_", "vllm:")) and math.isfinite(s.value) and s.value >= 0:
                    out[s.name].append((dict(s.labels), float(s.value)))
    except ValueError as exc:
        raise ProfileError(f"--from {url}: {page} is not Prometheus text ({str(exc)[:200]})") from None
    return out


def _by_label(samples: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    """Values by one label; several engines (vLLM's ``engine`` label) are averaged."""
    seen: dict[str, list[float]] = defaultdict(list)
    for labels, value in samples:
        if label in labels:
            seen[labels[label]].append(value)
    return {k: sum(v) / len(v) for k, v in seen.items()}


def _engine(metrics: dict[str, Any], model: str, max_batched_tokens: int | None) -> EngineSpeed:
    rates = {int(k): v for k, v in _by_label(metrics.get("kvoffload_prefill_tokens_per_second", []), "tokens").items()
             if k.isdigit() and int(k) > 0 and v > 0}
    if not rates:
        raise ProfileError("the server published no kvoffload_prefill_tokens_per_second: it has not computed a "
                           "timed step with offload yet; serve some traffic first (or this is not a kvoffload server)")
    zero = dict.fromkeys(TERMS, 0.0)
    rows = [({**zero, "step_s": 1.0, "token_s": float(n)}, n / rate) for n, rate in sorted(rates.items())]
    mbt = max_batched_tokens or max(rates)
    idle, per_load = step_overheads(metrics)
    return replace(fit_steps(rows, mbt, model), idle_step_s=idle, load_step_s=per_load,
                   request_s=request_overhead(metrics))


def request_overhead(metrics: dict[str, Any]) -> float:
    """vLLM's front end: its mean time to first token (from the API server's arrival) less the
    engine core's own queue and prefill time of the same requests (0 where not published)."""
    def mean(name: str) -> float | None:
        total = sum(v for _, v in metrics.get(f"{name}_sum", []))
        count = sum(v for _, v in metrics.get(f"{name}_count", []))
        return total / count if count else None

    ttft = mean("vllm:time_to_first_token_seconds")
    queue, prefill = mean("vllm:request_queue_time_seconds"), mean("vllm:request_prefill_time_seconds")
    return max(ttft - queue - prefill, 0.0) if ttft is not None and queue is not None and prefill is not None else 0.0


def step_overheads(metrics: dict[str, Any]) -> tuple[float, float]:
    """(idle_step_s, load_step_s) as the server's steps came round (0 where not seen yet)."""
    parts = _by_label(metrics.get("kvoffload_step_overhead_seconds", []), "part")
    return parts.get("idle_step", 0.0), parts.get("per_load", 0.0)


def tier_speeds(metrics: dict[str, Any]) -> tuple[dict[str, TierSpeed], dict[str, str]]:
    bps = _by_label(metrics.get("kvoffload_tier_load_bytes_per_second", []), "tier")
    latency = _by_label(metrics.get("kvoffload_tier_load_latency_seconds", []), "tier")
    stored = _by_label(metrics.get("kvoffload_transfer_bytes_total", []), "direction").get("device_to_host", 0.0)
    seconds = _by_label(metrics.get("kvoffload_transfer_seconds_sum", []), "direction").get("device_to_host", 0.0)
    speeds, sources = {}, {}
    for tier, rate in sorted(bps.items()):
        if rate <= 0:
            continue
        measured = tier == "cpu" and stored > 0 and seconds > 0  # only host stores have their own histogram
        store = stored / seconds if measured else rate
        speeds[tier] = TierSpeed(rate / 1e9, store / 1e9, latency.get(tier, 0.0), latency.get(tier, 0.0))
        sources[f"tiers.{tier}"] = ("loads: kvoffload_tier_load_bytes_per_second and _latency_seconds; stores: "
                                    + ("kvoffload_transfer_bytes_total / kvoffload_transfer_seconds_sum of device_to_host"
                                       if measured else "not published, the load speed stands in"))
    if not speeds:
        raise ProfileError("the server published no tier load speeds (kvoffload_tier_load_bytes_per_second): no "
                           "tier has served a load yet; serve returning requests first")
    return speeds, sources


def profile_from_server(url: str, model: str, shape: str, params: int, max_batched_tokens: int | None = None) -> Profile:
    metrics = scrape(url)
    engine = _engine(metrics, model, max_batched_tokens)
    speeds, sources = tier_speeds(metrics)
    sources["engine"] = ("kvoffload_prefill_tokens_per_second by step size (the server's steps under its load); "
                         "idle_step_s and load_step_s: kvoffload_step_overhead_seconds; "
                         "request_s: vllm:time_to_first_token_seconds less vllm:request_queue_time_seconds and "
                         "vllm:request_prefill_time_seconds (vLLM only); "
                         "decode terms not published: 0")
    when = time.strftime("%Y-%m-%d %H:%M")
    return Profile(replace(engine, shape=shape, params=params), speeds, f"{url}, in service, {when}", sources)
