"""Prometheus metrics of the bundled engine: a real scrape of /metrics over HTTP after a
workload with CPU hits; every counter equals llm.stats() at that instant."""

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.config import ConfigError
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.workload import ChatWorkload, run_chat_workload

BLOCK_BYTES = 8192


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_scrape_after_a_workload_equals_the_engine_stats():
    port = _free_port()
    offload = {"tiers": [{"medium": "cpu", "capacity": 400 * BLOCK_BYTES}], "metrics": {"prometheus_port": port}}
    wl = ChatWorkload(conversations=8, turns=3, system_tokens=128, user_tokens=64, max_tokens=8)
    with LLM(EngineConfig(num_gpu_blocks=40, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=offload)) as llm:
        run_chat_workload(llm, wl)
        stats = llm.stats()
        m = _scrape(port)
    conn, transfer = stats["connector"], stats["transfer"]
    assert stats["prefix_hit_tokens"]["cpu"] > 0
    for tier, n in stats["prefix_hit_tokens"].items():
        assert m[("kvoffload_hit_tokens_total", (("tier", tier),))] == n
    assert m[("kvoffload_hit_blocks_total", (("tier", "cpu"),))] == conn["hit_blocks_by_tier"]["cpu"] > 0
    assert m[("kvoffload_stored_blocks_total", ())] == conn["stored_blocks"] > 0
    assert m[("kvoffload_loaded_blocks_total", ())] == conn["loaded_blocks"] > 0
    assert m[("kvoffload_lookups_total", ())] == conn["lookups"] > 0
    assert m[("kvoffload_evicted_blocks_total", ())] == conn["evicted_blocks"]
    for direction in ("device_to_host", "host_to_device"):
        d = transfer[direction]
        assert m[("kvoffload_transfer_bytes_total", (("direction", direction),))] == d["bytes"] > 0
        assert m[("kvoffload_transfer_seconds_count", (("direction", direction),))] == d["jobs"]
        assert m[("kvoffload_transfer_size_bytes_bucket", (("direction", direction), ("le", "+Inf")))] == d["jobs"]
        assert m[("kvoffload_transfer_seconds_sum", (("direction", direction),))] == pytest.approx(d["seconds"])
    used, cap = conn["tier_usage"]["cpu"]
    assert m[("kvoffload_tier_used_blocks", (("tier", "cpu"),))] == used > 0
    assert m[("kvoffload_tier_capacity_blocks", (("tier", "cpu"),))] == cap == 400
    with pytest.raises(OSError):  # closed with the engine
        _scrape(port)


def test_a_port_in_use_is_refused_in_one_line_and_nothing_stays_open():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        offload = {"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "metrics": {"prometheus_port": port}}
        with pytest.raises(ConfigError, match=rf"metrics.prometheus_port: cannot listen on 0.0.0.0:{port} .*pick a free port"):
            LLM(EngineConfig(num_gpu_blocks=40, kv_offload=offload))


def test_kv_events_through_the_public_accessor():
    """vLLM's schema: one BlockStored per offloaded block, chained by the engine's own block
    hashes (as 64-bit integers), with its tokens; evictions name the same hashes."""
    from kvoffload.engine.hashing import hash_request_blocks
    from kvoffload.kv_events import BlockRemoved, BlockStored, external_block_hash

    offload = {"tiers": [{"medium": "cpu", "capacity": 6 * BLOCK_BYTES}], "metrics": {"events": True}}
    with LLM(EngineConfig(num_gpu_blocks=40, kv_offload=offload)) as llm:
        params = SamplingParams(max_tokens=5, ignore_eos=True)  # 99 + 5 tokens: 6 full blocks
        out = llm.generate([list(range(1, 100))], params)
        llm.generate([list(range(1, 100))], params)
        tokens = list(range(1, 100)) + out[0].token_ids
        hashes = [external_block_hash(h) for h in hash_request_blocks(tokens, 16)]
        events = llm.take_kv_events()
        assert events == [BlockStored(block_hashes=[hashes[i]], parent_block_hash=hashes[i - 1] if i else None,
                                      token_ids=tokens[16 * i : 16 * i + 16], block_size=16, lora_id=None,
                                      medium="CPU", lora_name=None, group_idx=0, locality="LOCAL")
                          for i in range(6)]  # the request's full blocks, stored once
        assert llm.take_kv_events() == []
        llm.generate([list(range(120, 220))], params)  # 6 more blocks: the tier evicts the first six
        events = llm.take_kv_events()
        removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
        assert sorted(removed) == sorted(hashes)
        assert sum(isinstance(e, BlockStored) for e in events) == 6


def test_the_grafana_dashboard_plots_only_metrics_a_scrape_has(tmp_path):
    """The shipped dashboard (kvoffload/examples/grafana_dashboard.json) against a real scrape of
    an engine with a CPU and a disk tier: a renamed metric must not leave an empty panel."""
    import json
    import re
    from importlib import resources

    dash = json.loads((resources.files("kvoffload") / "examples" / "grafana_dashboard.json").read_text())
    wanted = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"kvoffload_[a-z_]+", t["expr"])}
    assert len(dash["panels"]) >= 8 and "kvoffload_hit_tokens_total" in wanted
    port = _free_port()
    offload = {"tiers": [{"medium": "cpu", "capacity": 40 * BLOCK_BYTES},
                         {"medium": "disk", "capacity": 400 * BLOCK_BYTES, "path": str(tmp_path)}],
               "metrics": {"prometheus_port": port}}
    wl = ChatWorkload(conversations=6, turns=2, system_tokens=128, user_tokens=32, max_tokens=4)
    with LLM(EngineConfig(num_gpu_blocks=40, max_num_seqs=3, max_num_batched_tokens=256, kv_offload=offload)) as llm:
        run_chat_workload(llm, wl)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    names = set()
    for family in text_string_to_metric_families(text):  # declared families count: a labelled one
        names |= {s.name for s in family.samples}         # (rejected reads) has samples only once used
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    assert wanted <= names, sorted(wanted - names)


def test_kv_events_after_a_reset_remove_the_old_blocks_and_chain_to_the_engines_hashes_again():
    """A reset re-keys the tiers (a salt): what it announced before is removed, and blocks
    stored after it carry the engine's own hashes again, not the salted keys."""
    from kvoffload.engine.hashing import hash_request_blocks
    from kvoffload.kv_events import BlockRemoved, BlockStored, external_block_hash

    offload = {"tiers": [{"medium": "cpu", "capacity": 16 * BLOCK_BYTES}], "metrics": {"events": True}}
    with LLM(EngineConfig(num_gpu_blocks=40, kv_offload=offload)) as llm:
        params = SamplingParams(max_tokens=5, ignore_eos=True)
        out = llm.generate([list(range(1, 100))], params)
        hashes = [external_block_hash(h) for h in hash_request_blocks(list(range(1, 100)) + out[0].token_ids, 16)]
        assert [e.block_hashes[0] for e in llm.take_kv_events()] == hashes
        assert llm.reset_prefix_cache(reset_connector=True)
        (removed,) = llm.take_kv_events()
        assert isinstance(removed, BlockRemoved) and sorted(removed.block_hashes) == sorted(hashes)
        again = llm.generate([list(range(1, 100))], params)
        assert again[0].num_cached_tokens == 0 and again[0].token_ids == out[0].token_ids
        stored = llm.take_kv_events()
        assert all(isinstance(e, BlockStored) for e in stored)
        assert [e.block_hashes[0] for e in stored] == hashes
