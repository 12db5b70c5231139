"""The adapter against vLLM 0.32's own CPUOffloadingManager on the scenarios where ARC used to
differ: the same calls on both, and vLLM's values as the expectation."""

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmCPUManager  # noqa: E402

from kvoffload.integrations.vllm_manager import KVOffloadManager  # noqa: E402
from kvoffload.offload.cpu_tier import CPUOffloadingManager  # noqa: E402
from kvoffload.offload.empty_chain import EmptyTierChain  # noqa: E402
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager  # noqa: E402


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def pair(capacity: int, threshold: int = 1, tracker: int = 64_000):
    def build():
        mgr = CPUOffloadingManager(capacity, "arc")
        return FilterReusedOffloadingManager(mgr, threshold, tracker) if threshold >= 2 else mgr

    ours = KVOffloadManager(build)
    theirs = VllmCPUManager(capacity, "arc", store_threshold=threshold, max_tracker_size=tracker)
    return ours, theirs


def arc_state(m) -> tuple[float, int, int]:
    if isinstance(m, VllmCPUManager):
        p = m._policy
        return p.target_t1_size, len(p.t1), len(p.t2)
    p = m.inner.primary.index.policy  # the chain's host tier (the reuse filter is a chain too)
    return p.target_t1_size, p.t1.size, p.t2.size


def run(m, steps):
    """Each step: (request, op, key ids); a request starts on its first step."""
    ctxs: dict[str, ReqContext] = {}
    results = []
    for rid, op, ids in steps:
        if rid not in ctxs:
            ctxs[rid] = ReqContext(rid)
            m.on_new_request(ctxs[rid])
        ctx, keys = ctxs[rid], [key(i) for i in ids]
        if op == "store":  # prepare and complete
            out = m.prepare_store(keys, ctx)
            results.append(None if out is None else len(out.keys_to_store))
            if out is not None:
                m.complete_store(out.keys_to_store, ctx)
        elif op == "offer":  # prepare only (the result is all that matters)
            out = m.prepare_store(keys, ctx)
            results.append(None if out is None else len(out.keys_to_store))
        elif op == "pin":
            m.prepare_load(keys, ctx)
        elif op == "finish":
            m.on_request_finished(ctx)
    return results


def test_arc_adapts_once_per_request_not_once_per_retry():
    steps = [("a", "store", [1, 2]), ("a", "finish", []), ("b", "store", [3]), ("b", "finish", []),
             ("p", "pin", [1, 3])] + [("r", "offer", [2])] * 5  # 2 (a's tail) is a B1 ghost; retries fail
    ours, theirs = pair(2)
    assert run(ours, steps) == run(theirs, steps) == [2, 1] + [None] * 5
    assert arc_state(ours) == arc_state(theirs) == (1.0, 2, 0)


def test_keys_the_reuse_filter_rejects_never_reach_arc():
    steps = [("a", "store", [1]), ("a", "store", [1]), ("a", "finish", []),
             ("b", "store", [2]), ("b", "store", [2]), ("b", "finish", []),
             ("c", "store", [3]), ("c", "store", [3]), ("c", "finish", []),  # 1 leaves for B1 and the tracker
             ("d", "store", [1])]  # a ghost, rejected by the filter (first sighting again)
    ours, theirs = pair(2, threshold=2, tracker=2)
    assert run(ours, steps) == run(theirs, steps) == [0, 1, 0, 1, 0, 1, 0]
    assert arc_state(ours) == arc_state(theirs)
    assert arc_state(theirs)[0] == 0.0


def test_a_failed_store_still_credits_the_resident_chunks_it_offered():
    steps = [("a", "store", [1, 2]), ("a", "finish", []), ("p", "pin", [1, 2]),
             ("b", "offer", [1, 3]), ("b", "finish", [])]  # 3 finds no room: None, but 1 was reused
    ours, theirs = pair(2)
    assert run(ours, steps) == run(theirs, steps) == [2, None]
    assert arc_state(ours) == arc_state(theirs) == (0.0, 1, 1)


def test_resident_offers_are_not_counted_as_skipped_by_the_filter():
    ours, theirs = pair(4, threshold=2)
    steps = [("a", "store", [1]), ("a", "store", [1]), ("b", "offer", [1, 2])]  # 1 resident, 2 new
    run(ours, steps)
    run(theirs, steps)
    assert ours.inner.num_filtered == theirs.stores_skipped_in_current_batch == 2  # a's first offer, then 2


def test_zero_blocks_is_an_empty_cache_as_in_vllm():
    ours = KVOffloadManager(lambda: EmptyTierChain(16))
    theirs = VllmCPUManager(0, "lru")
    for m in (ours, theirs):
        ctx = ReqContext("a")
        m.on_new_request(ctx)
        assert m.lookup(key(1), ctx) is LookupResult.MISS
        assert m.prepare_store([key(1)], ctx) is None
        assert m.prepare_store([], ctx).keys_to_store == []


@pytest.mark.parametrize("build", [lambda: CPUOffloadingManager(4, "arc"), lambda: EmptyTierChain(16)],
                         ids=["cpu", "empty"])
def test_an_empty_load_is_a_no_op_as_in_vllm(build):
    """vLLM's own ARC tests load no keys: an empty spec, and completing it changes nothing."""
    ours, theirs = KVOffloadManager(build), VllmCPUManager(4, "arc")
    for m in (ours, theirs):
        ctx = ReqContext("a")
        m.on_new_request(ctx)
        assert list(m.prepare_load([], ctx).block_ids) == []
        m.complete_load([], ctx)
        assert m.lookup(key(1), ctx) is LookupResult.MISS
