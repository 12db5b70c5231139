"""HostTierChain: the host (CPU) tier in front of a chain of secondary tiers.

``tiers[0]`` is the host tier (a LedgerTier); ``tiers[1:]`` are any Tiers (disk, a shared store),
slowest last, one per medium; with none it is a chain of one. The chain has no special cases:

- Lookups walk the hashes once; each block is served by the first tier holding it ready
  (secondary tiers out of service are skipped).
- Loads come from whichever tier holds each block, as consecutive per-tier segments, each
  pinned in its tier and released by ``complete_load(hashes, medium)``. A block loaded from a
  secondary tier is promoted by the connector storing it into the host tier again.
- Stores go to the host tier. The victims of tier i are demoted to tier i+1: a copy from
  tier i's slots the connector plans from ``take_demotions()`` and the worker submits before
  any copy that could overwrite those slots. Making room in tier i+1 may evict there too; those
  victims are queued first, so every victim is read before its slot is written again.
- A tier with ``write_through`` also receives every block landing in the tier above it (the
  same fenced job as a demotion), so it holds the whole cache across restarts or replicas.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.offload.abstract import (
    BlockHash,
    BlockNotReadyError,
    Demotion,
    KeyProbes,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrefixLookup,
    PrepareStoreOutput,
    as_list,
)
from kvoffload.offload.chain import TierChain
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.ledger_tier import LedgerTier
from kvoffload.offload.slot_table import SlotTable
from kvoffload.offload.tier import Tier
from kvoffload.offload.tier_report import ChainReport


class BlocksSpanTiersError(ValueError):
    """``prepare_load`` was asked for blocks held in more than one tier."""


def as_chain(manager: OffloadingManager) -> TierChain:
    """What the connector drives: a chain as it is, a lone host-side tier as a chain of one."""
    if isinstance(manager, TierChain):
        return manager
    if isinstance(manager, LedgerTier):
        return HostTierChain(manager)
    raise TypeError(f"{type(manager).__name__}: the connector drives a TierChain; return a "
                    "HostTierChain over your tiers (or a LedgerTier, a chain of one) from get_manager()")


class HostTierChain(TierChain):
    def __init__(self, primary: LedgerTier, *secondaries: Tier,
                 write_through: bool | Sequence[bool] = False) -> None:
        """``primary`` the host tier, ``secondaries`` the slower ones in order; ``write_through``
        (one flag, or one per secondary): tier i+1 receives every block landing in tier i."""
        media = [primary.medium] + [t.medium for t in secondaries]
        if len(set(media)) != len(media):
            raise ValueError(f"tiers {[str(m) for m in media]}: one tier per medium (copies are routed by medium)")
        if isinstance(write_through, bool):
            write_through = [write_through] * len(secondaries)
        if len(write_through) != len(secondaries):
            raise ValueError(f"write_through: {len(write_through)} flags for {len(secondaries)} secondary tiers")
        self.primary = primary
        #: The host tier's index: lookups start there, and the policy that vLLM's recency and
        #: store-miss calls inform is its own.
        self.host: SlotTable = primary.index
        self.secondaries = list(secondaries)
        #: write_through[i]: tier i+1 receives every block landing in tier i.
        self.write_through = [False, *write_through]
        self.medium = primary.medium
        self.block_size = primary.block_size
        tiers: list[Tier] = [primary, *secondaries]
        self._by_medium: dict[str, Tier] = dict(zip(media, tiers))
        self._indexes = [t.index for t in tiers]
        self._index_of: dict[str, int] = {m: i for i, m in enumerate(media)}
        self._demotions: list[Demotion] = []
        self.num_demoted = 0
        self.num_demotions_dropped = 0

    def same_tiers(self) -> tuple[LedgerTier, list[Tier], list[bool]]:
        """What a chain over the same tiers is built from (a subclass adding behaviour, such as
        the reuse filter, takes over a chain built without it)."""
        return self.primary, list(self.secondaries), self.write_through[1:]

    def _tier_of(self, medium: str | None) -> Tier:
        if medium is None:
            if not self.secondaries:  # a chain of one: the only tier
                return self.primary
            raise ValueError("HostTierChain needs the medium of the tier a load or demotion used")
        return self._by_medium[medium]

    # ---- lookups and loads ---------------------------------------------------------------
    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> PrefixLookup:
        hashes = as_list(block_hashes)
        # The leading run in host memory through the ledger's vectorised lookup (the common
        # case: a prefix in DRAM, then perhaps a tail further down); then block by block
        # through the local tiers; a tier whose ledger is a shared store is asked once, in one
        # batch, for the run the local tiers miss.
        cpu_hits = self.host.lookup(hashes)
        media: list[Medium] = [self.primary.medium] * cpu_hits
        if cpu_hits == len(hashes):
            return PrefixLookup(media, LookupResult.HIT)
        secondaries = [t for t in self.secondaries if t.in_service]
        local: list[Tier] = [self.primary]
        local += [t for t in secondaries if not t.batched_lookup]
        remote = [t for t in secondaries if t.batched_lookup]
        i = cpu_hits
        while i < len(hashes):
            h = hashes[i]
            tier = next((t for t in local if t.index.is_ready(h)), None)
            if tier is None and remote:
                batched, remote = remote, []  # one round trip per lookup, whatever follows
                for t in batched:
                    run = t.lookup_run(hashes[i:])
                    if run is None:
                        return PrefixLookup(media, LookupResult.RETRY)
                    if run:
                        media.extend([t.medium] * run)
                        i += run
                        break
                continue  # past the run (or, with none, back to a miss at the same block)
            if tier is None:
                # Worth a step's wait only while the block is on its way into host memory (a
                # memory copy); a demotion into a slower tier may take seconds (a throttled or
                # saturated disk held every waiting request back): the hit ends here.
                pending = self.host.is_pending(h)
                return PrefixLookup(media, LookupResult.HIT_PENDING if pending else LookupResult.MISS)
            media.append(tier.medium)
            i += 1
        return PrefixLookup(media, LookupResult.HIT)

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        if not self.secondaries:  # a chain of one: the ledger's own lookup
            return self.host.lookup(block_hashes)
        return self.lookup_prefix(list(block_hashes)).hits

    # The host tier, then the secondaries in service: what a lookup may use now. Asked per
    # block (the reuse filter, vLLM's one-key lookups), so no list is built per call.
    def is_ready(self, block_hash: BlockHash) -> bool:
        return self.host.is_ready(block_hash) or any(
            t.index.is_ready(block_hash) for t in self.secondaries if t.in_service)

    def is_pending(self, block_hash: BlockHash) -> bool:
        return not self.is_ready(block_hash) and (self.host.is_pending(block_hash) or any(
            t.index.is_pending(block_hash) for t in self.secondaries if t.in_service))

    def key_probes(self) -> KeyProbes:
        """A chain of the host tier alone answers as that tier does (unless a subclass answers
        these itself): vLLM's adapter then asks the ledger directly, not through three frames."""
        own = type(self).is_ready is HostTierChain.is_ready and type(self).is_pending is HostTierChain.is_pending
        return self.host.key_probes() if own and not self.secondaries else (self.is_ready, self.is_pending)

    def sole_table(self) -> SlotTable | None:
        cls = type(self)  # a subclass changing a verb a caller of the table skips is more than it
        plain = (cls.prepare_load is HostTierChain.prepare_load and cls.complete_load is HostTierChain.complete_load
                 and cls.prepare_store is HostTierChain.prepare_store
                 and cls.complete_store is HostTierChain.complete_store
                 and cls.on_store_miss is HostTierChain.on_store_miss and cls.touch is HostTierChain.touch)
        return self.primary.sole_table() if plain and not self.secondaries else None

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = as_list(block_hashes)
        for index in self._indexes:
            index.touch(hashes)

    def prepare_load_segments(self, block_hashes: list[BlockHash], media: Sequence[Medium] | None = None,
                              ) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        """Consecutive runs by tier (the fastest holding each block, or the tier ``media`` names:
        the lookup's answer, so no tier is asked twice), each pinned in its tier; a secondary
        tier's spec names its hashes, so the reader can check each record's key. A tier that
        went out of service since the lookup still serves what it holds (a failed read is
        reported and recomputed)."""
        hashes = list(block_hashes)
        if not self.secondaries:  # a chain of one: every block is the host tier's
            return [(self.primary.prepare_load(hashes), hashes)] if hashes else []
        if media is not None and len(media) == len(hashes) and all(m in self._by_medium for m in media):
            try:
                return self._pin_runs(self._runs(hashes, [self._by_medium[m] for m in media]))
            except BlockNotReadyError:
                pass  # a block left the tier the lookup found it in: ask the tiers afresh
        tiers: list[Tier] = [self.primary, *self.secondaries]
        # A miss falls to the last tier, whose prepare_load fails with BlockNotReadyError.
        found = [next((t for t in tiers if t.index.is_ready(h)), tiers[-1]) for h in hashes]
        return self._pin_runs(self._runs(hashes, found))

    @staticmethod
    def _runs(hashes: list[BlockHash], tiers: list[Tier]) -> list[tuple[Tier, list[BlockHash]]]:
        runs: list[tuple[Tier, list[BlockHash]]] = []
        for h, tier in zip(hashes, tiers):
            if runs and runs[-1][0] is tier:
                runs[-1][1].append(h)
            else:
                runs.append((tier, [h]))
        return runs

    @staticmethod
    def _pin_runs(runs: list[tuple[Tier, list[BlockHash]]]) -> list[tuple[LoadStoreSpec, list[BlockHash]]]:
        """Pin each run in its tier; all or nothing (a run that fails releases those before it)."""
        out: list[tuple[LoadStoreSpec, list[BlockHash]]] = []
        try:
            for tier, hashes in runs:
                out.append((tier.prepare_load(hashes), hashes))
        except BlockNotReadyError:
            for (tier, hashes), _ in zip(runs, out):
                tier.complete_load(hashes)
            raise
        return out

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> LoadStoreSpec:
        """The one-tier form of ``prepare_load_segments``: blocks that span tiers cannot be one
        spec, so they are refused (nothing stays pinned); the connector loads by segments. No
        blocks is an empty load of the host tier, as in vLLM's managers."""
        hashes = list(block_hashes)
        if not hashes or not self.secondaries:  # a chain of one: the host tier's
            return self.primary.prepare_load(hashes)
        segments = self.prepare_load_segments(hashes)
        if len(segments) != 1:
            for spec, hashes in segments:
                self.complete_load(hashes, spec.medium())
            media = ", ".join(str(spec.medium()) for spec, _ in segments)
            raise BlocksSpanTiersError(f"these blocks lie in {len(segments)} tier segments ({media}); "
                                       "load them with prepare_load_segments()")
        return segments[0][0]

    def complete_load(self, block_hashes: Iterable[BlockHash], medium: str | None = None) -> None:
        """Release the pins of one load in ``medium``'s tier (required: a hash may be pinned in
        two tiers at once, e.g. loaded from disk, promoted, then loaded from CPU)."""
        self._tier_of(medium).complete_load(block_hashes)

    # ---- stores and demotions ------------------------------------------------------------
    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> PrepareStoreOutput | None:
        out = self.primary.prepare_store(block_hashes)
        if out is not None and out.block_hashes_evicted and self.secondaries:
            self._demote(0, list(zip(out.block_hashes_evicted, out.evicted_block_ids)))
        return out

    def _src_spec(self, i: int, slots: list[int], hashes: list[BlockHash]) -> LoadStoreSpec:
        if i == 0:
            return self.primary.slot_spec(slots, hashes)
        return self.secondaries[i - 1].slot_spec(slots, hashes)

    def _demote(self, i: int, pairs: list[tuple[BlockHash, int]]) -> None:
        """Queue a copy of (hash, slot in tier i) pairs into tier i+1, where it lacks them."""
        if i + 1 > len(self.secondaries) or not pairs:
            return  # the last tier's victims leave the chain
        target = self.secondaries[i]
        if not target.in_service:
            self.num_demotions_dropped += len(pairs)
            return
        contains = target.index.contains
        pairs = [(h, s) for h, s in pairs if not contains(h)]
        if not pairs:
            return
        out = target.prepare_store([h for h, _ in pairs])
        if out is None:
            self.num_demotions_dropped += len(pairs)
            return
        if out.block_hashes_evicted:  # read them out of their slots before this copy overwrites them
            self._demote(i + 1, list(zip(out.block_hashes_evicted, out.evicted_block_ids)))
        if out.block_hashes_to_store:
            slot_of = dict(pairs)
            hashes = list(out.block_hashes_to_store)
            src = self._src_spec(i, [slot_of[h] for h in hashes], hashes)
            dst = target.slot_spec(out.store_spec.block_ids.tolist(), hashes)
            self._demotions.append(Demotion(hashes, src, dst))

    def has_pending_demotions(self) -> bool:
        return bool(self._demotions)

    def take_demotions(self) -> list[Demotion]:
        demotions, self._demotions = self._demotions, []
        return demotions

    def complete_demotion(self, block_hashes: list[BlockHash], success: bool, medium: str) -> None:
        i = self._index_of[medium]
        tier = self.secondaries[i - 1]
        tier.complete_store(block_hashes, success)
        if success:
            self.num_demoted += len(block_hashes)
            self._write_through(i, block_hashes)

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        hashes = as_list(block_hashes)
        self.primary.complete_store(hashes, success)
        if success and self.secondaries:
            self._write_through(0, hashes)

    def _write_through(self, i: int, hashes: list[BlockHash]) -> None:
        """Blocks landed in tier i: copy them on if tier i+1 is written through."""
        if i + 1 < len(self.write_through) and self.write_through[i + 1]:
            tier = self.primary if i == 0 else self.secondaries[i - 1]
            self._demote(i, [(h, s) for h in hashes if (s := tier.index.slot_of(h)) is not None])

    # ---- faults, events, report ----------------------------------------------------------
    def drop_corrupt(self, medium: str, slots: list[int]) -> int:
        tier = self._by_medium.get(medium)
        return tier.drop_slots(slots) if tier is not None else 0

    def record_io(self, medium: str, ok: bool, write: bool = False) -> None:
        tier = self._by_medium.get(medium)
        if tier is not None:
            tier.note_io(ok, write)

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        return self.host.store_miss(block_hashes)

    def hint(self, block_hashes: Sequence[BlockHash], hint: BlockHint) -> None:
        for index in self._indexes:
            index.hint(block_hashes, hint)

    def take_events(self) -> list[OffloadingEvent]:
        events = list(self.primary.take_events())
        for t in self.secondaries:
            events.extend(t.take_events())
        return events

    def report(self) -> ChainReport:
        return ChainReport([self.primary.report(), *(t.report() for t in self.secondaries)],
                           demotions_dropped=self.num_demotions_dropped)

    def close(self) -> None:
        for t in self.secondaries:
            t.close()
