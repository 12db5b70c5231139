"""Random sequences of every primitive, checked step by step against the textbook ledger."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvoffload.bench.baseline_manager import TextbookManager
from kvoffload.offload import CPUOffloadingManager, OffloadingEvent

HASHES = st.integers(min_value=0, max_value=14)
CAPACITY = 6


class LedgerMachine(RuleBasedStateMachine):
    policy = "lru"
    native: bool = False  # which ledger: the C one (kvoffload_ext.ledger._ledger) or the Python one
    steps_run = 0

    def __init__(self) -> None:
        super().__init__()
        self.mgr = CPUOffloadingManager(CAPACITY, cache_policy=self.policy, enable_events=True, block_size=4,
                                        native=self.native)
        self.ref = TextbookManager(CAPACITY, self.policy)
        self.pending: list[int] = []  # stored, not yet completed
        self.loads: list[list[int]] = []  # in-flight loads

    def _pins(self) -> dict[int, int]:
        pins: dict[int, int] = {}
        for load in self.loads:
            for h in load:
                pins[h] = pins.get(h, 0) + 1
        return pins

    @rule(hashes=st.lists(HASHES, min_size=1, max_size=4))
    def store(self, hashes):
        pins = self._pins()
        out = self.mgr.prepare_store(hashes)
        expected = self.ref.prepare_store(hashes)
        if expected is None:
            assert out is None
            return
        new, slots, evicted = expected
        assert out.block_hashes_to_store == new
        assert out.store_spec.block_ids.tolist() == slots
        assert out.block_hashes_evicted == evicted
        for h in evicted:
            assert h not in pins and h not in self.pending and h not in hashes
        self.pending.extend(new)

    @rule(data=st.data(), success=st.booleans())
    @precondition(lambda self: self.pending)
    def complete_store(self, data, success):
        chosen = data.draw(st.lists(st.sampled_from(self.pending), min_size=1, unique=True))
        self.mgr.complete_store(chosen + [99], success=success)  # 99: absent, ignored
        self.ref.complete_store(chosen + [99], success=success)
        self.pending = [h for h in self.pending if h not in chosen]

    @rule(hashes=st.lists(HASHES, max_size=6))
    def lookup_and_touch(self, hashes):
        assert self.mgr.lookup(hashes) == self.ref.lookup(hashes)
        self.mgr.touch(hashes)
        self.ref.touch(hashes)

    @rule(data=st.data())
    def load(self, data):
        ready = [h for h in range(15) if self.ref.lookup([h]) == 1]
        if not ready:
            return
        chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
        assert self.mgr.prepare_load(chosen).block_ids.tolist() == self.ref.prepare_load(chosen)
        self.loads.append(chosen)

    @rule(data=st.data())
    @precondition(lambda self: self.loads)
    def complete_load(self, data):
        load = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
        self.mgr.complete_load(load)
        self.ref.complete_load(load)

    @invariant()
    def ledgers_agree(self):
        type(self).steps_run += 1
        ledger = self.mgr.index.debug_snapshot()
        slots = list(ledger.index.values())
        assert len(set(slots)) == len(slots), "slot allocated twice"
        assert self.mgr.num_free_blocks + len(slots) == CAPACITY
        assert all(ledger.hashes[s] == h for h, s in ledger.index.items())
        assert all(ledger.refs[s] >= -1 for s in slots)
        pins = self._pins()
        for h, s in ledger.index.items():
            want = -1 if h in self.pending else pins.get(h, 0)
            assert ledger.ref_cnt[s] == want
            assert self.ref.get(h).block_id == s
        events = [(e.block_hashes, e.removed) for e in self.mgr.take_events()]
        assert all(isinstance(e, OffloadingEvent) for e in [])
        assert events == self.ref.events
        self.ref.events.clear()
        if self.policy == "arc":
            p = self.mgr.index.policy
            assert p.target_t1_size == self.ref.target
            assert list(p.b1) == list(self.ref.b1) and list(p.b2) == list(self.ref.b2)
            assert len(p.b1) <= CAPACITY and len(p.b2) <= CAPACITY
            t1 = [ledger.hashes[s] for s in p.t1.oldest_first()]
            t2 = [ledger.hashes[s] for s in p.t2.oldest_first()]
            assert t1 == list(self.ref.t1) and t2 == list(self.ref.t2)
        else:
            order = [ledger.hashes[s] for s in self.mgr.index.policy.order.oldest_first()]
            assert order == list(self.ref.lru)


class ARCMachine(LedgerMachine):
    policy = "arc"
    steps_run = 0


def _run(machine, steps: int, examples: int) -> int:
    machine.steps_run = 0
    machine.TestCase.settings = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                                         suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()
    return machine.steps_run


@pytest.fixture(params=["native", "loops", "vectorised"])
def code_path(request, monkeypatch):
    """The native ledger, and the Python one: its policies' short batches take plain loops;
    force their numpy paths too, so every path is checked."""
    monkeypatch.setattr(LedgerMachine, "native", request.param == "native")
    if request.param == "native":
        pytest.importorskip("kvoffload_ext.ledger._ledger", reason="native ledger not built (test_native_ledger.py::test_the_readme_install_builds_the_native_ledger says why)")
    if request.param == "vectorised":
        from kvoffload.offload import block_status, stamp_order

        monkeypatch.setattr(block_status, "_RESTAMP_VECTOR_MIN", 0)
        monkeypatch.setattr(stamp_order, "_VECTOR_MIN", 1)
    return request.param


@pytest.mark.parametrize("machine", [LedgerMachine, ARCMachine], ids=["lru", "arc"])
def test_ledger_matches_reference(machine, code_path):
    from kvoffload.offload.native_ledger import NativeSlotTable

    assert isinstance(machine().mgr.index, NativeSlotTable) == (code_path == "native")
    _run(machine, steps=50, examples=40)


@pytest.mark.slow
@pytest.mark.parametrize("machine", [LedgerMachine, ARCMachine], ids=["lru", "arc"])
def test_ledger_matches_reference_long(machine, code_path):
    total = 0
    while total < 10_000:  # hypothesis ends a run early when its data buffer fills up
        total += _run(machine, steps=10_000, examples=20)
    assert total >= 10_000
