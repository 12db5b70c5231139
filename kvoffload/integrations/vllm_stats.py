"""kvoffload's metrics through vLLM's connector interfaces.

vLLM asks each connector half for its stats every step (``get_kv_connector_stats``), sums the
workers' and the scheduler's, and hands the sum to the connector's Prometheus metrics in the
API server process (``build_prom_metrics``). So each half reports *deltas* since its last
report, as ``{metric: {label value: delta}}``, and the Prometheus side only adds them up: the
counters in ``vllm serve``'s ``/metrics`` equal the engine's own running totals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from kvoffload.metrics import (
    BYTES_BUCKETS,
    CONNECTOR_COUNTERS,
    FAILED_HIT_TOKENS,
    GAUGES,
    HIT_BLOCKS,
    HIT_TOKENS,
    LOAD_DECISIONS,
    REJECTED_BLOCKS,
    SECONDS_BUCKETS,
    TIER_COUNTERS,
    TRANSFER_COUNTERS,
)

#: Counter name -> (label, documentation); "" label: unlabelled. The bundled engine's names.
METRICS: dict[str, tuple[str, str]] = {
    HIT_TOKENS[0]: ("tier", HIT_TOKENS[1]),
    HIT_BLOCKS[0]: ("tier", HIT_BLOCKS[1]),
    FAILED_HIT_TOKENS[0]: ("tier", FAILED_HIT_TOKENS[1]),
    REJECTED_BLOCKS[0]: ("tier,reason", REJECTED_BLOCKS[1]),  # several labels: their values joined by ","
    LOAD_DECISIONS[0]: ("tier,decision", LOAD_DECISIONS[1]),
    **{name: ("", doc) for name, doc in CONNECTOR_COUNTERS.values()},
    **{name: ("direction", doc) for name, doc in TRANSFER_COUNTERS.values()},
    **{name: ("tier", doc) for name, doc in TIER_COUNTERS.values()},
}


def scheduler_totals(stats: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Running totals of the scheduler half, in the metrics' shape."""
    out: dict[str, dict[str, float]] = {
        HIT_TOKENS[0]: dict(stats.get("hit_tokens_by_tier", {})),
        HIT_BLOCKS[0]: dict(stats.get("hit_blocks_by_tier", {})),
        FAILED_HIT_TOKENS[0]: dict(stats.get("failed_hit_tokens_by_tier", {})),
        REJECTED_BLOCKS[0]: {f"{tier},{reason}": n for tier, reasons in stats.get("tier_rejected_blocks", {}).items()
                             for reason, n in reasons.items()},
        LOAD_DECISIONS[0]: {f"{tier},{decision}": n for tier, decisions in stats.get("load_decisions", {}).items()
                            for decision, n in decisions.items()},
    }
    for key, (name, _) in CONNECTOR_COUNTERS.items():
        out[name] = {"": stats.get(key, 0)}
    for key, (name, _) in TIER_COUNTERS.items():
        out[name] = dict(stats.get(key, {}))
    return out


def worker_totals(transfer: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Running totals of a worker half's copies, in the metrics' shape."""
    return {name: {direction: d.get(key, 0) for direction, d in transfer.items()}
            for key, (name, _) in TRANSFER_COUNTERS.items()}


class DeltaTracker:
    """Turns running totals into the increments since the previous call."""

    def __init__(self) -> None:
        self._last: dict[str, dict[str, float]] = {}

    def delta(self, totals: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for name, values in totals.items():
            last = self._last.setdefault(name, {})
            for label, value in values.items():
                step = value - last.get(label, 0)
                if step:
                    out.setdefault(name, {})[label] = step
                last[label] = value
        return out


@dataclass
class KVOffloadConnectorStats(KVConnectorStats):
    """``data`` (plain dicts and lists: it crosses processes):
    ``"c"``: {counter: {label: increment}}, summed; ``"g"``: {gauge: {label: value}}, the latest
    wins; ``"s"``: {direction: [[seconds, bytes], ...]}, copies to observe one by one."""

    def __post_init__(self) -> None:
        for key in ("c", "g", "s"):
            self.data.setdefault(key, {})

    def reset(self) -> None:
        self.data: dict[str, Any] = {"c": {}, "g": {}, "s": {}}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, values in other.data.get("c", {}).items():
            mine = self.data["c"].setdefault(name, {})
            for label, value in values.items():
                mine[label] = mine.get(label, 0) + value
        for name, values in other.data.get("g", {}).items():
            self.data["g"].setdefault(name, {}).update(values)
        for direction, samples in other.data.get("s", {}).items():
            self.data["s"].setdefault(direction, []).extend(samples)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {f"{name}{'[' + label + ']' if label else ''}": value
                for name, values in self.data["c"].items() for label, value in values.items()}

    def is_empty(self) -> bool:
        return not (any(self.data["c"].values()) or any(self.data["g"].values()) or any(self.data["s"].values()))


class KVOffloadPromMetrics(KVConnectorPromMetrics):
    """Prometheus metrics per engine: counters add increments, gauges take the latest value,
    histograms observe each copy's time and size."""

    def __init__(self, vllm_config: Any, metric_types: dict[type, type], labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)

        def extra(label: str) -> list[str]:
            return [*labelnames, *(label.split(",") if label else [])]

        self._counters = {name: self._counter_cls(name=name, documentation=doc, labelnames=extra(label))
                          for name, (label, doc) in METRICS.items()}
        self._gauges = {name: self._gauge_cls(name=name, documentation=doc, labelnames=extra(label),
                                              multiprocess_mode="mostrecent")
                        for name, (label, doc) in GAUGES.items()}
        self._seconds = self._histogram_cls(name="kvoffload_transfer_seconds",
                                            documentation="Time of one copy", labelnames=extra("direction"),
                                            buckets=list(SECONDS_BUCKETS))
        self._sizes = self._histogram_cls(name="kvoffload_transfer_size_bytes", documentation="Bytes of one copy",
                                          labelnames=extra("direction"), buckets=list(BYTES_BUCKETS))

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        engine = [str(v) for v in self.per_engine_labelvalues.get(engine_idx, [])]
        for name, values in transfer_stats_data.get("c", {}).items():
            counter = self._counters.get(name)
            if counter is None:
                continue  # from a newer kvoffload: ignored, not fatal
            for label, value in values.items():
                if value > 0:
                    counter.labels(*engine, *(label.split(",") if label else [])).inc(value)
        for name, values in transfer_stats_data.get("g", {}).items():
            gauge = self._gauges.get(name)
            if gauge is None:
                continue
            for label, value in values.items():
                gauge.labels(*engine, *([label] if label else [])).set(value)
        for direction, samples in transfer_stats_data.get("s", {}).items():
            seconds, sizes = self._seconds.labels(*engine, direction), self._sizes.labels(*engine, direction)
            for s, n in samples:
                seconds.observe(s)
                sizes.observe(n)


__all__ = ["DeltaTracker", "KVOffloadConnectorStats", "KVOffloadPromMetrics", "scheduler_totals", "worker_totals"]
