"""prefix_value: sightings once per request, learned values per kind, admission, tail-first
eviction, and the live path (bundled engine, identical tokens)."""

from __future__ import annotations

import pytest
from kvoffload_policies.prefix_value import PrefixValueCachePolicy
from kvoffload_policies.simulator import replay

from kvoffload.offload import CPUOffloadingManager


def manager(capacity: int) -> tuple[CPUOffloadingManager, PrefixValueCachePolicy]:
    mgr = CPUOffloadingManager(capacity, cache_policy="prefix_value", native=False)  # the reference
    policy = mgr.index.policy
    assert isinstance(policy, PrefixValueCachePolicy)
    return mgr, policy


def serve(mgr: CPUOffloadingManager, chain: list[int]) -> int:
    """One request the way the connector issues it: touch, lookup, store the rest, touch again."""
    mgr.touch(chain)
    hits = mgr.lookup(chain)
    rest = chain[hits:]
    out = mgr.prepare_store(rest)
    if out is not None:
        mgr.touch(rest)
        mgr.complete_store(out.block_hashes_to_store)
    return hits


def test_a_request_touching_its_chain_three_times_is_one_sighting():
    mgr, pol = manager(8)
    for _ in range(3):
        mgr.touch([1, 2, 3])
    assert [pol.history[h].sightings for h in (1, 2, 3)] == [1, 1, 1]
    mgr.touch([1, 2, 3, 4])  # the next turn: a new chain end
    assert [pol.history[h].sightings for h in (1, 2, 3, 4)] == [2, 2, 2, 1]
    assert sum(pol.trials.values()) == 3  # the three re-sighted blocks were three experiments


def test_a_reuse_while_stored_is_learned_and_a_block_being_written_is_not_reused():
    mgr, pol = manager(8)
    serve(mgr, [1, 2])  # stored; the touch after the store (being written) is no reuse
    assert pol.trials == {}
    assert serve(mgr, [1, 2, 3]) == 2
    assert pol.blocks[1].sightings == 2 and sum(pol.wins.values()) == 2


def test_a_kind_never_reused_is_learned_and_no_longer_admitted():
    # Every request: a shared system prompt S, then a block no one asks for again.
    mgr, pol = manager(4)
    written = late = 0
    hits = []
    for i in range(3000):  # outcomes arrive as hashes leave the 1024-hash history
        mgr.touch(["S", i])
        hits.append(mgr.lookup(["S", i]))
        out = mgr.prepare_store(["S", i][hits[-1]:])
        assert out is not None
        written += len(out.block_hashes_to_store)
        late += len(out.block_hashes_to_store) if i >= 2000 else 0
        mgr.complete_store(out.block_hashes_to_store)
    tail_kind = (1, 0, True, 0)  # seen once, last of its chain, after only a known root, few new blocks
    assert pol.value(tail_kind) < pol.admit_threshold
    assert written < 1100 and late == 0  # LRU writes all 3001; learned, it declines every one
    assert hits[-100:] == [1] * 100  # the shared prompt stays
    assert replay([["S", i] for i in range(3000)], 4, "lru").blocks_written == 3001


def test_tail_leaves_before_its_prefix_among_equal_values():
    mgr, pol = manager(3)
    serve(mgr, [1, 2, 3])
    out = mgr.prepare_store([9])
    assert out is not None and out.block_hashes_evicted == [3]


def test_admits_everything_while_there_is_room():
    mgr, pol = manager(100)
    pol.admit_threshold = 2.0  # nothing could pass
    out = mgr.prepare_store(list(range(50)))
    assert out is not None and out.block_hashes_to_store == list(range(50))


def test_eviction_is_atomic_and_skips_pinned_blocks():
    mgr, pol = manager(2)
    serve(mgr, [1])
    serve(mgr, [2])
    mgr.prepare_load([1])
    mgr.prepare_load([2])
    assert mgr.prepare_store([3]) is None  # both pinned: nothing changes
    assert set(pol.blocks) == {1, 2}
    mgr.complete_load([1])
    out = mgr.prepare_store([3])
    assert out is not None and out.block_hashes_evicted == [1]


def test_heap_stays_bounded_under_many_touches():
    mgr, pol = manager(16)
    for i in range(2000):
        serve(mgr, [i % 16, 1000 + i % 7])
    assert len(pol.heap) <= 4 * len(pol.blocks) + 64


def test_bundled_engine_with_prefix_value_tier_gives_identical_tokens():
    from kvoffload.engine import LLM, EngineConfig
    from kvoffload.workload import ChatWorkload, run_chat_workload

    wl = ChatWorkload(conversations=6, turns=3, system_tokens=96, user_tokens=48, max_tokens=6)
    outs = {}
    for name, kv in (("none", None),
                     ("prefix_value", {"tiers": [{"medium": "cpu", "capacity": 40 * 8192,
                                                  "eviction_policy": "prefix_value"}]})):
        with LLM(EngineConfig(num_gpu_blocks=24, max_num_seqs=2, max_num_batched_tokens=256, kv_offload=kv)) as llm:
            outs[name] = run_chat_workload(llm, wl)
            if kv:
                assert llm.stats()["connector"]["loaded_blocks"] > 0
    assert outs["prefix_value"] == outs["none"]


@pytest.mark.parametrize("kwargs, message", [
    ({"history_factor": 0}, "history_factor=0: must be >= 1"),
    ({"prior": (0.0, 3.0)}, r"prior=\(0.0, 3.0\): give \(successes, failures\), both > 0"),
    ({"admit_threshold": 1.5}, r"admit_threshold=1.5: a reuse share in \[0, 1\]"),
])
def test_bad_parameters_are_refused_with_the_value_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrefixValueCachePolicy(8, **kwargs)


def test_the_bounds_script_orders_its_ceilings_on_the_packaged_sample(capsys):
    """examples/policy_bounds.py (the analysis behind policy_experiment.md) keeps running, and
    its ceilings keep their order: oracle admission >= LRU at every capacity."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("policy_bounds", root / "examples" / "policy_bounds.py")
    assert spec is not None and spec.loader is not None
    bounds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bounds)
    bounds.main(str(root / "kvoffload" / "examples" / "traces" / "mooncake_conversation_1500.jsonl.gz"))
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.lstrip().startswith(("1%", "2%", "5%", "10%"))]
    assert len(rows) == 4
    for row in rows:
        lru, oracle, shares = (float(row[i].rstrip("%")) for i in (2, 7, 14))
        assert oracle >= lru and shares > 0
    assert any("body / new chain" in line for line in lines)
