"""Tenants stay apart in the hinted policy whatever they send: a tenant value that is not a
short scalar names its own tenant (it used to count by its type alone, so ``{"org": "acme"}``
and ``{"org": "globex"}`` were one tenant and shared sessions), and a hint may raise the
standing of a block another tenant's session holds, never lower it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvoffload_policies.hinted import HintedCachePolicy

from kvoffload.offload import CPUOffloadingManager
from kvoffload.offload.hints import RequestHint, tenant_digest

SYSTEM = ["sys-0", "sys-1", "sys-2", "sys-3"]


@pytest.mark.parametrize(("a", "b"), [
    ({"org": "acme"}, {"org": "globex"}),
    (["acme", "eu"], ["globex", "us"]),
    (2**127 + 1, 2**127 + 2),
    (1.5, 2.5),
    ({"org": {"team": [1, 2]}}, {"org": {"team": [1, 3]}}),
])
def test_tenant_values_of_any_type_stay_apart(a, b):
    assert tenant_digest(["salt", a]) != tenant_digest(["salt", b])
    assert tenant_digest(["salt", a]) == tenant_digest(["salt", a])


def test_a_tenant_mapping_is_one_tenant_whatever_its_key_order():
    assert tenant_digest([{"org": "acme", "region": "eu"}]) == tenant_digest([{"region": "eu", "org": "acme"}])
    assert tenant_digest(["1"]) != tenant_digest([1]) != tenant_digest([1.0]) != tenant_digest([True])


def test_an_oversized_tenant_value_is_a_tenant_of_its_own():
    huge = ["x" * 100] * 100
    assert tenant_digest([huge]) != tenant_digest([huge])  # met by no other request, itself included


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(_JSON, _JSON)
def test_equal_digests_only_for_equal_values(a, b):
    if a == b and type(a) is type(b) and repr(a) == repr(b):
        assert tenant_digest([a]) == tenant_digest([a])
    elif repr(a) != repr(b):
        assert tenant_digest([a]) != tenant_digest([b])


def _tier(capacity: int) -> tuple[CPUOffloadingManager, HintedCachePolicy]:
    policy = HintedCachePolicy(capacity)
    return CPUOffloadingManager(capacity, cache_policy=policy, native=False), policy


def _request(mgr: CPUOffloadingManager, hashes: list, hint: RequestHint, tenant: bytes, now: float) -> None:
    mgr.lookup(hashes)
    mgr.touch(hashes)
    mgr.index.hint(hashes, hint.at(now, tenant))
    out = mgr.prepare_store(hashes)
    if out is not None:
        mgr.complete_store(out.block_hashes_to_store)


def _scenario(attack: list[tuple[RequestHint, list[str]]]) -> set[str]:
    """Tenant B's system prompt (hinted back in 5 s), a third party's one-off blocks (back in a
    day), tenant A's requests ``attack``, then an eviction of four blocks: what it takes."""
    tenant_a, tenant_b, tenant_c = tenant_digest(["a"]), tenant_digest(["b"]), tenant_digest(["c"])
    capacity = 10
    mgr, _ = _tier(capacity)
    _request(mgr, [*SYSTEM, "b-0"], RequestHint("b-agent", expect_return_s=5.0), tenant_b, 0.0)
    _request(mgr, ["c-0", "c-1", "c-2", "c-3"], RequestHint("c-batch", expect_return_s=86400.0), tenant_c, 1.0)
    for k, (hint, tail) in enumerate(attack):
        _request(mgr, [*SYSTEM, *tail], hint, tenant_a, 2.0 + k)
    held = sum(1 for h in [*SYSTEM, "b-0", "c-0", "c-1", "c-2", "c-3", "a-0"] if mgr.lookup([h]))
    out = mgr.prepare_store([f"new-{i}" for i in range(capacity - held + 4)])
    assert out is not None
    evicted = set(out.block_hashes_evicted)
    assert len(evicted) == 4
    return evicted


def test_a_negative_priority_does_not_reprice_another_tenants_blocks():
    """The report: after tenant A sent B's prefix with priority -1000 and a day's return, the
    eviction took exactly B's four system-prompt blocks."""
    assert _scenario([]) & set(SYSTEM) == set()
    evil = RequestHint("a-evil", expect_return_s=86400.0, priority=-1000)
    assert _scenario([(evil, ["a-0"])]) & set(SYSTEM) == set()


def test_a_tenant_cannot_adopt_blocks_with_a_good_hint_then_lower_them():
    good = RequestHint("a-evil", expect_return_s=1.0)
    evil = RequestHint("a-evil", expect_return_s=86400.0, priority=-1000)
    assert _scenario([(good, ["a-0"]), (evil, ["a-0"])]) & set(SYSTEM) == set()
    # ... nor by dropping them from its next request (its dropped blocks leave first)
    elsewhere = RequestHint("a-evil", expect_return_s=86400.0, priority=-1000)
    mgr_evicted = _scenario([(good, ["a-0"]), (elsewhere, [])])
    assert mgr_evicted & set(SYSTEM) == set()


def test_a_better_hint_of_another_tenant_still_raises_a_shared_block():
    """Raising is allowed: A back in 1 s with priority 2 keeps the shared blocks past B's
    return, and A's dropping them later hands them back to B's standing, not below it."""
    tenant_a, tenant_b = tenant_digest(["a"]), tenant_digest(["b"])
    mgr, policy = _tier(12)
    _request(mgr, [*SYSTEM, "b-0"], RequestHint("b-agent", expect_return_s=5.0), tenant_b, 0.0)
    _request(mgr, [*SYSTEM, "a-0"], RequestHint("a-agent", expect_return_s=1.0, priority=2), tenant_a, 1.0)
    a_session = next(s for s in policy.sessions.values() if s.tenant == tenant_a)
    b_session = next(s for s in policy.sessions.values() if s.tenant == tenant_b)
    assert all(policy.owner[h] is a_session for h in SYSTEM)
    _request(mgr, ["a-9"], RequestHint("a-agent", expect_return_s=86400.0, priority=-5), tenant_a, 2.0)
    assert all(policy.owner[h] is b_session for h in SYSTEM)
    assert not policy.claims.displaced and not a_session.adopted


def test_a_relay_through_a_third_tenant_does_not_hand_b_s_blocks_to_a():
    """Round 7: A takes B's system prompt with a good hint; D sends the same public prefix
    'back in 0.1 s' and moves on; the blocks went back to A as A's own, and A's -1000 then
    evicted B's system prompt first (['a-0', 'sys-1', 'sys-2', 'sys-3'])."""
    good = RequestHint("a-evil", expect_return_s=1.0)
    relay = RequestHint("d-relay", expect_return_s=0.1)
    moved_on = RequestHint("d-relay", expect_return_s=0.1)
    evil = RequestHint("a-evil", expect_return_s=86400.0, priority=-1000)
    steps = [("a", good, ["a-0"]), ("d", relay, []), ("d", moved_on, ["elsewhere"]), ("a", evil, ["a-0"])]
    assert _scenario_of(steps) & set(SYSTEM) == set()


def _scenario_of(steps: list[tuple[str, RequestHint, list[str]]], touch_system: bool = True) -> set[str]:
    """B's system prompt (back in 5 s), a third party's one-off blocks (back in a day), other
    tenants' requests ``steps`` (tenant, hint, their own tail after B's prefix, or 'elsewhere':
    a request of their own), then an eviction of four blocks: what it takes. Without
    ``touch_system`` the same requests leave B's prefix out (what B's blocks face anyway)."""
    capacity = 32
    mgr, _ = _tier(capacity)
    _request(mgr, [*SYSTEM, "b-0"], RequestHint("b-agent", expect_return_s=5.0), tenant_digest(["b"]), 0.0)
    _request(mgr, ["c-0", "c-1", "c-2", "c-3"], RequestHint("c-batch", expect_return_s=86400.0),
             tenant_digest(["c"]), 1.0)
    seen = [*SYSTEM, "b-0", "c-0", "c-1", "c-2", "c-3"]
    for k, (tenant, hint, tail) in enumerate(steps):
        prefix = SYSTEM if touch_system else [f"{tenant}-lead"]
        hashes = [f"{tenant}-{hint.session}-{k}"] if tail == ["elsewhere"] else [*prefix, *tail]
        seen += hashes
        _request(mgr, hashes, hint, tenant_digest([tenant]), 2.0 + 0.1 * k)
    held = sum(1 for h in dict.fromkeys(seen) if mgr.lookup([h]))
    out = mgr.prepare_store([f"new-{i}" for i in range(capacity - held + 4)])
    assert out is not None and len(out.block_hashes_evicted) == 4
    return set(out.block_hashes_evicted)


@settings(max_examples=200, deadline=None)  # 3,000 passed once by hand
@given(st.lists(st.tuples(st.sampled_from(["a", "d"]), st.sampled_from(["s1", "s2"]),
                          st.sampled_from([0.1, 1.0, 86400.0]), st.sampled_from([-1000, 0, 2]),
                          st.sampled_from([[], ["own"], ["elsewhere"]])), max_size=6))
def test_no_sequence_of_other_tenants_hints_lowers_b_s_blocks(steps):
    """Whatever other tenants send about B's prefix, in any order, from any of their sessions:
    B's system prompt leaves no sooner than if they had never sent it (their own blocks may
    rightly outrank it; their hints about it may raise it, never lower it)."""
    hinted = [(t, RequestHint(f"{t}-{name}", expect_return_s=ret, priority=prio),
               [f"{t}-own"] if tail == ["own"] else tail) for t, name, ret, prio, tail in steps]
    assert _scenario_of(hinted) & set(SYSTEM) <= _scenario_of(hinted, touch_system=False) & set(SYSTEM)
