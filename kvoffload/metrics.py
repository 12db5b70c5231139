"""Prometheus metrics of an engine run: one vocabulary (``kvoffload_`` prefix, labels ``tier`` and
``direction``) read from the engine's stats dict at scrape time.

Pull, not push: each scrape reads ``llm.stats()`` once, so every counter equals what the
engine reports at that instant and nothing is counted twice or held in a second place. The
histograms come from the worker's per-direction bucket counts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvoffload.errors import ConfigError

logger = logging.getLogger(__name__)

#: Upper bounds of the transfer histograms; the worker counts jobs into the same buckets.
SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
BYTES_BUCKETS = (4096.0, 65536.0, 1048576.0, 16777216.0, 268435456.0)

# The vocabulary, shared with the vLLM route (kvoffload.integrations.vllm_stats).
HIT_TOKENS = ("kvoffload_hit_tokens", "Prompt tokens served from a cache, by tier")
HIT_BLOCKS = ("kvoffload_hit_blocks", "Offloaded blocks loaded, by tier")
REJECTED_BLOCKS = ("kvoffload_tier_rejected_blocks",
                   "Blocks a tier's read rejected and dropped (served as misses), by tier and reason: checksum, "
                   "auth (MAC: not written with the shared secret), key, format, missing")
LOAD_DECISIONS = ("kvoffload_load_decisions",
                  "Hits the cost model decided, by the slowest tier the hit reached and decision: load (all of it), "
                  "partial (its leading part, the rest recomputed), recompute (none of it)")
FAILED_HIT_TOKENS = ("kvoffload_failed_hit_tokens", "Prompt tokens a tier's lookup promised whose load failed (recomputed)")
#: transfer stats key -> (metric name, help); counters labelled by direction.
TRANSFER_COUNTERS = {
    "bytes": ("kvoffload_transfer_bytes", "Bytes copied"),
    "jobs": ("kvoffload_transfer_jobs", "Copies finished"),
    "failed": ("kvoffload_transfer_failed_jobs", "Copies failed"),
}
#: gauge name -> (label, help); "" label: unlabelled.
GAUGES = {
    "kvoffload_tier_used_blocks": ("tier", "Blocks held by a tier"),
    "kvoffload_tier_capacity_blocks": ("tier", "Capacity of a tier in blocks"),
    "kvoffload_jobs_in_flight": ("", "Copies planned and not yet reported"),
    "kvoffload_demotions_queued": ("", "1 while demotions wait for the next step"),
    "kvoffload_tier_load_bytes_per_second": ("tier", "A tier's load throughput, as the cost model measures it"),
    "kvoffload_tier_load_latency_seconds": ("tier", "A tier's fixed time per load job, as the cost model measures it"),
    "kvoffload_prefill_tokens_per_second": ("tokens", "The engine's forward throughput in steps of up to this many "
                                            "tokens, as the cost model measures it"),
    "kvoffload_layerwise_stall_seconds": ("part", "What a step loses to the layer-wise loads inside it, as the "
                                          "cost model measures it: per_step (fixed) and per_block"),
    "kvoffload_step_overhead_seconds": ("part", "A load's way through the engine besides its copy, as the steps "
                                        "come round: idle_step (a step computing nothing while a load is on its "
                                        "way) and per_load (what sending one off adds to its step)"),
}
#: connector stats key -> (metric name, help); plain counters without labels.
CONNECTOR_COUNTERS = {
    "lookups": ("kvoffload_lookups", "Prefix lookups in the offload tiers"),
    "lookups_deferred": ("kvoffload_lookups_deferred", "Lookups deferred a step (a store or load still in flight)"),
    "loaded_blocks": ("kvoffload_loaded_blocks", "Offloaded blocks loaded into the device cache"),
    "failed_load_blocks": ("kvoffload_failed_load_blocks", "Blocks whose load failed (recomputed)"),
    "cancelled_load_blocks": ("kvoffload_cancelled_load_blocks", "Blocks whose load was given up as slower than "
                        "recomputing them (a tier that slowed down): recomputed"),
    "corrupt_blocks": ("kvoffload_corrupt_blocks", "Blocks dropped as corrupt, misplaced or unreadable"),
    "stored_blocks": ("kvoffload_stored_blocks", "Blocks stored into the first tier"),
    "failed_store_blocks": ("kvoffload_failed_store_blocks", "Blocks whose store failed"),
    "store_retries": ("kvoffload_store_retries", "Stores retried because the tier was full of pinned blocks"),
    "filter_skipped_blocks": ("kvoffload_filter_skipped_blocks", "Offered blocks the reuse filter did not store"),
    "evicted_blocks": ("kvoffload_evicted_blocks", "Blocks evicted from the first tier"),
    "demoted_blocks": ("kvoffload_demoted_blocks", "Blocks demoted into a slower tier"),
    "swapped_out_blocks": ("kvoffload_swapped_out_blocks", "Blocks saved at swap-mode preemption"),
    "swapped_in_blocks": ("kvoffload_swapped_in_blocks", "Blocks restored at swap-mode resume"),
    "store_flushes": ("kvoffload_store_flushes", "Stores awaited before a step: they read a sliding-window block "
                      "the engine had released and handed out again"),
    "hinted_requests": ("kvoffload_hinted_requests", "Requests that carried a usable kvoffload hint"),
    "hints_given": ("kvoffload_hints_given", "Hints given to the tiers' policies (a hinted request's lookup and finish)"),
    "tool_call_finishes": ("kvoffload_tool_call_finishes", "Requests whose output held a tool-call token "
                           "(hints.tool_call_token_ids): expected back within hints.tool_return_s"),
    "estimated_saved_seconds": ("kvoffload_estimated_saved_seconds", "Seconds of prefill the loads saved, as the cost "
                                "model estimated them against recomputing the same tokens"),
}

#: Counters of each secondary tier's health, labelled by tier.
TIER_COUNTERS = {
    "tier_io_errors": ("kvoffload_tier_io_errors", "Copies into or out of a tier that failed with an I/O or store error"),
    "tier_outages": ("kvoffload_tier_outages", "Times a tier was taken out of service after errors in a row"),
    "tier_stores_skipped": ("kvoffload_tier_stores_skipped", "Blocks a tier did not store because its writes were "
                            "too slow (backpressure): they stay in the tiers above"),
}


def _families(stats: dict[str, Any]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    conn: dict[str, Any] = stats.get("connector", {})
    hits = CounterMetricFamily(*HIT_TOKENS, labels=["tier"])
    for tier, n in stats.get("prefix_hit_tokens", {}).items():
        hits.add_metric([tier], n)
    yield hits
    blocks = CounterMetricFamily(*HIT_BLOCKS, labels=["tier"])
    for tier, n in conn.get("hit_blocks_by_tier", {}).items():
        blocks.add_metric([tier], n)
    yield blocks
    rejected = CounterMetricFamily(*REJECTED_BLOCKS, labels=["tier", "reason"])
    for tier, reasons in conn.get("tier_rejected_blocks", {}).items():
        for reason, n in reasons.items():
            rejected.add_metric([tier, reason], n)
    yield rejected
    decisions = CounterMetricFamily(*LOAD_DECISIONS, labels=["tier", "decision"])
    for tier, by_decision in conn.get("load_decisions", {}).items():
        for decision, n in by_decision.items():
            decisions.add_metric([tier, decision], n)
    yield decisions
    failed = CounterMetricFamily(*FAILED_HIT_TOKENS, labels=["tier"])
    for tier, n in conn.get("failed_hit_tokens_by_tier", {}).items():
        failed.add_metric([tier], n)
    yield failed
    yield CounterMetricFamily("kvoffload_prompt_tokens", "Prompt tokens of all requests", value=stats.get("prompt_tokens", 0))
    yield CounterMetricFamily("kvoffload_prefill_computed_tokens", "Prompt tokens computed (not served from a cache)",
                              value=stats.get("prefill_tokens_computed", 0))
    yield CounterMetricFamily("kvoffload_preemptions", "Requests preempted", value=stats.get("preemptions", 0))
    for key, (name, doc) in CONNECTOR_COUNTERS.items():
        if key in conn:
            yield CounterMetricFamily(name, doc, value=conn[key])
    for key, (name, doc) in TIER_COUNTERS.items():
        family = CounterMetricFamily(name, doc, labels=["tier"])
        for tier, n in conn.get(key, {}).items():
            family.add_metric([tier], n)
        yield family
    for name, values in gauge_values(conn).items():
        label, doc = GAUGES[name]
        gauge = GaugeMetricFamily(name, doc, labels=[label] if label else [])
        for value_label, value in values.items():
            gauge.add_metric([value_label] if label else [], value)
        yield gauge
    transfer: dict[str, dict[str, Any]] = stats.get("transfer", {})
    counters = {key: CounterMetricFamily(name, doc, labels=["direction"])
                for key, (name, doc) in TRANSFER_COUNTERS.items()}
    seconds = HistogramMetricFamily("kvoffload_transfer_seconds", "Time of one copy", labels=["direction"])
    size = HistogramMetricFamily("kvoffload_transfer_size_bytes", "Bytes of one copy", labels=["direction"])
    for direction, d in transfer.items():
        for key, family in counters.items():
            family.add_metric([direction], d.get(key, 0))
        if "seconds_hist" in d:
            seconds.add_metric([direction], _cumulative(SECONDS_BUCKETS, d["seconds_hist"]), d.get("seconds", 0.0))
            size.add_metric([direction], _cumulative(BYTES_BUCKETS, d["bytes_hist"]), d.get("bytes", 0))
    yield from counters.values()
    yield seconds
    yield size


def gauge_values(conn: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The gauges' values from a connector's stats: {name: {label value ("" if none): value}}."""
    usage = conn.get("tier_usage", {})
    return {"kvoffload_tier_used_blocks": {tier: u[0] for tier, u in usage.items()},
            "kvoffload_tier_capacity_blocks": {tier: u[1] for tier, u in usage.items()},
            "kvoffload_jobs_in_flight": {"": conn.get("jobs_in_flight", 0)},
            "kvoffload_demotions_queued": {"": conn.get("demotions_queued", 0)},
            **{name: dict(values) for name, values in conn.get("load_cost", {}).items() if name in GAUGES}}


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip([*map(str, bounds), "+Inf"], counts):
        total += n
        out.append((bound, total))
    return out


class StatsCollector:
    """A prometheus_client collector over a stats function (``LLM.stats``)."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        try:
            stats = self._stats()
        except Exception as exc:  # noqa: BLE001 - a failed read must not kill the scrape thread
            logger.warning("kvoffload metrics: reading the engine's stats failed (%s: %s)", type(exc).__name__, exc)
            return
        yield from _families(stats)


class MetricsServer:
    """Serves ``/metrics`` for one engine on ``port`` (0: any free port, see ``.port``)."""

    def __init__(self, stats: Callable[[], dict[str, Any]], port: int, addr: str = "0.0.0.0") -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise ConfigError(f"metrics.prometheus_port: {port} needs prometheus_client ({exc}); "
                              "pip install prometheus_client, or remove the port") from None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatsCollector(stats))
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"metrics.prometheus_port: cannot listen on {addr}:{port} ({exc.strerror}); "
                              "pick a free port") from None
        self.port: int = self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
