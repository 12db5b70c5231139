"""The scheduler half's counters, and the dict ``stats()`` reports them as.

Hits are counted when a load lands, not when it is planned; failed hits, rejected reads and
skipped stores by tier; everything else the tiers know (usage, health, recovery) comes from the
chain's report when asked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypedDict

from kvoffload.offload.tier_report import ChainReport


@dataclass(slots=True)
class SchedulerSideStats:
    lookups: int = 0
    lookups_deferred: int = 0
    loaded_blocks: int = 0
    stored_blocks: int = 0
    failed_store_blocks: int = 0
    failed_load_blocks: int = 0
    #: Blocks whose load was given up: predicted to finish later than recomputing them.
    cancelled_load_blocks: int = 0
    store_retries: int = 0
    evicted_blocks: int = 0
    demoted_blocks: int = 0
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    resets: int = 0
    #: Store jobs the worker had to finish before a step: they read sliding-window blocks the
    #: engine had released and handed out again.
    store_flushes: int = 0
    #: Prompt tokens (and blocks) served by each tier: counted when the load lands, not when
    #: it is planned; a planned hit whose load failed counts in tier_failed_hits instead.
    tier_hits: Counter[str] = field(default_factory=Counter)
    tier_hit_blocks: Counter[str] = field(default_factory=Counter)
    tier_failed_hits: Counter[str] = field(default_factory=Counter)
    #: (tier, reason) -> blocks a read rejected (checksum, auth, key, format, missing).
    tier_rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: tier -> blocks its worker did not store because its writes were too slow (backpressure).
    tier_stores_skipped: Counter[str] = field(default_factory=Counter)
    #: (slowest tier of the hit, decision) -> requests: load, partial or recompute (LoadCostModel).
    load_decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: What loading saved by the cost model's estimates, against recomputing the same tokens.
    estimated_saved_seconds: float = 0.0
    #: Requests that carried a usable hint; hints given to the tiers (at lookup and finish);
    #: requests whose output held a tool-call token (``HintRelay``).
    hinted_requests: int = 0
    hints_given: int = 0
    tool_call_finishes: int = 0


class ConnectorStatsDict(TypedDict):
    """The scheduler half's counters, as ``stats()`` reports them (by tier where a dict)."""

    lookups: int
    hit_tokens_by_tier: dict[str, int]
    hit_blocks_by_tier: dict[str, int]
    failed_hit_tokens_by_tier: dict[str, int]
    tier_rejected_blocks: dict[str, dict[str, int]]
    tier_stores_skipped: dict[str, int]
    tier_usage: dict[str, list[int]]
    jobs_in_flight: int
    demotions_queued: int
    loaded_blocks: int
    stored_blocks: int
    evicted_blocks: int
    filter_skipped_blocks: int
    store_retries: int
    failed_store_blocks: int
    failed_load_blocks: int
    cancelled_load_blocks: int
    lookups_deferred: int
    demoted_blocks: int
    corrupt_blocks: int
    tier_blocks_recovered: dict[str, int]
    tier_io_errors: dict[str, int]
    tier_outages: dict[str, int]
    swapped_out_blocks: int
    swapped_in_blocks: int
    store_flushes: int
    load_decisions: dict[str, dict[str, int]]
    estimated_saved_seconds: float
    load_cost: dict[str, dict[str, float]]
    hinted_requests: int
    hints_given: int
    tool_call_finishes: int


def _by_tier(counts: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (tier, reason), n in counts.items():
        out.setdefault(tier, {})[reason] = n
    return out


def connector_stats(s: SchedulerSideStats, report: ChainReport, jobs_in_flight: int,
                    demotions_queued: bool, load_cost: dict[str, dict[str, float]]) -> ConnectorStatsDict:
    secondaries = report.tiers[1:]
    return {
        "lookups": s.lookups,
        "hit_tokens_by_tier": dict(s.tier_hits),
        "hit_blocks_by_tier": dict(s.tier_hit_blocks),
        "failed_hit_tokens_by_tier": dict(s.tier_failed_hits),
        "tier_rejected_blocks": _by_tier(s.tier_rejected),
        "tier_stores_skipped": dict(s.tier_stores_skipped),
        "tier_usage": {t.name: [t.blocks_used, t.capacity_blocks] for t in report.tiers},
        "jobs_in_flight": jobs_in_flight,
        "demotions_queued": int(demotions_queued),
        "loaded_blocks": s.loaded_blocks,
        "stored_blocks": s.stored_blocks,
        "evicted_blocks": s.evicted_blocks,
        "filter_skipped_blocks": report.filter_skipped_blocks,
        "store_retries": s.store_retries,
        "failed_store_blocks": s.failed_store_blocks,
        "failed_load_blocks": s.failed_load_blocks,
        "cancelled_load_blocks": s.cancelled_load_blocks,
        "lookups_deferred": s.lookups_deferred,
        "demoted_blocks": s.demoted_blocks,
        # Records dropped as corrupt (a read's, or torn ones found when a tier opened).
        "corrupt_blocks": report.corrupt_blocks,
        # Every secondary tier's records recovered at start and health, by tier: {"disk": 0, "fs": 2}.
        "tier_blocks_recovered": {t.name: t.blocks_recovered for t in secondaries},
        "tier_io_errors": {t.name: t.io_errors for t in secondaries},
        "tier_outages": {t.name: t.outages for t in secondaries},
        "swapped_out_blocks": s.swapped_out_blocks,
        "swapped_in_blocks": s.swapped_in_blocks,
        "store_flushes": s.store_flushes,
        "load_decisions": _by_tier(s.load_decisions),
        "estimated_saved_seconds": s.estimated_saved_seconds,
        # The cost model's measurements (gauges): {gauge name: {label value: value}}.
        "load_cost": load_cost,
        "hinted_requests": s.hinted_requests,
        "hints_given": s.hints_given,
        "tool_call_finishes": s.tool_call_finishes,
    }
