"""The ledgers' boundary against callers that are not the engine (a policy, a user of the public
ledger API): keys whose ``__index__``, ``__hash__`` or ``__eq__`` misbehave cannot crash the
native ledger or make it loop, a ledger referenced by its own keys is collected, and both
ledgers refuse the same hostile arguments the same way, changing nothing.

Engine block hashes are bytes or ints, so request content cannot reach these; a crash here
would still take the engine down, so each crash case runs in a child process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvoffload.offload import CPUOffloadingManager
from kvoffload.offload import native_ledger as nm

from .test_native_ledger import _call, _state

needs_native = pytest.mark.skipif(not nm.native_available(), reason="native ledger not built")


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with the raw native ledger imported as ``L``; a signal
    (a crash) shows as a negative return code."""
    prelude = "from array import array\nfrom kvoffload_ext.ledger._ledger import Ledger, LRU, ARC\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)


@needs_native
def test_a_slot_whose_index_changes_between_reads_cannot_write_out_of_bounds():
    out = run_child("""
        class S:
            calls = 0
            def __index__(self):
                S.calls += 1
                return 0 if S.calls == 1 else 1 << 30
        l = Ledger(4, LRU, array("i", bytes(16)))
        l.restore([1], [S()])
        assert l.items() == [(1, 0)], l.items()
        assert S.calls == 1, S.calls
        try:
            l.restore([2], [3])
        except ValueError as e:
            assert "empty" in str(e)
        l2 = Ledger(4, LRU, array("i", bytes(16)))
        for bad in ([-1], [4], [1 << 40]):
            try:
                l2.restore([1], bad)
            except (ValueError, OverflowError):
                pass
            else:
                raise SystemExit(f"slot {bad} accepted")
        l2.restore([1], [2])  # a refused restore left no mark behind
        assert l2.items() == [(1, 2)]
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


@needs_native
@pytest.mark.parametrize("method", ["__hash__", "__eq__"])
def test_a_key_that_empties_the_argument_list_cannot_make_it_read_freed_memory(method):
    out = run_child(f"""
        import gc
        args = []
        class K:
            def __init__(self, v):
                self.v = v
            def __hash__(self):
                {"args.clear(); gc.collect()" if method == "__hash__" else "pass"}
                return 7
            def __eq__(self, other):
                {"args.clear(); gc.collect()" if method == "__eq__" else "pass"}
                return isinstance(other, K) and self.v == other.v
        l = Ledger(8, ARC, array("i", bytes(32)))
        for op in ("lookup", "touch", "store_miss", "prepare_store", "pin", "drop", "slot_of"):
            args[:] = [K(i) for i in range(6)]
            try:
                getattr(l, op)(args) if op != "slot_of" else l.slot_of(K(1))
            except (RuntimeError, KeyError, ValueError, TypeError):
                pass
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


@needs_native
def test_a_stored_key_that_drops_itself_while_compared_is_an_error_not_a_hang():
    out = run_child("""
        class K:
            ledger = None
            def __init__(self, v):
                self.v = v
            def __hash__(self):
                return 1  # every key collides: lookups compare
            def __eq__(self, other):
                if K.ledger is not None and self.v == 0:
                    led, K.ledger = K.ledger, None
                    led.drop([self])  # the stored key removes itself mid-probe
                return isinstance(other, K) and self.v == other.v
        l = Ledger(8, LRU, array("i", bytes(32)))
        keys = [K(i) for i in range(4)]
        new, slots, _, _ = l.prepare_store(keys)
        l.complete_store(keys)
        K.ledger = l
        try:
            l.complete_store([K(3)])
        except RuntimeError as e:
            assert "changed while a key was being compared" in str(e), e
        else:
            raise SystemExit("no error")
        print(sorted(k.v for k, _ in l.items()))
    """)
    assert out.returncode == 0 and out.stdout.strip() == "[1, 2, 3]", (out.returncode, out.stderr[-2000:])


@needs_native
def test_a_ledger_its_own_keys_refer_to_is_collected():
    """The type was not known to the garbage collector: a key referring to its ledger (an
    object's attribute, or a tuple only the ledger's side can break) leaked both."""
    out = run_child("""
        import gc, weakref
        class K:
            def __init__(self, ledger):
                self.ledger = ledger
        class Marker:
            pass
        l = Ledger(4, ARC, array("i", bytes(16)))
        key = K(l)
        l.prepare_store([key])
        gone = weakref.ref(key)
        m = Marker()
        alive = weakref.ref(m)
        l2 = Ledger(2, LRU, array("i", bytes(8)))
        l2.prepare_store([(l2, m)])
        del l, key, l2, m
        gc.collect()
        assert gone() is None, "an object key referring to its ledger leaked"
        assert alive() is None, "a tuple key holding its ledger leaked"
        print("ok")
    """)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


# ---- both ledgers refuse the same way -------------------------------------------------------------

@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False])
def test_unpinning_a_block_twice_after_one_pin_is_refused_and_changes_nothing(native):
    mgr = CPUOffloadingManager(4, "lru", native=native)
    mgr.complete_store(mgr.prepare_store([b"h", b"g"]).block_hashes_to_store)
    mgr.prepare_load([b"h"])
    before = _state(mgr, "lru")
    with pytest.raises(ValueError, match="without a matching prepare_load"):
        mgr.complete_load([b"h", b"h"])
    assert _state(mgr, "lru") == before
    mgr.complete_load([b"h"])
    assert mgr.index.busy() == (0, 0)


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_native), False])
@pytest.mark.parametrize(("entries", "words"), [
    ([(b"a", 1), (b"a", 2)], "given twice"),
    ([(b"a", -1)], "out of range"),
    ([(b"a", 8)], "out of range"),
    ([(b"a", 1), (b"b", 1)], "slot 1 is given twice"),
])
def test_a_hostile_restore_is_refused_and_changes_nothing(native, entries, words):
    mgr = CPUOffloadingManager(8, "arc", native=native)
    with pytest.raises(ValueError, match=words):
        mgr.index.restore(entries)
    assert mgr.num_used_blocks == 0 and mgr.num_free_blocks == 8
    mgr.index.restore([(b"a", 1)])  # still empty, still usable
    assert mgr.lookup([b"a"]) == 1


HASHES = st.sampled_from([b"a", b"b", b"c", b"d", b"e", 1, 2, 3])


class DifferentialMachine(RuleBasedStateMachine):
    """The native and the Python ledger driven with the same calls, hostile ones included
    (repeated keys in a load, absent keys, unpins without pins, restores on a fresh pair with
    repeated keys, repeated and out-of-range slots): each call answers, or refuses, the same,
    and the states stay equal."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = [CPUOffloadingManager(5, "arc", native=n) for n in (True, False)]

    def both(self, op: str, *args: object) -> object:
        out = [_call(m, op, args) for m in self.pair]
        assert out[0] == out[1], (op, args, out)
        return out[0]

    @rule(keys=st.lists(HASHES, min_size=1, max_size=4))
    def store(self, keys):
        out = self.both("prepare_store", keys)
        if out is not None and not (isinstance(out, tuple) and out[0] == "raised"):
            self.both("complete_store", out[0])

    @rule(keys=st.lists(HASHES, min_size=1, max_size=4))
    def pin(self, keys):
        self.both("prepare_load", keys)

    @rule(keys=st.lists(HASHES, min_size=1, max_size=4))
    def unpin(self, keys):
        self.both("complete_load", keys)

    @rule(keys=st.lists(HASHES, max_size=4))
    def touch(self, keys):
        self.both("touch", keys)

    @rule(entries=st.lists(st.tuples(HASHES, st.integers(-2, 6)), max_size=4))
    def restore_fresh(self, entries):
        self.pair = [CPUOffloadingManager(5, "arc", native=n) for n in (True, False)]
        self.both("restore", entries)

    @invariant()
    def equal(self):
        assert _state(self.pair[0]) == _state(self.pair[1])
        assert self.pair[0].index.busy() == self.pair[1].index.busy()


DifferentialMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                                 suppress_health_check=list(HealthCheck))
TestDifferentialMachine = needs_native(DifferentialMachine.TestCase)
