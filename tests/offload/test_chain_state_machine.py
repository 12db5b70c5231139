"""The tier chain under random interleavings — [cpu, disk] for every live policy with and
without the reuse filter (requests' hints arriving between the copies), [cpu, disk, remote] with victims only and with write-through: stores,
promotions, loads that overlap (one hash pinned in two tiers) and complete in any order, lookup
hints, demotions landing out of order or failing, corrupt drops and outages. The bytes are
modelled per slot: a copy reads its source when it is planned (what the worker's slot fences
guarantee: a slot is read before it is written again) and writes its destination when it lands.
Every load must read slots that hold exactly the blocks it asked for, every store must be atomic
and evict only what it may, and every ledger must account for its slots and pins."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvoffload.offload import CPUOffloadingManager, FilterReusedOffloadingManager
from kvoffload.offload.hints import RequestHint
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.testing.memory_tier import MemoryTier
from kvoffload.tiers.disk.format import DiskLayout
from kvoffload.tiers.disk.tier import DiskTier

HASHES = st.integers(min_value=0, max_value=9)
LIVE_POLICIES = ["lru", "arc", "s3fifo", "sieve", "lfu", "arc_classic", "prefix_value", "hinted"]
WARM = [3, 4, 5]  # on disk from the start (a restart), so disk hits come early


def make_machine(policy: str, threshold: int, remote: bool, write_through: bool):
    cap = {"CPU": 3, "DISK": 4, **({"REMOTE": 4} if remote else {})}
    order = list(cap)

    class Chain(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.dir = tempfile.mkdtemp(prefix="kvoffload-chain-")
            self.cpu = CPUOffloadingManager(cap["CPU"], policy)
            self.disk = DiskTier(self.dir, DiskLayout("chain", 64, 16, cap["DISK"]), policy)
            self.tiers = {"CPU": self.cpu, "DISK": self.disk}
            if remote:
                self.tiers["REMOTE"] = MemoryTier(cap["REMOTE"], policy)
            chain = HostTierChain(*self.tiers.values(), write_through=[False, write_through][: len(cap) - 1])
            # The filter is the chain over the same tiers (it takes over the one it is given).
            self.mgr = FilterReusedOffloadingManager(chain, threshold) if threshold else chain
            self.data: dict[str, dict[int, int]] = {m: {} for m in cap}  # medium -> slot -> block it holds
            out = self.disk.prepare_store(WARM)
            self.disk.complete_store(WARM)
            self.data["DISK"].update(zip(out.store_spec.block_ids.tolist(), WARM))
            self.sightings: dict[int, int] = {}
            self.storing: dict[int, int] = {}  # CPU stores in flight: hash -> slot
            self.demoting: list[tuple[str, list[int], list[int], list[int]]] = []  # (dst, hashes, slots, read)
            self.loads: list[list[tuple[str, list[int]]]] = []  # per load: (medium, hashes) segments
            self.clock = 0.0  # the hints' clock

        def teardown(self) -> None:
            self.disk.close()
            shutil.rmtree(self.dir, ignore_errors=True)

        def _take_demotions(self, evicted: list[int] | None = None) -> None:
            for d in self.mgr.take_demotions():
                src, dst = str(d.src.medium()), str(d.dst.medium())
                assert order.index(dst) == order.index(src) + 1  # always one tier down
                assert len(d.src) == len(d.dst) == len(d.block_hashes)
                if evicted is not None and src == "CPU" and not write_through:
                    assert set(d.block_hashes) <= set(evicted)  # only the store's own victims
                read = [self.data[src].get(s) for s in d.src.block_ids.tolist()]
                assert read == d.block_hashes, (src, dst, read, d.block_hashes)  # the victims' own bytes
                self.demoting.append((dst, list(d.block_hashes), d.dst.block_ids.tolist(), read))

        def _pins(self, medium: str) -> dict[int, int]:
            pins: dict[int, int] = {}
            for load in self.loads:
                for m, hashes in load:
                    if m == medium:
                        for h in hashes:
                            pins[h] = pins.get(h, 0) + 1
            return pins

        def _offer(self, hashes: list[int]):
            """Offer hashes for store, as a request's cursor does; checks atomicity and victims."""
            cpu_pins = self._pins("CPU")
            before = dict(self.cpu.index.debug_snapshot().index)
            out = self.mgr.prepare_store(hashes)
            if out is None:
                assert dict(self.cpu.index.debug_snapshot().index) == before  # atomic
                return None
            offered = hashes
            if threshold:
                for h in hashes:
                    self.sightings[h] = self.sightings.get(h, 0) + 1
                assert all(self.sightings[h] >= threshold for h in out.block_hashes_to_store)
                # Like vLLM's filter: only admitted hashes reach (and are protected by) the tiers.
                offered = [h for h in hashes if self.sightings[h] >= threshold]
            for h in out.block_hashes_evicted:
                assert h not in cpu_pins and h not in self.storing and h not in offered
            for h, s in zip(out.block_hashes_to_store, out.store_spec.block_ids.tolist()):
                self.storing[h] = s
            self._take_demotions(out.block_hashes_evicted)
            return out

        def _land(self, hashes: list[int], ok: bool) -> None:
            for h in hashes:
                slot = self.storing.pop(h)
                if ok:
                    self.data["CPU"][slot] = h  # the device → host copy landed
            self.mgr.complete_store(hashes, ok)
            self._take_demotions()  # write-through

        @rule(hashes=st.lists(HASHES, min_size=1, max_size=3, unique=True))
        def store(self, hashes):
            self._offer(hashes)

        @rule(hashes=st.lists(HASHES, min_size=1, max_size=4, unique=True), session=st.sampled_from(["a", "b", None]),
              ret=st.sampled_from([None, 0.5, 30.0]), lease=st.sampled_from([None, 2.0]), dt=st.sampled_from([0.0, 1.0]))
        def hint(self, hashes, session, ret, lease, dt):
            """A request's hint, for blocks held or not (yet): every tier's policy hears it, and
            a policy that orders by hints must still keep the chain's contract."""
            self.clock += dt
            self.mgr.hint(hashes, RequestHint(session, ret, 0, lease).at(self.clock))

        @rule(data=st.data(), ok=st.booleans())
        @precondition(lambda self: self.storing)
        def complete_store(self, data, ok):
            self._land(data.draw(st.lists(st.sampled_from(sorted(self.storing)), min_size=1, unique=True)), ok)

        @rule(data=st.data())
        @precondition(lambda self: any(m != "CPU" for load in self.loads for m, _ in load))
        def promote(self, data):
            """What the connector does after a hit below host memory: store the block into the
            CPU tier again while that load may still run; then another request loads the copy."""
            below = sorted({h for load in self.loads for m, hs in load if m != "CPU" for h in hs})
            h = data.draw(st.sampled_from(below))
            if self.cpu.index.contains(h):
                return
            out = self._offer([h])
            if out is None or h not in out.block_hashes_to_store:
                return  # no room, or (reuse filter) its first sighting: not stored
            self._land([h], True)
            ((spec, hs),) = self.mgr.prepare_load_segments([h])
            assert spec.medium() == "CPU"
            self.loads.append([("CPU", hs)])

        @rule(data=st.data(), ok=st.booleans())
        @precondition(lambda self: self.demoting)
        def complete_demotion(self, data, ok):
            dst, hashes, slots, read = self.demoting.pop(data.draw(st.integers(0, len(self.demoting) - 1)))
            if ok:
                for s, h in zip(slots, read):
                    self.data[dst][s] = h
            self.mgr.complete_demotion(hashes, ok, dst)
            self._take_demotions()  # write-through into the next tier

        @rule(hashes=st.lists(HASHES, max_size=5))
        def lookup(self, hashes):
            found = self.mgr.lookup_prefix(hashes)
            live = [t for m, t in self.tiers.items() if m == "CPU" or t.in_service]
            for h, medium in zip(hashes, found.media):
                first = next(t for t in live if t.index.is_ready(h))
                assert first.medium == medium  # the fastest tier holding it
            if found.hits < len(hashes):
                assert not any(t.index.is_ready(hashes[found.hits]) for t in live)
            assert self.mgr.lookup(hashes) == found.hits
            self.mgr.touch(hashes)

        @rule(data=st.data())
        def load(self, data):
            ready = [h for h in range(10) if self.mgr.is_ready(h)]
            if not ready:
                return
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=4, unique=True))
            # The lookup's tiers as a hint, sometimes stale (a local tier that lost the block
            # since): the pins land where each block is. A shared store's tier cannot tell a
            # stale hint (its blocks come and go unseen): what it is told to load and lacks
            # fails the read and is recomputed, so its hints are only ever what it holds.
            media = None
            if data.draw(st.booleans()):
                media = [data.draw(st.sampled_from(sorted(m for m, t in self.tiers.items()
                                                          if t.index.is_ready(h) or not t.batched_lookup)))
                         for h in chosen]
            segments = self.mgr.prepare_load_segments(chosen, media)
            assert [h for _, hs in segments for h in hs] == chosen
            load = []
            for spec, hs in segments:
                medium = str(spec.medium())
                held = [self.data[medium].get(s) for s in spec.block_ids.tolist()]
                assert held == hs, (medium, held, hs)  # never another block's bytes
                if medium != "CPU":
                    assert spec.block_hashes == hs  # the reader checks every record's key
                load.append((medium, hs))
            self.loads.append(load)

        @rule(data=st.data())
        @precondition(lambda self: self.loads)
        def complete_load(self, data):
            for medium, hashes in self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1))):
                self.mgr.complete_load(hashes, medium)

        @rule(data=st.data(), medium=st.sampled_from(order[1:]))
        def drop_corrupt(self, data, medium):
            tier, pinned = self.tiers[medium], self._pins(medium)
            slots = [s for h, s in tier.index.debug_snapshot().index.items() if h not in pinned and tier.index.is_ready(h)]
            if slots and not data.draw(st.integers(0, 3)):  # rare: else the lower tiers rarely hold anything
                slot = data.draw(st.sampled_from(slots))
                h = tier.index.hash_at(slot)
                assert self.mgr.drop_corrupt(medium, [slot]) == 1
                assert not tier.index.contains(h)

        @rule(medium=st.sampled_from(order[1:]), ok=st.booleans(), write=st.booleans())
        def io_outcome(self, medium, ok, write):
            self.mgr.record_io(medium, ok, write)

        @rule(medium=st.sampled_from(order[1:]))
        def outage_ends(self, medium):
            health = self.tiers[medium].health
            health._out_until = min(health._out_until, time.monotonic())  # the retry delay has passed
            assert self.tiers[medium].in_service

        @invariant()
        def ledgers_agree(self):
            for medium, tier in self.tiers.items():
                index = tier.index.debug_snapshot().index
                assert len(set(index.values())) == len(index)
                assert tier.num_free_blocks + len(index) == cap[medium]
                pins = self._pins(medium)
                writing = set(self.storing) if medium == "CPU" else {
                    h for dst, hs, _, _ in self.demoting if dst == medium for h in hs}
                for h, s in index.items():
                    assert tier.index.debug_snapshot().ref_cnt[s] == (-1 if h in writing else pins.get(h, 0)), (medium, h)
                assert set(pins) <= set(index)  # a pinned block is never evicted or dropped

    Chain.TestCase.settings = settings(max_examples=40, stateful_step_count=50, deadline=None,
                                       suppress_health_check=list(HealthCheck))
    return Chain


@pytest.mark.parametrize("threshold", [0, 2], ids=["plain", "reuse-filter"])
@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_two_tier_chain_invariants(policy, threshold):
    make_machine(policy, threshold, remote=False, write_through=False).TestCase().runTest()


@pytest.mark.parametrize("write_through", [False, True], ids=["victims", "write-through"])
@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo"])
def test_three_tier_chain_invariants(policy, write_through):
    make_machine(policy, 0, remote=True, write_through=write_through).TestCase().runTest()
