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

import http.client
import re
import time
import urllib.parse
from collections import defaultdict
from dataclasses import replace
from typing import Any

import yaml

from kvoffload.bench.step_fit import TERMS, fit_steps
from kvoffload.integrations.gateway_deadline import WATCHDOG
from kvoffload.plan.profile import MIN_IDLE_STEP_S, EngineSpeed, Profile, ProfileError, TierSpeed, parse_profile

#: A /metrics page larger than this is not a server's (a scrape reads no more).
MAX_PAGE_BYTES = 32 << 20
#: A sample line of a family read here longer than this is not a server's either: a label of
#: megabytes of escaped quotes kept prometheus_client's parser busy for minutes.
MAX_LINE_CHARS = 4096
#: The largest sample value taken (a byte counter of years at 10 GB/s): larger ones, summed
#: or averaged, overflowed into inf and NaN figures.
MAX_VALUE = 1e18
#: The largest step size read from a ``tokens`` label.
MAX_STEP_TOKENS = 1 << 24
#: The families read here; every other line of the page is skipped unparsed.
FAMILIES = frozenset({
    "kvoffload_prefill_tokens_per_second", "kvoffload_step_overhead_seconds",
    "kvoffload_tier_load_bytes_per_second", "kvoffload_tier_load_latency_seconds",
    "kvoffload_transfer_bytes_total", "kvoffload_transfer_seconds_sum",
    *(f"vllm:{name}_seconds_{part}" for name in ("time_to_first_token", "request_queue_time", "request_prefill_time")
      for part in ("sum", "count")),
})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _page(url: str, page: str, timeout_s: float) -> bytes:
    """The page's bytes, all of them within ``timeout_s`` (a page sent a byte at a time, or a
    chunked one that never ends, is cut there), at most ``MAX_PAGE_BYTES``."""
    parts = urllib.parse.urlsplit(page)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    fault = f"--from {url}: cannot read {page}"
    try:
        conn = kind(parts.hostname or "", parts.port, timeout=timeout_s)
        conn.connect()
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{fault} ({exc}); is the server up, with its metrics on that port?") from None
    assert conn.sock is not None
    with WATCHDOG.arm(conn.sock, timeout_s) as alarm:
        try:
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            resp = conn.getresponse()
            if resp.status != 200:
                where = resp.getheader("Location", "")[:200]
                raise ProfileError(f"{fault}: it answered HTTP {resp.status}" + (f" (to {where!r}): give that address"
                                                                                if where else ""))
            body = resp.read(MAX_PAGE_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            if not alarm.fired:
                raise ProfileError(f"{fault} ({type(exc).__name__}: {exc})") from None
            body = b""
        finally:
            conn.close()
    if alarm.fired:
        raise ProfileError(f"{fault}: the page did not arrive whole within {timeout_s:g} s")
    if len(body) > MAX_PAGE_BYTES:
        raise ProfileError(f"--from {url}: {page} is larger than {MAX_PAGE_BYTES >> 20} MiB: not a metrics page")
    return body


def _wanted(text: str, url: str) -> str:
    """The page's sample lines of ``FAMILIES`` (comments and every other family skipped), each
    checked for length: the parser's time is bounded by what kvoffload reads."""
    keep = []
    for line in text.splitlines():
        match = _NAME.match(line)
        if match is None or match.group() not in FAMILIES:
            continue
        if len(line) > MAX_LINE_CHARS:
            raise ProfileError(f"--from {url}: a {match.group()} line of {len(line)} characters (at most "
                               f"{MAX_LINE_CHARS}): not a metrics page a server writes")
        keep.append(line)
    return "\n".join(keep) + "\n"


def scrape(url: str, timeout_s: float = 10.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the families kvoffload reads (``FAMILIES``): name -> [(labels, value)];
    values that are not finite, negative or past ``MAX_VALUE`` are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    page = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    if not page.startswith(("http://", "https://")):
        raise ProfileError(f"--from {url!r}: give the server's address, e.g. http://127.0.0.1:8000")
    body = _page(url, page, timeout_s)
    text = body.decode("utf-8", "replace")
    if body.strip() and not any(_NAME.match(line) or line.startswith("#") for line in text.splitlines()[:50]):
        raise ProfileError(f"--from {url}: {page} is not Prometheus text (no metric line in its first 50)")
    wanted = _wanted(text, url)
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(wanted):
            for s in family.samples:
                # 0 <= v <= MAX_VALUE before any float(): an integer of 400 digits overflows one.
                if s.name in FAMILIES and 0 <= s.value <= MAX_VALUE:  # NaN fails too
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
    return {k: sum(x / len(v) for x in v) for k, v in seen.items()}  # a mean that cannot overflow


def _engine(metrics: dict[str, Any], model: str, max_batched_tokens: int | None) -> EngineSpeed:
    rates = {int(k): v for k, v in _by_label(metrics.get("kvoffload_prefill_tokens_per_second", []), "tokens").items()
             if re.fullmatch(r"[0-9]{1,9}", k) and 0 < int(k) <= MAX_STEP_TOKENS and v > 0}
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
        count = sum(v for _, v in metrics.get(f"{name}_count", []))
        return sum(v / count for _, v in metrics.get(f"{name}_sum", [])) if count else None

    ttft = mean("vllm:time_to_first_token_seconds")
    queue, prefill = mean("vllm:request_queue_time_seconds"), mean("vllm:request_prefill_time_seconds")
    return max(ttft - queue - prefill, 0.0) if ttft is not None and queue is not None and prefill is not None else 0.0


def step_overheads(metrics: dict[str, Any]) -> tuple[float, float]:
    """(idle_step_s, load_step_s) as the server's steps came round (0 where not seen yet)."""
    parts = _by_label(metrics.get("kvoffload_step_overhead_seconds", []), "part")
    idle = parts.get("idle_step", 0.0)
    return (idle if idle >= MIN_IDLE_STEP_S else 0.0), parts.get("per_load", 0.0)


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
    profile = Profile(replace(engine, shape=shape, params=params), speeds, f"{url}, in service, {when}", sources)
    return checked(profile, url)


#: Where each profile figure comes from on the page, for an error naming it.
_METRIC_OF = {"step_s": "kvoffload_prefill_tokens_per_second", "token_s": "kvoffload_prefill_tokens_per_second",
              "max_batched_tokens": "kvoffload_prefill_tokens_per_second",
              "idle_step_s": 'kvoffload_step_overhead_seconds{part="idle_step"}',
              "load_step_s": 'kvoffload_step_overhead_seconds{part="per_load"}',
              "request_s": "vllm:time_to_first_token_seconds less the queue and prefill times",
              "load_gb_per_s": "kvoffload_tier_load_bytes_per_second",
              "store_gb_per_s": "kvoffload_transfer_bytes_total / kvoffload_transfer_seconds_sum",
              "load_latency_s": "kvoffload_tier_load_latency_seconds",
              "store_latency_s": "kvoffload_tier_load_latency_seconds"}


def checked(profile: Profile, url: str) -> Profile:
    """The profile as ``plan`` will read it back: figures no engine has (an overflowed mean, a
    step of no time) are refused here, naming the metric, not written for ``plan`` to refuse."""
    try:
        return parse_profile(yaml.safe_load(profile.to_yaml()), "the profile")
    except ProfileError as exc:
        key = re.search(r"\.(\w+) = ", str(exc))
        metric = _METRIC_OF.get(key.group(1), "its metrics") if key else "its metrics"
        raise ProfileError(f"--from {url}: {exc} (from {metric}): the server published figures no engine has; "
                           "check that page") from None
