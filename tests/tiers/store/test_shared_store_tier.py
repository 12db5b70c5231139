"""The shared-store tier's halves over an in-memory store double: keys, records, batched and
bounded lookups, health, and the chain's lookup asking the store once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kvoffload.offload import CPUOffloadingManager
from kvoffload.offload.abstract import LookupResult, Medium
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.tiers.mooncake.spec import MOONCAKE, MooncakeLoadStoreSpec
from kvoffload.tiers.store.io import StoreIO
from kvoffload.tiers.store.keys import StoreKeys, UnkeyableHashError, hash_text
from kvoffload.tiers.store.lookups import StoreLookups
from kvoffload.tiers.store.record import HEADER_BYTES, check_record, write_header
from kvoffload.tiers.store.tier import SharedStoreTier
from kvoffload.transfer.result import BlockTransferError
from tests.tiers.store.store_double import UNREACHABLE, DictStore

KEYS = StoreKeys.of("digestA", 16, 256, 1)


def _manager(store: DictStore, keys: StoreKeys = KEYS, wait_s: float = 1.0, **kw) -> SharedStoreTier:
    return SharedStoreTier(MooncakeLoadStoreSpec, StoreLookups(store, keys, wait_s=wait_s, **kw), 1000, retry_after_s=0.2)


def _put(store: DictStore, keys: StoreKeys, hashes, rank=0):
    for h in hashes:
        store.values[keys.key(h, rank)] = b"x"


# ---- keys and records --------------------------------------------------------------------
def test_keys_separate_models_layouts_block_sizes_and_ranks():
    h = bytes(range(16))
    variants = {
        StoreKeys.of("digestA", 16, 256, 1).key(h, 0),
        StoreKeys.of("digestB", 16, 256, 1).key(h, 0),
        StoreKeys.of("digestA", 32, 256, 1).key(h, 0),
        StoreKeys.of("digestA", 16, 512, 1).key(h, 0),
        StoreKeys.of("digestA", 16, 256, 2).key(h, 0),
        StoreKeys.of("digestA", 16, 256, 2).key(h, 1),
    }
    assert len(variants) == 6
    assert KEYS.key(h, 0) == "kvoffload/digestA/16t256b/w1r0/000102030405060708090a0b0c0d0e0f"
    assert hash_text(255) == "iff" and hash_text(-255) == "nff"
    with pytest.raises(UnkeyableHashError, match="'abc'"):
        hash_text("abc")


def test_record_detects_flipped_bytes_other_keys_and_garbage():
    record = np.zeros(HEADER_BYTES + 128, dtype=np.uint8)
    record[HEADER_BYTES:] = np.arange(128, dtype=np.uint8)
    write_header(record, "k1")
    assert check_record(record, "k1") is None
    assert check_record(record, "k2") == ("key", "written under another key")
    flipped = record.copy()
    flipped[HEADER_BYTES + 5] ^= 1
    assert check_record(flipped, "k1") == ("checksum", "payload checksum mismatch")
    assert check_record(np.full_like(record, 7), "k1") == ("format", "not a kvoffload block record")


# ---- lookups -----------------------------------------------------------------------------
def test_lookup_asks_the_store_once_for_the_run_the_local_tiers_miss():
    store = DictStore()
    hashes = [bytes([i]) * 16 for i in range(64)]
    _put(store, KEYS, hashes[:40])
    cpu = CPUOffloadingManager(16)
    out = cpu.prepare_store(hashes[:8])
    cpu.complete_store(out.block_hashes_to_store)
    chain = HostTierChain(cpu, _manager(store))
    found = chain.lookup_prefix(hashes)
    assert found.media == [Medium.CPU] * 8 + [MOONCAKE] * 32
    assert found.stop is LookupResult.MISS
    assert store.calls == [("exists", 56)]  # one batch: blocks 8..63, every rank's key
    segments = chain.prepare_load_segments(hashes[:40])
    assert [(spec.medium(), len(h)) for spec, h in segments] == [(Medium.CPU, 8), (MOONCAKE, 32)]
    assert segments[1][0].block_hashes == hashes[8:40]


def test_a_block_is_found_only_when_every_rank_holds_its_shard():
    store, keys = DictStore(), StoreKeys.of("d", 16, 128, 2)
    hashes = [bytes([i]) * 16 for i in range(4)]
    _put(store, keys, hashes, rank=0)
    _put(store, keys, hashes[:2], rank=1)
    assert _manager(store, keys).lookup_run(hashes) == 2
    assert store.calls == [("exists", 8)]


def test_a_slow_store_defers_the_lookup_instead_of_stalling_the_step():
    store = DictStore()
    hashes = [bytes([i]) * 16 for i in range(8)]
    _put(store, KEYS, hashes)
    store.gate = threading.Event()
    tier = _manager(store, wait_s=0.01, give_up_s=5.0)
    chain = HostTierChain(CPUOffloadingManager(4), tier)
    t0 = time.monotonic()
    assert chain.lookup_prefix(hashes).stop is LookupResult.RETRY
    assert time.monotonic() - t0 < 0.5
    store.gate.set()
    deadline = time.monotonic() + 5
    while tier.lookups._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    found = chain.lookup_prefix(hashes)  # next step: the answer that arrived meanwhile
    assert found.hits == 8 and found.stop is LookupResult.HIT
    assert store.calls == [("exists", 8)]


def test_a_store_that_stops_answering_turns_lookups_into_misses():
    store = DictStore()
    store.gate = threading.Event()
    tier = _manager(store, wait_s=0.01, give_up_s=0.05)
    a, b = [b"a" * 16], [b"b" * 16]
    try:
        assert tier.lookup_run(a) is None
        time.sleep(0.1)
        t0 = time.monotonic()
        assert tier.lookup_run(b) == 0  # not queued behind the hung query
        assert time.monotonic() - t0 < 0.05
        assert tier.report().lookups_given_up == 1
    finally:
        store.gate.set()  # the hung query's thread must end, or the test process cannot exit


def test_store_errors_take_the_tier_out_then_back_in_service():
    store = DictStore()
    hashes = [b"h" * 16]
    _put(store, KEYS, hashes)
    store.down = True
    tier = _manager(store)
    chain = HostTierChain(CPUOffloadingManager(4), tier)
    for _ in range(3):
        assert chain.lookup_prefix(hashes).hits == 0
    assert not tier.in_service and tier.report().outages == 1
    calls = len(store.calls)
    assert chain.lookup_prefix(hashes).hits == 0 and len(store.calls) == calls  # not asked while out
    store.down = False
    time.sleep(0.25)
    assert chain.lookup_prefix(hashes).media == [MOONCAKE]


def test_stores_are_not_repeated_and_failed_ones_are_forgotten():
    tier = _manager(DictStore())
    out = tier.prepare_store([b"a" * 16, b"b" * 16])
    assert out.block_hashes_to_store == [b"a" * 16, b"b" * 16] and out.block_hashes_evicted == []
    assert tier.index.is_pending(b"a" * 16)
    assert tier.prepare_store([b"a" * 16]).block_hashes_to_store == []
    tier.complete_store([b"a" * 16], success=True)
    tier.complete_store([b"b" * 16], success=False)
    assert tier.index.is_ready(b"a" * 16) and not tier.index.contains(b"b" * 16)
    spec = tier.prepare_load([b"a" * 16])
    assert tier.drop_slots(spec.block_ids.tolist()) == 1 and not tier.index.contains(b"a" * 16)


# ---- worker I/O --------------------------------------------------------------------------
def _blocks(n, nbytes=256, seed=0):
    return np.random.default_rng(seed).integers(0, 255, (n, nbytes), dtype=np.uint8)


def _io(mode, data, out, staging_bytes=1 << 16):
    """staged: the store needs registered memory and the blocks are not; direct-tcp: any memory
    serves; direct-registered: the blocks lie in registered memory."""
    store = DictStore(needs_registration=mode != "direct-tcp")
    io = StoreIO(store, KEYS, 0, 256, staging_bytes=staging_bytes)
    if mode == "direct-registered":
        io.register_memory(data.ctypes.data, data.nbytes)
        io.register_memory(out.ctypes.data, out.nbytes)
    return store, io


MODES = ["staged", "direct-tcp", "direct-registered"]


@pytest.mark.parametrize("mode", MODES)
def test_store_io_round_trips_bytes_in_chunks_of_the_staging_memory(mode):
    data = _blocks(7)
    out = np.zeros_like(data)
    store, io = _io(mode, data, out, staging_bytes=3 * (HEADER_BYTES + 256))
    assert store.registered[0] == (io.arena.base, 3 * (HEADER_BYTES + 256))
    hashes = [bytes([i]) * 16 for i in range(7)]
    io.write([row.data for row in data], list(range(7)), hashes)
    put = "put" if mode == "staged" else "put_parts"
    assert store.calls == [(put, 3), (put, 3), (put, 1)]
    io.read(list(range(7)), hashes, [row.data for row in out])
    assert np.array_equal(out, data)
    assert (io.num_staged, io.num_direct) == ((7, 0) if mode == "staged" else (0, 7))
    assert all(len(v) == HEADER_BYTES + 256 for v in store.values.values())


@pytest.mark.parametrize("mode", MODES)
def test_store_io_refuses_overwritten_misplaced_and_missing_values(mode):
    data, hashes = _blocks(4), [bytes([i]) * 16 for i in range(4)]
    out = np.zeros_like(data)
    store, io = _io(mode, data, out)
    io.write([row.data for row in data], [10, 11, 12, 13], hashes)
    k0, k1, k2 = (KEYS.key(h, 0) for h in hashes[:3])
    raw = bytearray(store.values[k0])
    raw[HEADER_BYTES + 3] ^= 0xFF
    store.values[k0] = bytes(raw)  # other bytes
    store.values[k1] = store.values[k2]  # a valid record of another key
    del store.values[KEYS.key(hashes[3], 0)]  # evicted
    with pytest.raises(BlockTransferError) as err:
        io.read([10, 11, 12, 13], hashes, [row.data for row in out])
    assert err.value.slots == [10, 11, 13] and not err.value.io
    assert np.array_equal(out[2], data[2])
    assert k0 not in store.values and k1 not in store.values  # damaged values removed from the store
    assert k2 in store.values


def test_an_unreachable_store_is_an_io_error():
    store = DictStore()
    io = StoreIO(store, KEYS, 0, 256, staging_bytes=1 << 16)
    store.down = True
    with pytest.raises(BlockTransferError) as err:
        io.write([_blocks(1)[0].data], [5], [b"h" * 16])
    assert err.value.io and err.value.slots == [5]
    with pytest.raises(BlockTransferError) as err:
        io.read([5], [b"h" * 16], [np.zeros(256, np.uint8).data])
    assert err.value.io and str(UNREACHABLE) in str(err.value)


@pytest.mark.parametrize("op", ["write", "read"])
def test_an_unreachable_store_is_not_called_again_until_the_hold_ends(op):
    """A dead master makes each call wait out an RPC timeout: the rest of the job and the jobs
    behind it fail at once, as I/O errors, until the hold ends. A quick failure holds nothing,
    and with no hold (a filesystem, whose errors are per file) every chunk is tried."""
    data, hashes = _blocks(7), [bytes([i]) * 16 for i in range(7)]
    out = np.zeros_like(data)

    def run(io):
        if op == "write":
            io.write([row.data for row in data], list(range(7)), hashes)
        else:
            io.read(list(range(7)), hashes, [row.data for row in out])

    staging = 3 * (HEADER_BYTES + 256)
    store = DictStore()
    held = StoreIO(store, KEYS, 0, 256, staging_bytes=staging, unreachable_hold_s=0.3)
    held.SLOW_FAILURE_S = 0.05
    held.write([row.data for row in data], list(range(7)), hashes)
    store.calls.clear()
    store.down = True
    with pytest.raises(BlockTransferError) as err:
        run(held)  # a quick failure: every chunk is tried
    assert len(store.calls) == 3 and err.value.io and held.num_held == 0
    store.calls.clear()
    store.down_after_s = 0.06
    with pytest.raises(BlockTransferError) as err:
        run(held)
    assert len(store.calls) == 1 and err.value.io and err.value.slots == list(range(7))
    assert "4 without a call" in str(err.value) and held.num_held == 4
    store.down = False  # back, but the hold still stands: no call
    with pytest.raises(BlockTransferError) as err:
        run(held)
    assert len(store.calls) == 1 and err.value.io and err.value.slots == list(range(7))
    time.sleep(0.35)
    run(held)
    assert len(store.calls) == 4
    if op == "read":
        assert np.array_equal(out, data)

    store.calls.clear()
    store.down = True
    unheld = StoreIO(store, KEYS, 0, 256, staging_bytes=staging)  # slow failures, no hold
    with pytest.raises(BlockTransferError) as err:
        run(unheld)
    assert len(store.calls) == 3 and err.value.io and unheld.num_held == 0


def test_a_quick_unreachable_after_slow_tags_holds_nothing():
    """Round 7: the hold timed a failure from before the batch's tags were computed, so a quick
    'unreachable' after a large tagged batch was classed slow and held the store."""
    from kvoffload.auth import RecordTagger

    class SlowTags(RecordTagger):
        def tag(self, key: bytes, payload: memoryview) -> bytes:
            time.sleep(0.03)
            return super().tag(key, payload)

    data, hashes = _blocks(3), [bytes([i]) * 16 for i in range(3)]
    for staged in (True, False):  # blocks copied next to their headers, or sent from where they lie
        store = DictStore(needs_registration=staged)
        store.down = True
        io = StoreIO(store, KEYS, 0, 256, staging_bytes=3 * (HEADER_BYTES + 256), tagger=SlowTags(),
                     unreachable_hold_s=5.0)
        io.SLOW_FAILURE_S = 0.05
        with pytest.raises(BlockTransferError) as err:
            io.write([row.data for row in data], list(range(3)), hashes)  # 0.09 s of tags, a quick failure
        assert err.value.io and io.num_held == 0 and not io._held()


# ---- KV events -----------------------------------------------------------------------------
def test_events_say_what_this_replica_can_read_from_the_store():
    """Stored when our write lands or a lookup finds a block; removed when a lookup finds it gone
    or the tier stops tracking it (the store's own evictions are silent)."""
    store = DictStore()
    tier = SharedStoreTier(MooncakeLoadStoreSpec, StoreLookups(store, KEYS, wait_s=1.0), 3, enable_events=True,
                           block_size=16)
    h = [bytes([i]) * 16 for i in range(6)]
    out = tier.prepare_store(h[:2])
    assert tier.take_events() == []  # nothing readable before the write lands
    _put(store, KEYS, h[:2])
    tier.complete_store(out.block_hashes_to_store)
    tier.complete_store(tier.prepare_store([h[2]]).block_hashes_to_store, success=False)
    _put(store, KEYS, h[3:5])  # another replica's writes
    assert tier.lookup_run([h[3], h[4], h[5]]) == 2
    events = [(e.block_hashes, e.removed, e.medium, e.block_size) for e in tier.take_events()]
    assert events == [([h[0]], False, MOONCAKE, 16), ([h[1]], False, MOONCAKE, 16), ([h[3]], False, MOONCAKE, 16),
                      ([h[4]], False, MOONCAKE, 16),
                      ([h[0]], True, MOONCAKE, 16)]  # a fourth block: tracking three, the oldest goes
    del store.values[KEYS.key(h[3], 0)]  # the store evicted it
    assert tier.lookup_run([h[3]]) == 0
    assert [(e.block_hashes, e.removed) for e in tier.take_events()] == [([h[3]], True)]
    assert _manager(store).take_events() == []  # events off: none kept
