"""The tiered (CPU -> disk) manager under random interleavings, for every live policy, with and
without the reuse filter: overlapping loads of one hash in two tiers, demotions completing out
of order or failing, corrupt drops, and the disk tier going out of service."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvoffload.offload import CPUOffloadingManager, FilterReusedOffloadingManager
from kvoffload.offload.tiered_manager import TieredOffloadingManager
from kvoffload.tiers.disk.format import DiskLayout
from kvoffload.tiers.disk.tier import DiskOffloadingManager

HASHES = st.integers(min_value=0, max_value=6)
CPU, DISK = 4, 6
LIVE_POLICIES = ["lru", "arc", "s3fifo", "sieve", "lfu", "arc_classic", "prefix_value"]


def make_machine(policy: str, threshold: int):
    class Tiered(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.dir = tempfile.mkdtemp(prefix="kvoffload-sm-")
            self.cpu = CPUOffloadingManager(CPU, policy)
            self.disk = DiskOffloadingManager(self.dir, DiskLayout("sm", 64, 16, DISK), policy)
            chain = TieredOffloadingManager(self.cpu, self.disk)
            # The filter is the chain over the same tiers (it takes over the one it is given).
            self.mgr = FilterReusedOffloadingManager(chain, threshold) if threshold else chain
            self.disk.prepare_store([3, 4, 5, 6])  # a warm disk tier (a restart), so disk hits come early
            self.disk.complete_store([3, 4, 5, 6])
            self.sightings: dict[int, int] = {}
            self.pending: set[int] = set()  # CPU stores in flight
            self.demoting: list[list[int]] = []  # disk writes in flight
            self.loads: list[list[tuple[str, list[int]]]] = []  # per load: (medium, hashes) segments

        def teardown(self) -> None:
            self.disk.close()
            shutil.rmtree(self.dir, ignore_errors=True)

        def _pins(self, medium: str) -> dict[int, int]:
            pins: dict[int, int] = {}
            for load in self.loads:
                for m, hashes in load:
                    if m == medium:
                        for h in hashes:
                            pins[h] = pins.get(h, 0) + 1
            return pins

        @rule(hashes=st.lists(HASHES, min_size=1, max_size=3, unique=True))
        def store(self, hashes):
            cpu_pins = self._pins("CPU")
            before = dict(self.cpu.debug_snapshot().index)
            out = self.mgr.prepare_store(hashes)
            if out is None:
                assert dict(self.cpu.debug_snapshot().index) == before  # atomic
                return
            offered = hashes
            if threshold:
                for h in hashes:
                    self.sightings[h] = self.sightings.get(h, 0) + 1
                assert all(self.sightings[h] >= threshold for h in out.block_hashes_to_store)
                # Like vLLM's filter: only admitted hashes reach (and are protected by) the backing store.
                offered = [h for h in hashes if self.sightings[h] >= threshold]
            for h in out.block_hashes_evicted:
                assert h not in cpu_pins and h not in self.pending and h not in offered
            self.pending |= set(out.block_hashes_to_store)
            for d in self.mgr.take_demotions():
                assert len(d.src) == len(d.dst) == len(d.block_hashes)
                assert set(d.block_hashes) <= set(out.block_hashes_evicted)
                self.demoting.append(list(d.block_hashes))

        @rule(data=st.data(), ok=st.booleans())
        @precondition(lambda self: self.pending)
        def complete_store(self, data, ok):
            chosen = data.draw(st.lists(st.sampled_from(sorted(self.pending)), min_size=1, unique=True))
            self.mgr.complete_store(chosen, ok)
            self.pending -= set(chosen)

        @rule(data=st.data())
        @precondition(lambda self: any(m == "DISK" for load in self.loads for m, _ in load))
        def promote(self, data):
            """What the connector does after a disk hit: store the block into the CPU tier again,
            while the disk load may still be in flight; then another request loads that copy."""
            on_disk = sorted({h for load in self.loads for m, hs in load if m == "DISK" for h in hs})
            h = data.draw(st.sampled_from(on_disk))
            if self.cpu.contains(h):
                return
            out = self.mgr.prepare_store([h])
            if out is not None and threshold:
                self.sightings[h] = self.sightings.get(h, 0) + 1  # the promotion's offer is a sighting
            if out is None or h not in out.block_hashes_to_store:
                return  # no room, or (reuse filter) its first sighting: not stored
            for d in self.mgr.take_demotions():
                self.demoting.append(list(d.block_hashes))
            self.mgr.complete_store([h])
            # Another request hits the promoted copy while the disk load may still run.
            ((spec, hs),) = self.mgr.prepare_load_segments([h])
            assert spec.medium() == "CPU"
            self.loads.append([("CPU", hs)])

        @rule(data=st.data(), ok=st.booleans())
        @precondition(lambda self: self.demoting)
        def complete_demotion(self, data, ok):
            hashes = self.demoting.pop(data.draw(st.integers(0, len(self.demoting) - 1)))  # any order
            self.mgr.complete_demotion(hashes, ok, "DISK")

        @rule(hashes=st.lists(HASHES, max_size=5))
        def lookup_touch(self, hashes):
            n = self.mgr.lookup(hashes)
            disk_ok = self.disk.in_service
            ready = [self.cpu.is_ready(h) or (disk_ok and self.disk.is_ready(h)) for h in hashes]
            assert all(ready[:n]) and (n == len(hashes) or not ready[n])
            self.mgr.touch(hashes)

        @rule(data=st.data())
        def load(self, data):
            disk_ok = self.disk.in_service
            ready = [h for h in range(7) if self.cpu.is_ready(h) or (disk_ok and self.disk.is_ready(h))]
            if not ready:
                return
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
            segments = self.mgr.prepare_load_segments(chosen)
            assert [h for _, hs in segments for h in hs] == chosen
            load = []
            for spec, hs in segments:
                medium = spec.medium()
                assert medium == ("CPU" if self.cpu.is_ready(hs[0]) else "DISK")
                if medium == "DISK":
                    assert spec.block_hashes == hs  # the reader checks every record's key
                load.append((medium, hs))
            self.loads.append(load)

        @rule(data=st.data())
        @precondition(lambda self: self.loads)
        def complete_load(self, data):
            load = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))  # overlapping, any order
            for medium, hashes in load:
                self.mgr.complete_load(hashes, medium)

        @rule(data=st.data())
        def drop_corrupt(self, data):
            if data.draw(st.integers(0, 4)):  # rare: else the disk tier rarely holds anything
                return
            pinned = self._pins("DISK")
            slots = [s for h, s in self.disk.debug_snapshot().index.items() if h not in pinned and self.disk.is_ready(h)]
            if slots:
                slot = data.draw(st.sampled_from(slots))
                h = self.disk.hash_at(slot)
                assert self.mgr.drop_corrupt("DISK", [slot]) == 1
                assert not self.disk.contains(h)

        @rule(ok=st.booleans(), write=st.booleans())
        def io_outcome(self, ok, write):
            self.mgr.record_io("DISK", ok, write)

        @rule()
        @precondition(lambda self: not self.disk.in_service)
        def outage_ends(self):
            self.disk.health._out_until = time.monotonic()  # the retry delay has passed
            assert self.disk.in_service

        @invariant()
        def ledgers_agree(self):
            for tier, medium, cap in ((self.cpu, "CPU", CPU), (self.disk, "DISK", DISK)):
                index = tier.debug_snapshot().index
                assert len(set(index.values())) == len(index)
                assert tier.num_free_blocks + len(index) == cap
                pins = self._pins(medium)
                writing = self.pending if medium == "CPU" else {h for d in self.demoting for h in d}
                for h, s in index.items():
                    assert tier.debug_snapshot().ref_cnt[s] == (-1 if h in writing else pins.get(h, 0)), (medium, h)
                assert set(pins) <= set(index)  # a pinned block is never evicted or dropped

    Tiered.TestCase.settings = settings(max_examples=40, stateful_step_count=50, deadline=None,
                                        suppress_health_check=list(HealthCheck))
    return Tiered


@pytest.mark.parametrize("threshold", [0, 2], ids=["plain", "reuse-filter"])
@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_tiered_manager_invariants(policy, threshold):
    make_machine(policy, threshold).TestCase().runTest()
