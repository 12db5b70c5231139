"""hinted: sessions ordered by when their callers expect them back; leases bounded and expiring;
without hints exactly its inner policy; the replay's hint derivation reads no later request."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kvoffload_policies.hinted import HintedCachePolicy
from kvoffload_policies.session_hints import NEVER_S, TOOL_RETURN_S, honest_hints, oracle_hints
from kvoffload_policies.simulator import replay

from kvoffload.offload import CPUOffloadingManager
from kvoffload.offload.hints import BlockHint, RequestHint, parse_hint
from kvoffload.traces import TraceRequest


def tier(capacity: int, **kw) -> CPUOffloadingManager:
    return CPUOffloadingManager(capacity, cache_policy=HintedCachePolicy(capacity, **kw), native=False)


def store(mgr: CPUOffloadingManager, hashes: list, hint: RequestHint | None, now: float,
          tenant: bytes | None = None) -> list:
    """One request as the connector issues it: touch, hint, store what is absent; returns what
    was evicted (None: nothing could be stored)."""
    mgr.touch(hashes)
    if hint is not None:
        mgr.index.hint(hashes, hint.at(now, tenant))
    out = mgr.prepare_store(hashes)
    if out is None:
        return None
    mgr.complete_store(out.block_hashes_to_store)
    return list(out.block_hashes_evicted)


def held(mgr: CPUOffloadingManager) -> set:
    return set(mgr.index.debug_snapshot().index)


TOOL = RequestHint("a", expect_return_s=10)


def test_a_session_that_ended_its_turn_leaves_before_one_due_back():
    mgr = tier(6)
    store(mgr, ["a1", "a2"], RequestHint("a", 10), now=0)  # a tool call: back in 10 s
    store(mgr, ["b1", "b2"], RequestHint("b"), now=1)  # a turn ended: unknown (100 s)
    store(mgr, ["c1", "c2"], RequestHint("c", 5), now=2)
    evicted = store(mgr, ["d1", "d2"], RequestHint("d", 3), now=3)
    assert evicted == ["b2", "b1"]  # b's deepest block first
    assert held(mgr) == {"a1", "a2", "c1", "c2", "d1", "d2"}


def test_among_sessions_due_back_the_latest_leaves_first_and_a_late_one_before_it():
    mgr = tier(4)
    store(mgr, ["a1", "a2"], RequestHint("a", 50), now=0)  # due at 50
    store(mgr, ["b1", "b2"], RequestHint("b", 20), now=0)  # due at 20
    assert store(mgr, ["c1"], RequestHint("c", 5), now=1) == ["a2"]  # a is due last
    # At t=200 b is 180 s late (predicted 200 + 0.3 * 180 = 254), c 194 s late (258): c leaves.
    assert store(mgr, ["d1"], RequestHint("d", 5), now=200) == ["c1"]


def test_a_request_whose_session_is_due_back_last_evicts_nobody():
    mgr = tier(4)
    store(mgr, ["a1", "a2"], RequestHint("a", 10), now=0)
    store(mgr, ["b1", "b2"], RequestHint("b", 10), now=1)
    # c is due at 22, after a (10) and b (11): its blocks are not stored (LRU would evict a).
    assert store(mgr, ["c1", "c2"], RequestHint("c", 20), now=2) == []
    assert held(mgr) == {"a1", "a2", "b1", "b2"}
    # A session due sooner than b takes b's deepest block.
    assert store(mgr, ["d1"], RequestHint("d", 1), now=3) == ["b2"]


def test_blocks_of_an_earlier_context_leave_before_the_current_chain():
    mgr = tier(5)
    store(mgr, ["x1", "x2", "x3"], RequestHint("a", 10), now=0)
    store(mgr, ["y1", "y2"], RequestHint("a", 10), now=1)  # a rewrote its context: x* are dead
    assert store(mgr, ["z1", "z2"], RequestHint("z", 1), now=2) == ["x3", "x2"]


def test_lower_priority_leaves_first_whatever_its_prediction():
    mgr = tier(4)
    store(mgr, ["a1", "a2"], RequestHint("a", 1, priority=-1), now=0)
    store(mgr, ["b1", "b2"], RequestHint("b", 90, priority=0), now=0)
    assert store(mgr, ["c1", "c2"], RequestHint("c", 5, priority=0), now=1) == ["a2", "a1"]


def test_a_lease_keeps_blocks_until_it_ends():
    mgr = tier(4, lease_share=0.5)
    store(mgr, ["a1", "a2"], RequestHint("a", lease_s=60), now=0)  # unknown return, leased
    store(mgr, ["b1", "b2"], RequestHint("b", 10), now=1)
    assert store(mgr, ["c1", "c2"], RequestHint("c", 1), now=2) == ["b2", "b1"]  # a's lease holds
    assert store(mgr, ["d1", "d2"], RequestHint("d", 1), now=61) == ["a2", "a1"]  # expired


def test_leases_beyond_their_share_of_the_tier_are_not_honoured():
    mgr = tier(4, lease_share=0.25)  # one block may be leased
    store(mgr, ["a1", "a2"], RequestHint("a", lease_s=60), now=0)
    store(mgr, ["b1", "b2"], RequestHint("b", 10), now=1)
    assert store(mgr, ["c1", "c2"], RequestHint("c", 1), now=2) == ["a2", "a1"]


def test_without_hints_it_is_its_inner_policy():
    rng = random.Random(3)
    requests = []
    for _ in range(400):
        base = rng.randrange(30) * 100
        requests.append([base + i for i in range(rng.randrange(1, 12))])
    for inner in ("prefix_value", "s3fifo"):
        for cap in (10, 40, 120):
            a = replay(requests, cap, inner, native=False)
            b = replay(requests, cap, HintedCachePolicy(cap, inner=inner), label="hinted")
            assert (a.hit_blocks, a.blocks_written, a.evicted_blocks) == (b.hit_blocks, b.blocks_written,
                                                                          b.evicted_blocks)
    with pytest.raises(ValueError, match="inner='lru' keeps its state in the tier's ledger"):
        HintedCachePolicy(8, inner="lru")


def _many_sessions(n: int, seed: int) -> tuple[list[list[int]], list]:
    """Requests of ``n`` sessions, most seen once, some coming back, hinted on a clock."""
    rng = random.Random(seed)
    blocks, hints = [], []
    for t in range(n):
        sid = rng.randrange(n // 4) if rng.random() < 0.3 else n + t  # a returning session, else a new one
        blocks.append([sid * 100 + i for i in range(rng.randrange(1, 6))])
        hint = RequestHint(f"s{sid}", rng.choice([None, 2.0, 30.0]), rng.choice([0, 0, 1]),
                           rng.choice([None, None, 5.0]))
        hints.append(hint.at(float(t)))
    return blocks, hints


def test_sessions_holding_nothing_are_forgotten_without_changing_a_decision():
    blocks, hints = _many_sessions(3000, seed=5)
    results, sizes = [], []
    for slack in (0, 10**9):  # sweep at every chance / never
        policy = HintedCachePolicy(40)
        policy.sweep_slack = policy._sweep_at = slack
        r = replay(blocks, 40, policy, hints=hints, label="hinted")
        results.append((r.hit_blocks, r.blocks_written, r.evicted_blocks))
        sizes.append(len(policy.sessions))
        if slack == 0:
            policy._sweep()
            awaited = {id(x) for x in policy.pending.values()}
            # What is left holds a block, awaits a store or holds a live lease; so do the heaps.
            assert all(x.blocks > 0 or id(x) in awaited or policy.shares.holds_lease(x, policy.now) for x in policy.sessions.values())
            heaps = [e for o in policy.orders.values() for h in (o.sched, o.trans, o.overdue) for e in h]
            assert all(policy.sessions[name].version == v for _, v, name in heaps)
    assert results[0] == results[1] and results[0][0] > 0
    swept, kept = sizes
    assert kept > 2000 and swept < 400  # never swept: every session ever hinted


def test_hints_on_a_loop_larger_than_the_tier_keep_the_sessions_already_held():
    """Five agents cycling through tool calls, each with a 4-block context, over 12 slots: LRU
    evicts the next agent due every time (no hits after the first round); with honest hints
    (back within the tool step) the first three keep their place."""
    requests = []
    t = 0.0
    for _ in range(20):
        for s in range(5):
            requests.append(TraceRequest(t, f"s{s}", "tool_use", [s * 10 + i for i in range(4)]))
            t += 1.0
    blocks = [r.blocks for r in requests]
    assert replay(blocks, 12, "lru").hit_blocks == 0
    hinted = replay(blocks, 12, "hinted", hints=honest_hints(requests))
    assert hinted.hit_blocks == 19 * 3 * 4  # three sessions hit fully from the second round on


def test_honest_hints_read_no_later_request():
    rng = random.Random(0)
    requests = [TraceRequest(float(i), f"s{rng.randrange(4)}", rng.choice(["tool_use", "end_turn", ""]),
                             [rng.randrange(50) for _ in range(3)]) for i in range(60)]
    base = honest_hints(requests)
    for cut in (1, 17, 42):
        future = [TraceRequest(r.t * 7 + 1000, f"x{rng.randrange(9)}", rng.choice(["tool_use", "end_turn"]),
                               [rng.randrange(999)]) for r in requests[cut:]]
        assert honest_hints(requests[:cut] + future)[:cut] == base[:cut]
    assert base[0] == BlockHint(requests[0].session,
                                requests[0].t + TOOL_RETURN_S if requests[0].stop != "end_turn" else None,
                                0, None, requests[0].t)
    # The oracle is the opposite: it reads the next request of the same session.
    oracle = oracle_hints(requests)
    nxt = next(r.t for r in requests[1:] if r.session == requests[0].session)
    assert oracle[0].return_at == nxt
    last = max(i for i, r in enumerate(requests) if r.session == requests[0].session)
    assert oracle[last].return_at == requests[last].t + NEVER_S


@pytest.mark.parametrize("raw, expected", [
    ({"session": "chat-1", "expect_return_s": 5, "priority": 2, "lease_s": 30}, RequestHint("chat-1", 5.0, 2, 30.0)),
    ({"session": 17}, RequestHint("17")),
    ({}, None),
    (None, None),
])
def test_hints_parse(raw, expected):
    assert parse_hint(raw) == expected


@pytest.mark.parametrize("raw, kept, message", [
    ({"session": "s", "expect_return_s": -1}, RequestHint("s"), "expect_return_s=-1"),
    ({"session": "s", "expect_return_s": float("nan")}, RequestHint("s"), "expect_return_s=nan"),
    ({"session": "s", "lease_s": "forever"}, RequestHint("s"), "lease_s='forever'"),
    ({"session": "s", "priority": 1.5}, RequestHint("s"), "priority=1.5"),
    ({"session": "x" * 300}, None, "give a string of 1-256 characters"),
    ({"session": "s", "ttl": 3}, RequestHint("s"), "hint field 'ttl' is unknown"),
    ("session=s", None, "give a mapping"),
])
def test_a_bad_hint_field_is_dropped_with_one_warning(raw, kept, message, caplog, monkeypatch):
    from kvoffload.offload import hints

    monkeypatch.setattr(hints, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        assert parse_hint(raw) == kept
        parse_hint(raw)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and message in lines[0] and "the request served as usual" in lines[0], lines


class HintedMachine(RuleBasedStateMachine):
    """Stores, loads and hints at random, the clock moving on: the ledger stays consistent, no
    pinned or offered block is evicted, and a lease is honoured while it lasts and leased
    blocks are within their share."""

    CAP = 8

    def __init__(self):
        super().__init__()
        self.policy = HintedCachePolicy(self.CAP, lease_share=0.25)
        self.mgr = CPUOffloadingManager(self.CAP, cache_policy=self.policy, native=False)
        self.now = 0.0
        self.loads: list[list[int]] = []
        self.leases: dict[str, float] = {}

    @rule(session=st.sampled_from("abcd"), start=st.integers(0, 3), n=st.integers(1, 4),
          expect=st.one_of(st.none(), st.floats(0, 50)), lease=st.one_of(st.none(), st.floats(1, 40)),
          priority=st.integers(-1, 1), advance=st.floats(0, 30))
    def request(self, session, start, n, expect, lease, priority, advance):
        self.now += advance
        hashes = [ord(session) * 100 + i for i in range(start, start + n)]
        pinned = {h for load in self.loads for h in load}
        hint = RequestHint(session, expect, priority, lease)
        before = held(self.mgr)
        if lease is not None:  # this request's own hint counts when its store evicts
            self.leases[session] = self.now + lease
        else:
            self.leases.pop(session, None)  # a session's latest hint says whether it holds a lease
        leased_before = self._honoured_leases()
        evicted = store(self.mgr, hashes, hint, self.now)
        if evicted is None:
            assert held(self.mgr) == before
            return
        assert not set(evicted) & (pinned | set(hashes))
        for name, blocks in leased_before.items():
            assert not set(evicted) & blocks, f"leased blocks of {name} evicted"

    def _honoured_leases(self) -> dict[str, set[int]]:
        """A lease covers every block of its session, while all leased blocks fit the share."""
        live = {s: {h for h in held(self.mgr) if h // 100 == ord(s)} for s, until in self.leases.items()
                if until > self.now}
        if sum(len(b) for b in live.values()) > int(0.25 * self.CAP):
            return {}
        return live

    @rule(tenant=st.sampled_from([b"x", b"y", b"z"]), session=st.sampled_from("ab"), n=st.integers(1, 4),
          expect=st.one_of(st.none(), st.floats(0, 50)), priority=st.integers(-3, 1), advance=st.floats(0, 30))
    def tenant_request(self, tenant, session, n, expect, priority, advance):
        """Tenants' sessions on one shared prefix (hashes 1-4, what every tenant's requests
        begin with) and a tail of their own."""
        self.now += advance
        hashes = [*range(1, n + 1), ord(session) * 1000 + tenant[0]]
        pinned = {h for load in self.loads for h in load}  # (another session than the tenantless one of its name)
        evicted = store(self.mgr, hashes, RequestHint(session, expect, priority), self.now, tenant)
        if evicted is not None:
            assert not set(evicted) & (pinned | set(hashes))

    @rule(data=st.data())
    def load(self, data):
        ready = sorted(h for h in held(self.mgr) if self.mgr.index.is_ready(h))
        if ready:
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=2, unique=True))
            self.mgr.prepare_load(chosen)
            self.loads.append(chosen)

    @rule()
    @precondition(lambda self: self.loads)
    def complete_load(self):
        self.mgr.complete_load(self.loads.pop(0))

    @invariant()
    def consistent(self):
        index = self.mgr.index.debug_snapshot().index
        assert self.mgr.num_free_blocks + len(index) == self.CAP
        for h in index:
            assert self.policy.get(h) is not None
        assert len(self.policy.status) + self.policy._inner_n == len(index)
        assert all(s.blocks == sum(1 for o in self.policy.owner.values() if o is s)
                   for s in self.policy.sessions.values())
        # A block taken from another tenant's session is claimed by exactly its holder.
        adopted = [h for s in self.policy.sessions.values() for h in s.adopted]
        assert len(adopted) == len(set(adopted)) and set(adopted) == set(self.policy.claims.displaced)
        assert all(self.policy.owner.get(h) is not None and h in self.policy.owner[h].adopted
                   for h in self.policy.claims.displaced)
        assert set(self.policy.claims.displaced) <= set(index)


HintedMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                           suppress_health_check=list(HealthCheck))
TestHintedMachine = HintedMachine.TestCase
