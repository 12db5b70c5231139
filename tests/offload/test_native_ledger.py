"""The native ledger (kvoffload_ext.ledger._ledger): the same answers as the Python ledger, op for op,
at sizes where its hash table probes, wraps and shifts; keys released; a clear fallback."""

from __future__ import annotations

import logging
import random
import shutil
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from kvoffload.offload import CPUOffloadingManager
from kvoffload.offload import native_ledger as nm
from kvoffload.offload.native_ledger import NativeLedgerUnavailableError, NativeSlotTable
from kvoffload.offload.python_slots import PythonSlotTable

needs_native = pytest.mark.skipif(not nm.native_available(), reason="native ledger not built")


def test_the_readme_install_builds_the_native_ledger():
    """Where a compiler and the Python headers exist, the optional build must have worked:
    otherwise every tier silently runs the slow path."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or Python headers here: the Python ledger is the expected path")
    assert nm.native_available(), f"kvoffload_ext.ledger._ledger failed to build or import: {nm._IMPORT_ERROR}"


def _state(mgr, policy="arc"):
    p = mgr.index.policy
    ledger = mgr.index.debug_snapshot()
    hashes = ledger.hashes
    state = {"index": dict(ledger.index), "refs": np.array(ledger.ref_cnt).tolist(), "free": mgr.num_free_blocks}
    if policy == "prefix_value":  # its order is a heap; every eviction is compared op for op instead
        return state
    if policy == "arc_classic":  # the Python policy keeps OrderedDicts of hashes
        native = hasattr(p, "ghost_hits")
        t1 = [hashes[s] for s in p.t1.oldest_first()] if native else list(p.t1)
        t2 = [hashes[s] for s in p.t2.oldest_first()] if native else list(p.t2)
        state.update(t1=t1, t2=t2, b1=list(p.b1), b2=list(p.b2), target=p.p,
                     hits=p.ghost_hits if native else dict(p._ghost_hit))
    elif hasattr(p, "b1"):
        state.update(t1=[hashes[s] for s in p.t1.oldest_first()], t2=[hashes[s] for s in p.t2.oldest_first()],
                     b1=list(p.b1), b2=list(p.b2), target=p.target_t1_size)
    else:
        state.update(order=[hashes[s] for s in p.order.oldest_first()])
    return state


#: What a tier's index answers (its reads and recency), not the tier.
INDEX_OPS = {"lookup", "touch", "refresh", "store_miss", "restore"}


def _call(mgr, op, args):
    try:
        out = getattr(mgr.index if op in INDEX_OPS else mgr, op)(*args)
    except (KeyError, ValueError) as e:  # BlockNotReadyError is a KeyError
        return ("raised", type(e).__name__, str(e))
    if op == "prepare_store" and out is not None:
        return (out.block_hashes_to_store, out.store_spec.block_ids.tolist(), out.block_hashes_evicted,
                list(out.evicted_block_ids))
    if op == "prepare_load":
        return out.block_ids.tolist()
    return out


@needs_native
@pytest.mark.parametrize("policy", ["lru", "arc", "arc_classic", "prefix_value"])
@pytest.mark.parametrize("capacity,universe", [(1, 4), (7, 30), (300, 2_000), (2_000, 9_000)])
def test_native_and_python_ledgers_agree_op_for_op(policy, capacity, universe):
    rng = random.Random(f"{policy}-{capacity}")
    native = CPUOffloadingManager(capacity, policy, enable_events=True, block_size=16)
    python = CPUOffloadingManager(capacity, policy, enable_events=True, block_size=16, native=False)
    assert isinstance(native.index, NativeSlotTable) and not isinstance(python.index, NativeSlotTable)
    pending: list[list[int]] = []
    pinned: list[list[int]] = []
    evicted = 0
    # Keys of three kinds, and hashes that collide in the table's low bits (multiples of 2**20).
    def key():
        k = rng.randrange(universe)
        return (k << 20) if k % 3 == 0 else (k.to_bytes(8, "little") if k % 3 == 1 else k)

    for step in range(4_000):
        n = rng.choice([1, 1, 2, 5, 16, 60])
        hashes = [key() for _ in range(n)]
        if rng.random() < 0.1:
            hashes.append(hashes[0])  # a repeat inside one call
        op = rng.choice(["store", "store", "store", "complete", "touch", "refresh", "lookup", "load", "unload",
                         "miss", "drop", "bad_load"])
        if op == "store":
            results = [_call(m, "prepare_store", (hashes,)) for m in (native, python)]
            if results[0] is not None and results[0][0]:
                pending.append(results[0][0])
                evicted += len(results[0][2])
        elif op == "complete" and pending:
            batch = pending.pop(rng.randrange(len(pending)))
            ok = rng.random() < 0.85
            results = [_call(m, "complete_store", (batch, ok)) for m in (native, python)]
        elif op == "load":
            hits = python.lookup(hashes)
            results = [_call(m, "prepare_load", (hashes[:hits],)) for m in (native, python)]
            pinned.append(hashes[:hits])
        elif op == "unload" and pinned:
            batch = pinned.pop(rng.randrange(len(pinned)))
            results = [_call(m, "complete_load", (batch,)) for m in (native, python)]
        elif op == "bad_load":  # absent, or still being written: refused, nothing pinned
            name = rng.choice(["prepare_load", "complete_load"])
            results = [_call(m, name, (hashes,)) for m in (native, python)]
            if results[1] is not None and results[1][0] != "raised" and isinstance(results[1], list):
                pinned.append(hashes)
        else:
            name = {"touch": "touch", "refresh": "refresh", "lookup": "lookup", "miss": "store_miss",
                    "drop": "drop", "complete": "lookup", "unload": "lookup"}[op]
            results = [_call(m, name, (hashes,)) for m in (native, python)]
        assert results[0] == results[1], (step, op, hashes)
        assert [(e.block_hashes, e.removed) for e in native.take_events()] == \
               [(e.block_hashes, e.removed) for e in python.take_events()], step
        if step % 250 == 0:
            assert _state(native, policy) == _state(python, policy), step
        for h in hashes[:3]:
            assert (native.index.slot_of(h), native.index.is_ready(h), native.index.is_pending(h), native.index.contains(h)) == \
                   (python.index.slot_of(h), python.index.is_ready(h), python.index.is_pending(h), python.index.contains(h))
    assert _state(native, policy) == _state(python, policy)
    assert evicted > capacity  # the table churned: on average every slot was refilled
    assert native.report() == python.report()


@needs_native
def test_equal_keys_are_one_key_and_unhashable_ones_change_nothing():
    mgr = CPUOffloadingManager(4, "arc")
    mgr.complete_store(mgr.prepare_store([1, b"x", (2, 3)]).block_hashes_to_store)
    assert mgr.lookup([1.0, True, b"x", (2, 3)]) == 4  # 1 == 1.0 == True, as a dict sees them
    before = _state(mgr)
    with pytest.raises(TypeError):
        mgr.prepare_store([5, [6]])
    with pytest.raises(TypeError):
        mgr.touch([1, {}])
    assert _state(mgr) == before


@needs_native
@pytest.mark.parametrize("policy", ["lru", "arc", "arc_classic", "prefix_value"])
def test_keys_are_released_when_evicted_forgotten_or_the_ledger_goes(policy):
    keys = [bytes([i]) * 40 for i in range(10)]  # fresh objects: refcounts we can read
    base = [sys.getrefcount(k) for k in keys]
    mgr = CPUOffloadingManager(3, policy)
    for i in range(0, 10, 2):
        out = mgr.prepare_store(keys[i : i + 2])
        mgr.complete_store(out.block_hashes_to_store, success=i != 4)
        del out
    mgr.touch(keys)  # ghost hits (ARC)
    assert mgr.num_used_blocks == 3
    del mgr
    assert [sys.getrefcount(k) for k in keys] == base


@needs_native
def test_restore_matches_the_python_ledger():
    entries = [(b"a", 5), (b"b", 1), (b"c", 3)]
    native, python = (CPUOffloadingManager(8, "arc", native=n) for n in (True, False))
    for m in (native, python):
        m.index.restore(entries)
    assert _state(native) == _state(python)
    assert _call(native, "prepare_store", ([b"d", b"e"],)) == _call(python, "prepare_store", ([b"d", b"e"],))
    with pytest.raises(ValueError, match="empty"):
        native.index.restore(entries)


def test_without_the_extension_the_python_ledger_runs_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(nm, "_ledger", None)
    monkeypatch.setattr(nm, "_IMPORT_ERROR", ImportError("no module named kvoffload_ext.ledger._ledger"))
    monkeypatch.setattr(nm, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="kvoffload.offload.native_ledger"):
        first, second = CPUOffloadingManager(4, "lru"), CPUOffloadingManager(4, "arc")
    assert not isinstance(first.index, NativeSlotTable) and not isinstance(second.index, NativeSlotTable)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "no module named kvoffload_ext.ledger._ledger" in lines[0] and "Python ledger" in lines[0]
    with pytest.raises(NativeLedgerUnavailableError, match=r"native=True but kvoffload_ext\.ledger\._ledger is not built .*pip install"):
        CPUOffloadingManager(4, "lru", native=True)


def test_native_is_used_only_where_it_applies(monkeypatch):
    from kvoffload.offload import LRUCachePolicy

    assert not isinstance(CPUOffloadingManager(4, LRUCachePolicy(4)).index, NativeSlotTable)  # a policy object
    with pytest.raises(NativeLedgerUnavailableError, match="cache_policy='sieve'"):
        CPUOffloadingManager(4, "sieve", native=True)
    with pytest.raises(NativeLedgerUnavailableError, match="cache_policy='sieve'"):
        NativeSlotTable(4, "sieve", "CPU")  # the native table built directly
    monkeypatch.setenv("KVOFFLOAD_NO_NATIVE", "1")
    tier = CPUOffloadingManager(4, "lru")
    assert type(tier) is CPUOffloadingManager and type(tier.index) is PythonSlotTable


@needs_native
@pytest.mark.parametrize("policy", ["lru", "arc", "arc_classic", "prefix_value"])
def test_no_key_reference_leaks_across_every_operation(policy):
    """Every call that takes, moves or hands back keys (ghosts, ghost hits, refusals, repeats,
    failed stores, drops) leaves each key's reference count as it found it once the ledger goes."""
    rng = random.Random(policy)
    keys = [bytes([i % 256, i // 256]) * 20 for i in range(400)]  # fresh objects, counts we can read
    base = [sys.getrefcount(k) for k in keys]
    mgr = CPUOffloadingManager(37, policy, enable_events=True)
    pending: list[list[bytes]] = []
    for _ in range(3_000):
        batch = [rng.choice(keys) for _ in range(rng.choice([1, 3, 12, 50]))]
        op = rng.randrange(8)
        if op <= 2:
            out = mgr.prepare_store(batch)
            if out is not None and out.block_hashes_to_store:
                pending.append(out.block_hashes_to_store)
            del out
        elif op == 3 and pending:
            mgr.complete_store(pending.pop(rng.randrange(len(pending))), success=rng.random() < 0.8)
        elif op == 4:
            mgr.touch(batch)
            mgr.index.store_miss(batch)
        elif op == 5:
            hits = mgr.lookup(batch)
            mgr.prepare_load(batch[:hits])
            mgr.complete_load(batch[:hits])
            with pytest.raises((KeyError, ValueError)):
                mgr.complete_load([b"absent"])
        elif op == 6:
            mgr.drop(batch[:2])
        else:
            mgr.index.refresh(batch)
        mgr.take_events()
    assert mgr.num_used_blocks > 0 and mgr.index.policy.num_ghosts() >= (0 if policy in ("lru", "prefix_value") else 1)
    del mgr, pending, batch
    assert [sys.getrefcount(k) for k in keys] == base


@needs_native
def test_the_raw_ledger_type_refuses_bad_construction_instead_of_crashing():
    from array import array

    from kvoffload_ext.ledger import _ledger

    with pytest.raises(TypeError):
        _ledger.Ledger.__new__(_ledger.Ledger)  # no half-built ledger whose methods would crash
    with pytest.raises(ValueError, match=r"capacity=0, policy=1"):
        _ledger.Ledger(0, _ledger.LRU, array("i"))
    with pytest.raises(ValueError, match=r"policy=9"):
        _ledger.Ledger(4, 9, array("i", bytes(16)))
    with pytest.raises(ValueError, match=r"refs must be a writable array\('i'\) of at least 4 items"):
        _ledger.Ledger(4, _ledger.ARC, array("d", [0.0] * 4))
    with pytest.raises(ValueError, match=r"at least 4 items"):
        _ledger.Ledger(4, _ledger.ARC, array("i", bytes(8)))
    refs = array("i", bytes(16))
    ledger = _ledger.Ledger(4, _ledger.ARC, refs)
    with pytest.raises(BufferError):
        refs.append(0)  # the ledger holds the buffer: the array cannot move under it
    assert ledger.lookup([1]) == 0 and ledger.num_free == 4
