"""Speed work must not move a single hit: every policy's replay of a fixed workload gives the
figures the reference implementations gave (the Python ledger and the research policies as
they were before their hot loops were inlined), on the native ledger and on the Python one."""

from __future__ import annotations

import pytest
from kvoffload_policies.simulator import replay

from kvoffload.offload.native_ledger import NATIVE_POLICIES, native_available
from kvoffload.traces import synthetic_prefix_workload

#: (policy, capacity) -> (hit blocks, blocks written, blocks evicted) on synthetic_prefix_workload(3000).
PINNED = {
    ("lru", 50): (2452, 141530, 141480), ("lru", 400): (18760, 125240, 124840),
    ("arc", 50): (2444, 141507, 141457), ("arc", 400): (42123, 101877, 101477),
    ("arc_classic", 50): (2168, 141664, 141614), ("arc_classic", 400): (32656, 110933, 110533),
    ("s3fifo", 50): (2088, 141912, 141862), ("s3fifo", 400): (19416, 124488, 124088),
    ("sieve", 50): (2088, 141912, 141862), ("sieve", 400): (16632, 127136, 126736),
    ("lfu", 50): (2184, 141816, 141766), ("lfu", 400): (17792, 126152, 125752),
    ("belady", 50): (18320, 20582, 20532), ("belady", 400): (54136, 10400, 10000),
    ("prefix_value", 50): (5066, 67568, 67518), ("prefix_value", 400): (47122, 7357, 6957),
}


@pytest.fixture(scope="module")
def workload():
    return synthetic_prefix_workload(3000)


@pytest.mark.parametrize("ledger", ["native", "python"])
@pytest.mark.parametrize("policy,capacity", sorted(PINNED))
def test_replay_figures_are_pinned(policy, capacity, ledger, workload, monkeypatch):
    if ledger == "native" and (policy not in NATIVE_POLICIES or not native_available()):
        pytest.skip("the native ledger does not run this policy here")
    if ledger == "python":
        monkeypatch.setenv("KVOFFLOAD_NO_NATIVE", "1")
    r = replay(workload, capacity, policy)
    assert (r.hit_blocks, r.blocks_written, r.evicted_blocks) == PINNED[policy, capacity]
