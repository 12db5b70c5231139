"""KVOffloadManager and KVOffloadWorker against vLLM's contracts, without starting an engine."""

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    Medium,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from kvoffload.integrations.vllm_manager import KVOffloadManager  # noqa: E402
from kvoffload.offload.cpu_tier import CPUOffloadingManager  # noqa: E402
from kvoffload.offload.host_tier_chain import HostTierChain  # noqa: E402


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(8, "big"), 0)


def manager(n: int = 3, events: bool = False) -> KVOffloadManager:
    return KVOffloadManager(lambda: CPUOffloadingManager(n, "lru", enable_events=events, block_size=16))


def store(m: KVOffloadManager, ctx: ReqContext, ids: list[int]) -> list[int]:
    out = m.prepare_store([key(i) for i in ids], ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)
    return out.store_spec.block_ids.tolist()


def test_lookup_states_and_chunk_ids():
    m, ctx = manager(), ReqContext("a")
    m.on_new_request(ctx)
    out = m.prepare_store([key(1), key(2)], ctx)
    assert isinstance(out.store_spec, CPULoadStoreSpec) and out.store_spec.block_ids.tolist() == [0, 1]
    assert m.lookup(key(1), ctx) is LookupResult.HIT_PENDING
    assert m.lookup(key(9), ctx) is LookupResult.MISS
    m.complete_store(out.keys_to_store, ctx)
    assert m.lookup(key(2), ctx) is LookupResult.HIT
    spec = m.prepare_load([key(2), key(1)], ctx)
    assert spec.block_ids.tolist() == [1, 0]


def test_recency_applied_at_request_finish_in_prefix_order():
    m = manager(3)
    a = ReqContext("a")
    m.on_new_request(a)
    assert store(m, a, [1, 2, 3]) == [0, 1, 2]
    m.on_request_finished(a)
    # Request b loads the prefix 1, 3; 2 is left untouched. Nothing moves until b finishes.
    b = ReqContext("b")
    m.on_new_request(b)
    spec = m.prepare_load([key(1), key(3)], b)
    m.complete_load([key(1), key(3)], b)
    assert spec.block_ids.tolist() == [0, 2]
    m.on_request_finished(b)
    # 2 is now least recent, then 3 (the prefix tail), then 1 (the head).
    c = ReqContext("c")
    out = m.prepare_store([key(4), key(5)], c)
    assert out.evicted_keys == [key(2), key(3)]


class RecencyLog(HostTierChain):
    """The chain over a tier, logging its recency calls in order: what on_request_finished decided."""

    def __init__(self, tier):
        super().__init__(tier)
        self.calls: list[tuple[str, list[int]]] = []
        refresh = self.host.refresh  # recency without reuse goes to the host tier's index

        def logged_refresh(block_hashes):
            self.calls.append(("refresh", [int.from_bytes(k[:8], "big") for k in block_hashes]))
            refresh(block_hashes)

        self.host.refresh = logged_refresh

    def touch(self, block_hashes):
        self.calls.append(("touch", [int.from_bytes(k[:8], "big") for k in block_hashes]))
        super().touch(block_hashes)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_recency_runs_at_finish_tail_first_for_plain_and_interleaved_requests(policy):
    log = RecencyLog(CPUOffloadingManager(8, policy))
    m = KVOffloadManager(lambda: log)
    a = ReqContext("a")
    m.on_new_request(a)
    store(m, a, [1, 2])
    m.on_request_finished(a)
    assert log.calls == [("refresh", [1, 2])]  # inserted only: recency, not reuse
    b = ReqContext("b")  # the usual request: loads a prefix, stores the rest
    m.on_new_request(b)
    m.prepare_load([key(1), key(2)], b)
    m.complete_load([key(1), key(2)], b)
    store(m, b, [3, 4])
    m.on_request_finished(b)
    assert log.calls[1:] == [("refresh", [3, 4]), ("touch", [1, 2])]
    c = ReqContext("c")  # inserted, reused (offered while resident), inserted: three runs
    m.on_new_request(c)
    store(m, c, [5])
    assert m.prepare_store([key(3), key(6)], c).keys_to_store == [key(6)]
    m.on_request_finished(c)
    assert log.calls[3:] == [("refresh", [6]), ("touch", [3]), ("refresh", [5])]


def test_pinned_chunk_survives_and_store_fails_cleanly():
    m = manager(1)
    a = ReqContext("a")
    store(m, a, [1])
    m.prepare_load([key(1)], a)  # pinned by a load in flight
    assert m.prepare_store([key(2)], a) is None
    m.complete_load([key(1)], a)
    out = m.prepare_store([key(2)], a)
    assert out.evicted_keys == [key(1)] and out.keys_to_store == [key(2)]


def test_events_and_reset():
    m = manager(2, events=True)
    a = ReqContext("a")
    store(m, a, [1, 2])
    m.prepare_store([key(3)], a)
    events = list(m.take_events())
    assert [(e.keys, e.medium, e.removed) for e in events] == [
        ([key(1), key(2)], Medium.CPU, False), ([key(1)], Medium.CPU, True)]
    m.reset_cache()
    assert m.lookup(key(2), a) is LookupResult.MISS
    m.on_request_finished(a)  # state from before the reset is ignored, not applied to the new ledger
    assert store(m, ReqContext("b"), [7]) == [0]


def test_reuse_filter_and_research_policy_plug_in():
    from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager

    m = KVOffloadManager(lambda: FilterReusedOffloadingManager(CPUOffloadingManager(4, "s3fifo"), 2))
    a = ReqContext("a")
    assert m.prepare_store([key(1)], a).keys_to_store == []  # first sighting: not stored
    assert m.prepare_store([key(1)], a).keys_to_store == [key(1)]


def test_arc_insertion_is_not_reuse_even_behind_the_reuse_filter():
    from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager

    m = KVOffloadManager(lambda: FilterReusedOffloadingManager(CPUOffloadingManager(4, "arc"), 2))
    arc = m.inner.primary.index.policy
    a = ReqContext("a")
    m.prepare_store([key(1), key(2)], a)  # first sighting: filtered
    out = m.prepare_store([key(1), key(2)], a)
    m.complete_store(out.keys_to_store, a)
    m.on_request_finished(a)
    assert (arc.t1.size, arc.t2.size) == (2, 0)  # inserted, refreshed, not promoted
    b = ReqContext("b")
    m.prepare_load([key(1)], b)
    m.complete_load([key(1)], b)
    assert (arc.t1.size, arc.t2.size) == (2, 0)  # nothing moves before b finishes
    m.on_request_finished(b)
    assert (arc.t1.size, arc.t2.size) == (1, 1)  # a reuse promotes


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("capacity", [100_000, 1200, 300])
def test_same_trace_same_hits_as_vllms_manager(policy, capacity):
    """The --vs-vllm replay: kvoffload behind vLLM's contract hits what vLLM's own manager hits."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmCPUManager

    from kvoffload.bench.vllm_manager_replay import as_keys, replay_vllm_protocol
    from kvoffload.traces import synthetic_prefix_workload

    keys = as_keys(synthetic_prefix_workload(600, num_docs=200))
    _, theirs, _ = replay_vllm_protocol(VllmCPUManager(capacity, cache_policy=policy), keys)
    _, ours, _ = replay_vllm_protocol(KVOffloadManager(lambda: CPUOffloadingManager(capacity, policy)), keys)
    assert theirs > 0
    if policy == "lru" or capacity == 100_000:
        assert ours == theirs  # same recency rules (request-scoped, prefix head most recent)
    else:  # ARC under heavy churn: tie-breaks between T1/T2 scans differ slightly
        assert abs(ours - theirs) <= 0.05 * theirs


def test_kv_cache_group_kinds_we_cannot_offload_are_refused_by_name():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    from kvoffload.integrations.vllm import _group_window

    assert _group_window(FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.float32)) is None
    assert _group_window(SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.float32,
                                           sliding_window=64)) == 64
    mamba = MambaSpec.__new__(MambaSpec)  # its fields vary by version: the kind is what is checked
    with pytest.raises(ValueError, match=r"KV-cache group of kind MambaSpec is not supported"):
        _group_window(mamba)


def test_prefix_value_policy_runs_behind_the_offloading_spec():
    m = KVOffloadManager(lambda: CPUOffloadingManager(2, "prefix_value"))
    slots = []
    for i, rid in enumerate("abc"):
        ctx = ReqContext(rid)
        slots += store(m, ctx, [i])
        m.on_request_finished(ctx)
    assert slots[:2] == [0, 1] and slots[2] in (0, 1)  # the third block took an evicted block's slot
    assert m.lookup(key(2), ReqContext("d")) is LookupResult.HIT
    assert [m.lookup(key(i), ReqContext("d")) for i in (0, 1)].count(LookupResult.HIT) == 1


def test_spec_route_gives_a_requests_hint_with_its_keys_at_its_finish():
    from kvoffload_policies.hinted import HintedCachePolicy

    policy = HintedCachePolicy(4)
    m = KVOffloadManager(lambda: CPUOffloadingManager(4, cache_policy=policy, native=False))
    a = ReqContext("a", kv_transfer_params={"kvoffload": {"session": "agent", "expect_return_s": 3}})
    b = ReqContext("b", kv_transfer_params={"kvoffload": {"session": "other"}})  # a turn ended: unknown
    def names() -> set:  # sessions by the client's name (the route scopes them to a tenant)
        return {k[1] for k in policy.sessions}

    for ctx, ids, seen in ((a, [1, 2], set()), (b, [3, 4], {"agent"})):
        m.on_new_request(ctx)
        store(m, ctx, ids)
        assert names() == seen  # hinted at the finish, not before
        m.on_request_finished(ctx)
    by_name = {k[1]: s for k, s in policy.sessions.items()}
    agent, other = by_name["agent"], by_name["other"]
    assert (agent.chain, other.chain, agent.expect, other.expect) == ([key(1), key(2)], [key(3), key(4)], 3.0, 100.0)
    # The tier is full: a new session evicts the one back last, deepest block first.
    c = ReqContext("c", kv_transfer_params={"kvoffload": {"session": "new", "expect_return_s": 1}})
    m.on_new_request(c)
    out = m.prepare_store([key(5)], c)
    assert out is not None and out.evicted_keys == [key(4)]
    # Requests without a kvoffload hint (another connector's params, or none) hint nothing.
    for ctx in (ReqContext("p", kv_transfer_params={"other_connector": 1}), ReqContext("q")):
        m.on_new_request(ctx)
        m.prepare_load([key(1)], ctx)
        m.complete_load([key(1)], ctx)
        m.on_request_finished(ctx)
    assert names() == {"agent", "other"}


def test_spec_route_scopes_sessions_by_the_operators_tenant_keys_and_caps_priority():
    """vLLM's spec route sees no cache salt: the operator's ``hints.tenant_keys`` (entries its
    gateway sets) keep two tenants' sessions of one name apart; a client's priority stops at
    ``hints.max_priority``."""
    from kvoffload_policies.hinted import HintedCachePolicy

    from kvoffload.config import HintsConfig

    policy = HintedCachePolicy(8)
    m = KVOffloadManager(lambda: CPUOffloadingManager(8, cache_policy=policy, native=False),
                         HintsConfig(max_priority=2, tenant_keys=("tenant",)))
    for rid, tenant, ids in (("a", "t1", [1, 2]), ("b", "t2", [3, 4]), ("c", "t1", [5])):
        ctx = ReqContext(rid, kv_transfer_params={"tenant": tenant,
                                                  "kvoffload": {"session": "chat", "priority": 50}})
        m.on_new_request(ctx)
        store(m, ctx, ids)
        m.on_request_finished(ctx)
    sessions = list(policy.sessions.values())
    assert len(sessions) == 2 and {s.name[1] for s in sessions} == {"chat"}
    assert sorted(s.blocks for s in sessions) == [2, 3]  # t1's two requests share a session, t2 its own
    assert all(s.priority == 2 for s in sessions)
