"""vLLM's adapter takes three routes to the same answers: straight to a lone tier's C table (the
store misses shown inside the store call, a request's keys kept as runs), through the chain
(a tier with events: ``ChainWrites``, the misses shown by a call of their own), and to the
Python table. Random request interleavings must get identical answers and leave identical
policy state on all three, and, for LRU, match vLLM's own manager call for call."""

import numpy as np
import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm.v1.kv_offload.base import ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmCPUManager  # noqa: E402

from kvoffload.integrations.vllm_manager import KVOffloadManager, cpu_spec  # noqa: E402
from kvoffload.offload.cpu_tier import CPUTier  # noqa: E402
from kvoffload.offload.native_ledger import native_available  # noqa: E402
from kvoffload.offload.reuse_filter import FilterReusedOffloadingManager  # noqa: E402

KEYS = [make_offload_key(i.to_bytes(8, "big"), 0) for i in range(10)]

#: One step: (request 0-3, op, key ids, flag). op: "store" (prepare; complete when flag),
#: "load" (the leading ready run of the ids, pinned and released), "finish", "fail" (prepare,
#: then complete unsuccessfully).
def scripts(unique: bool) -> st.SearchStrategy:
    return st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["store", "load", "finish", "fail"]),
                              st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=unique), st.booleans()),
                    max_size=40)


def routes(policy: str, capacity: int) -> dict[str, KVOffloadManager]:
    out = {"chain": KVOffloadManager(lambda: CPUTier(capacity, policy, enable_events=True)),
           "python": KVOffloadManager(lambda: CPUTier(capacity, policy, native=False))}
    if native_available():
        out["table"] = KVOffloadManager(lambda: CPUTier(capacity, policy))
    return out


def drive(m, script) -> list:
    """Every answer the manager gives, in order."""
    ctxs: dict[int, ReqContext] = {}
    answers: list = []
    for rid, op, ids, flag in script:
        if rid not in ctxs:
            ctxs[rid] = ReqContext(str(rid))
            m.on_new_request(ctxs[rid])
        ctx, keys = ctxs[rid], [KEYS[i] for i in ids]
        if op in ("store", "fail"):
            out = m.prepare_store(keys, ctx)
            if out is None:
                answers.append(None)
                continue
            answers.append((list(out.keys_to_store), out.store_spec.block_ids.tolist(), sorted(out.evicted_keys)))
            if op == "fail" or flag:
                m.complete_store(out.keys_to_store, ctx, success=op == "store")
        elif op == "load":
            hits = []
            for k in keys:
                if str(m.lookup(k, ctx)) != "LookupResult.HIT":
                    break
                hits.append(k)
            answers.append(len(hits))
            if hits:
                answers.append(m.prepare_load(hits, ctx).block_ids.tolist())
                m.complete_load(hits, ctx)
        else:
            m.on_request_finished(ctx)
            del ctxs[rid]
    for ctx in ctxs.values():
        m.on_request_finished(ctx)
    answers.append(sorted(k for k in KEYS if str(m.lookup(k, ReqContext("probe"))) == "LookupResult.HIT"))
    return answers


def native_state(m: KVOffloadManager) -> tuple:
    """The C table's policy state: recency lists (slots, oldest first), ghosts, ARC's target."""
    core = m.inner.primary.index._core
    return core.order(1), core.order(2), core.ghosts(1), core.ghosts(2), core.ghost_hits(), core.target_t1_size


@pytest.mark.parametrize("policy", ["lru", "arc", "arc_classic"])
@pytest.mark.parametrize("capacity", [2, 5])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=scripts(unique=False))
def test_the_three_routes_answer_alike(policy, capacity, script):
    managers = routes(policy, capacity)
    results = {name: drive(m, script) for name, m in managers.items()}
    first = next(iter(results.values()))
    assert all(r == first for r in results.values()), results
    if "table" in managers:  # the store misses shown inside the store call, or by a call of their own
        assert native_state(managers["table"]) == native_state(managers["chain"])


@pytest.mark.parametrize("capacity", [2, 5])
@settings(max_examples=150, deadline=None)
@given(script=scripts(unique=True))  # vLLM's manager stores a key offered twice in one call twice
def test_lru_matches_vllms_manager_call_for_call(capacity, script):
    ours = drive(routes("lru", capacity)["table" if native_available() else "python"], script)
    theirs = drive(VllmCPUManager(capacity, "lru"), script)
    assert ours == theirs


def test_the_route_follows_the_chain():
    """The table route only where the chain is that table and nothing more."""
    if not native_available():
        pytest.skip("the native ledger is not built")
    plain = CPUTier(4, "arc")
    assert KVOffloadManager(lambda: plain).inner.sole_table() is plain.index
    for other in (CPUTier(4, "arc", enable_events=True), FilterReusedOffloadingManager(CPUTier(4, "arc"), 2)):
        assert KVOffloadManager(lambda o=other: o).inner.sole_table() is None

    class Logged(CPUTier):  # a write path of its own
        def prepare_store(self, block_hashes):
            return super().prepare_store(block_hashes)

    assert KVOffloadManager(lambda: Logged(4, "arc")).inner.sole_table() is None


def test_our_spec_is_the_one_vllms_constructor_makes():
    ours, theirs = cpu_spec(np.arange(3)), CPULoadStoreSpec([0, 1, 2])
    assert type(ours) is type(theirs) and vars(ours).keys() == vars(theirs).keys()
    assert ours.block_ids.dtype == theirs.block_ids.dtype and ours.block_ids.tolist() == theirs.block_ids.tolist()
    assert cpu_spec([4, 5]).block_ids.tolist() == [4, 5]
