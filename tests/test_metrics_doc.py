"""docs/metrics.md lists every metric the code serves, with its type and labels, and no other."""

import re
from pathlib import Path

from kvoffload.metrics import BYTES_BUCKETS, CONNECTOR_COUNTERS, GAUGES, SECONDS_BUCKETS, TIER_COUNTERS, _families

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def _every_stat() -> dict:
    """A stats dict with every key the metrics read, so each family has a sample."""
    direction = {"bytes": 1, "jobs": 1, "failed": 0, "seconds": 0.1, "seconds_hist": [1] * (len(SECONDS_BUCKETS) + 1),
                 "bytes_hist": [1] * (len(BYTES_BUCKETS) + 1)}
    conn = {k: 1 for k in CONNECTOR_COUNTERS}
    conn.update({k: {"disk": 1} for k in TIER_COUNTERS})
    conn.update({"hit_blocks_by_tier": {"cpu": 1}, "tier_rejected_blocks": {"disk": {"checksum": 1}},
                 "load_decisions": {"cpu": {"layerwise": 1}}, "failed_hit_tokens_by_tier": {"disk": 1},
                 "tier_usage": {"cpu": (1, 2)}, "jobs_in_flight": 0, "demotions_queued": 0,
                 "load_cost": {name: {"cpu": 1.0} for name in GAUGES}})
    return {"prefix_hit_tokens": {"device": 1, "cpu": 1}, "prompt_tokens": 2, "prefill_tokens_computed": 1,
            "preemptions": 0, "connector": conn, "transfer": {"device_to_host": direction, "host_to_device": direction}}


def _documented() -> dict[str, tuple[str, str]]:
    rows = re.findall(r"^\| `(kvoffload_\w+)` \| (\w+) \| ([^|]+) \|", DOC.read_text(), re.M)
    return {name: (kind, labels.strip()) for name, kind, labels in rows}


def test_every_served_metric_is_documented_with_its_type_and_labels():
    served = {}
    for family in _families(_every_stat()):
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        name = family.name + ("_total" if family.type == "counter" else "")
        served[name] = (family.type, ", ".join(labels) or "—")
    documented = _documented()
    assert len(served) >= 40
    missing = sorted(set(served) - set(documented))
    assert not missing, f"docs/metrics.md lacks {missing}"
    stale = sorted(set(documented) - set(served))
    assert not stale, f"docs/metrics.md lists metrics the code no longer serves: {stale}"
    wrong = {n: (documented[n], served[n]) for n in served if documented[n] != served[n]}
    assert not wrong, f"type or labels differ (doc, code): {wrong}"


def test_the_vllm_route_serves_the_documented_counters():
    """The vLLM route builds its counters from the same vocabulary (its module needs vLLM to
    import, so the check is on the names it is built from)."""
    documented = _documented()
    for name, _ in CONNECTOR_COUNTERS.values():
        assert f"{name}_total" in documented
    for name, _ in TIER_COUNTERS.values():
        assert documented[f"{name}_total"][1] == "tier"
    for name, (label, _) in GAUGES.items():
        assert documented[name] == ("gauge", label or "—")


def test_each_counter_has_one_name_from_field_to_metric():
    """A counter is called the same in the scheduler half's fields or the chain's report, in
    ``stats()["connector"]`` and (after ``kvoffload_``) in the metric: one counter once had
    three names (``evicted_blocks`` → ``"blocks_evicted"`` → ``kvoffload_evicted_blocks``)."""
    from dataclasses import fields

    from kvoffload.connector.scheduler.scheduler_stats import ConnectorStatsDict, SchedulerSideStats
    from kvoffload.offload.tier_report import ChainReport

    named = {f.name for f in fields(SchedulerSideStats)} | {f.name for f in fields(ChainReport)}
    keys = set(ConnectorStatsDict.__annotations__)
    for key, (metric, _) in {**CONNECTOR_COUNTERS, **TIER_COUNTERS}.items():
        assert metric == f"kvoffload_{key}", (key, metric)
        assert key in keys, f"{key}: not a stats() key"
    # Every plain counter is a field of the same name (the chain report's corrupt_blocks sums
    # its tiers', a property).
    assert sorted(k for k in CONNECTOR_COUNTERS if k not in named) == ["corrupt_blocks"]
