"""``allocate(hashes, shown)``: the store misses shown to the policy inside the store call (vLLM's
route) must leave every table exactly as ``store_miss`` then ``allocate`` do, call for call:
the C table against itself the two ways, and against the Python table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.offload.ledger_tier import make_slot_table
from kvoffload.offload.native_ledger import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the native ledger is not built")

POLICIES = ["lru", "arc", "arc_classic", "prefix_value"]

#: (request 0-2, hashes offered (repeats allowed), complete after, complete successfully);
#: "finish" ends a request (its shown set is forgotten), "recency" refreshes then touches.
ops = st.lists(st.one_of(
    st.tuples(st.just("store"), st.integers(0, 2), st.lists(st.integers(0, 11), min_size=1, max_size=6),
              st.booleans(), st.booleans()),
    st.tuples(st.just("finish"), st.integers(0, 2)),
    st.tuples(st.just("recency"), st.lists(st.integers(0, 11), max_size=4))), max_size=40)


def state(table) -> tuple:
    core = table._core
    return (core.items(), core.order(1), core.order(2), core.ghosts(1), core.ghosts(2), core.ghost_hits(),
            core.target_t1_size)


def run_both(policy: str, capacity: int, script, fused_as_list: bool) -> None:
    fused = make_slot_table(capacity, policy, "CPU", native=True)
    apart = make_slot_table(capacity, policy, "CPU", native=True)
    python = make_slot_table(capacity, policy, "CPU", native=False) if policy != "prefix_value" else None
    shown: dict[int, list | set] = {}
    shown_apart: dict[int, set] = {}
    shown_python: dict[int, set] = {}
    for op in script:
        if op[0] == "store":
            _, rid, hashes, complete, success = op
            mine = shown.setdefault(rid, [] if fused_as_list else set())
            if isinstance(mine, list) and mine:  # the adapter's rule: a list for the first store only
                mine = shown[rid] = set(mine)
            a = fused.allocate(hashes, mine)
            seen = shown_apart.setdefault(rid, set())
            seen.update(apart.store_miss([h for h in hashes if h not in seen]))
            b = apart.allocate(hashes)
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.new, a.slots.tolist(), a.evicted, a.evicted_slots) == \
                       (b.new, b.slots.tolist(), b.evicted, b.evicted_slots)
            assert set(mine) == seen
            if python is not None:
                c = python.allocate(hashes, shown_python.setdefault(rid, set()))
                assert (c is None) == (a is None)
                if a is not None and c is not None:
                    assert (c.new, list(c.slots), c.evicted) == (a.new, a.slots.tolist(), a.evicted)
            if a is not None and complete:
                for t in (fused, apart, python):
                    if t is not None:
                        t.complete(a.new, success)
        elif op[0] == "finish":
            for d in (shown, shown_apart, shown_python):
                d.pop(op[1], None)
        else:
            for t in (fused, apart, python):
                if t is not None:
                    t.refresh(op[1])
                    t.touch(op[1])
        assert state(fused) == state(apart)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("capacity", [1, 3, 6])
@pytest.mark.parametrize("fused_as_list", [False, True])
@settings(max_examples=120, deadline=None)
@given(script=ops)
def test_store_misses_in_the_store_call_change_nothing(policy, capacity, fused_as_list, script):
    run_both(policy, capacity, script, fused_as_list)


def test_shown_must_be_a_set_or_a_list():
    table = make_slot_table(4, "arc", "CPU", native=True)
    with pytest.raises(TypeError, match="shown must be a set, a list or None, not frozenset"):
        table.allocate([1], frozenset())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes 1 to 3 arguments, not 4"):
        table._core.prepare_store([1], None, True, 4)
    assert table.num_used == 0


def test_victims_unlisted_when_nobody_demotes_them():
    table = make_slot_table(2, "lru", "CPU", native=True)
    table.complete(table.allocate([1, 2]).new, True)
    listed = table.allocate([3], None, victim_slots=True)
    assert (listed.evicted, listed.evicted_slots) == ([1], [0])
    table.complete([3], True)
    unlisted = table.allocate([4], None, victim_slots=False)
    assert (unlisted.evicted, unlisted.evicted_slots) == ([2], [])
