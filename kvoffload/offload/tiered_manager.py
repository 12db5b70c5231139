"""TieredOffloadingManager: a CPU tier in front of a disk tier.

Lookups see both tiers (the leading run of blocks ready in either). Stores go to the CPU
tier; its victims are demoted to disk: each demotion is a CPU → disk copy the connector plans
from ``take_demotions()`` and the worker submits before any copy that could overwrite the
victim's CPU slot. Loads come from whichever tier holds each block, CPU first, as per-tier
segments, each pinned in its tier and released by ``complete_load(hashes, medium)``. A block
loaded from disk is promoted by the connector storing it into the CPU tier again.
With ``write_through`` every block whose CPU store completes is also copied to disk (the same
fenced CPU → disk job as a demotion), so the disk holds the whole cache across restarts.
A disk tier out of service after repeated I/O errors is invisible to lookups and demotions.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.offload.abstract import (
    BlockHash,
    Demotion,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
)
from kvoffload.offload.cpu_manager import CPUOffloadingManager
from kvoffload.offload.disk_manager import DiskOffloadingManager
from kvoffload.offload.mediums import CPULoadStoreSpec, DiskLoadStoreSpec


class TieredOffloadingManager(OffloadingManager):
    def __init__(self, cpu: CPUOffloadingManager, disk: DiskOffloadingManager, write_through: bool = False) -> None:
        self.cpu = cpu
        self.disk = disk
        self.write_through = write_through
        self.medium = cpu.medium
        self.block_size = cpu.block_size
        self._demotions: list[Demotion] = []
        self.num_demoted = 0
        self.num_demotions_dropped = 0

    def _ready(self, h: BlockHash, disk_ok: bool) -> bool:
        return self.cpu.is_ready(h) or (disk_ok and self.disk.is_ready(h))

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        disk_ok = self.disk.in_service
        hits = 0
        for h in block_hashes:
            if not self._ready(h, disk_ok):
                break
            hits += 1
        return hits

    def is_pending(self, block_hash: BlockHash) -> bool:
        disk_ok = self.disk.in_service
        return not self._ready(block_hash, disk_ok) and (
            self.cpu.is_pending(block_hash) or (disk_ok and self.disk.is_pending(block_hash))
        )

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = list(block_hashes)
        self.cpu.touch(hashes)
        self.disk.touch(hashes)

    def prepare_load_segments(self, block_hashes: list[BlockHash]) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        """Consecutive runs by tier (CPU preferred), each pinned in its tier; a disk segment's
        spec names its hashes, so the reader can check each record's key."""
        runs: list[tuple[CPUOffloadingManager, list[BlockHash]]] = []
        for h in block_hashes:
            tier = self.cpu if self.cpu.is_ready(h) else self.disk
            if runs and runs[-1][0] is tier:
                runs[-1][1].append(h)
            else:
                runs.append((tier, [h]))
        out: list[tuple[LoadStoreSpec, list[BlockHash]]] = []
        for tier, hashes in runs:
            spec = tier.prepare_load(hashes)
            if tier is self.disk:
                spec = DiskLoadStoreSpec(spec.block_ids, list(hashes))
            out.append((spec, hashes))
        return out

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        segments = self.prepare_load_segments(list(block_hashes))
        if len(segments) != 1:
            for spec, hashes in segments:
                self.complete_load(hashes, spec.medium())
            raise ValueError("these blocks span tiers; use prepare_load_segments()")
        return segments[0][0]

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        """Release the pins of one load: in ``medium``'s tier (required: a hash may be pinned
        in both tiers at once, e.g. loaded from disk, promoted, then loaded from CPU)."""
        if medium is None:
            raise ValueError("TieredOffloadingManager.complete_load needs the medium the load was served from")
        tier = self.disk if medium == self.disk.medium else self.cpu
        tier.complete_load(block_hashes)

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        out = self.cpu.prepare_store(block_hashes)
        if out is None or not out.block_hashes_evicted:
            return out
        self._plan_demotion(list(zip(out.block_hashes_evicted, out.evicted_block_ids)))
        return out

    def _plan_demotion(self, pairs: list[tuple[BlockHash, int]]) -> None:
        """Queue a CPU → disk copy of (hash, CPU slot) pairs the disk tier does not hold yet."""
        if not self.disk.in_service:
            self.num_demotions_dropped += len(pairs)
            return
        pairs = [(h, s) for h, s in pairs if not self.disk.contains(h)]
        if not pairs:
            return
        disk_out = self.disk.prepare_store([h for h, _ in pairs])
        if disk_out is None:
            self.num_demotions_dropped += len(pairs)
        elif disk_out.block_hashes_to_store:
            slot_of = dict(pairs)
            hashes = disk_out.block_hashes_to_store
            dst = DiskLoadStoreSpec(disk_out.store_spec.block_ids, list(hashes))
            self._demotions.append(Demotion(list(hashes), CPULoadStoreSpec([slot_of[h] for h in hashes]), dst))

    def has_pending_demotions(self) -> bool:
        return bool(self._demotions)

    def take_demotions(self) -> list[Demotion]:
        demotions, self._demotions = self._demotions, []
        return demotions

    def complete_demotion(self, block_hashes: list[BlockHash], success: bool) -> None:
        self.disk.complete_store(block_hashes, success)
        if success:
            self.num_demoted += len(block_hashes)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        hashes = list(block_hashes)
        self.cpu.complete_store(hashes, success)
        if success and self.write_through:
            slots = [(h, s) for h in hashes if (s := self.cpu.slot_of(h)) is not None]
            self._plan_demotion(slots)

    def drop_corrupt(self, medium: str, slots: list[int]) -> int:
        return self.disk.drop_slots(slots) if medium == self.disk.medium else 0

    def record_io(self, medium: str, ok: bool, write: bool = False) -> None:
        """A read from (or a write to) ``medium`` succeeded or failed with an I/O error."""
        if medium == self.disk.medium:
            self.disk.note_io(ok, write)

    def take_events(self) -> list[OffloadingEvent]:
        return list(self.cpu.take_events()) + list(self.disk.take_events())

    def stats(self) -> dict[str, int]:
        d = self.disk
        return {"corrupt_blocks": d.num_corrupt, "disk_blocks_recovered": d.num_recovered,
                "disk_io_errors": d.num_io_errors, "disk_outages": d.num_outages,
                "demotions_dropped": self.num_demotions_dropped}

    def close(self) -> None:
        self.disk.close()
