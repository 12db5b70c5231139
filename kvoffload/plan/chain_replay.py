"""Replay a request log through the device prefix cache and a tier chain, request by request,
making the calls the connector makes, on the same ledgers (the native one where a policy has
one), so what a plan counts is what the engine's tiers would hold.

Per request: the device cache serves its leading blocks; the connector touches the request's
blocks in every tier, looks the rest up down the chain and loads the run it finds (each block
from the first tier holding it); then it offers the blocks the request fills for storing
(from the first block not loaded from host memory: a block loaded from a slower tier is
promoted), and the chain demotes the host tier's victims downwards (or writes through). The
device cache is the engine's free queue (``device_hits``); the requests are taken in the order
the engine would schedule them, one at a time: requests running side by side are not modelled,
so with much concurrency the device holds fewer cached blocks than this assumes.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvoffload.offload import CPUTier
from kvoffload.offload.host_tier_chain import HostTierChain
from kvoffload.offload.ledger_tier import LedgerTier
from kvoffload.plan.device_queue import DeviceQueue
from kvoffload.plan.log_reader import PlanRequest
from kvoffload.plan.tier_spec import PlannedTier
from kvoffload.registry import TIER_KINDS
from kvoffload.tiers.base import TierKind


@dataclass(slots=True)
class ChainCounts:
    """What one configuration's replay counted; ``*_blocks`` arrays have one entry a request."""

    media: list[str]
    #: Blocks each request loaded from each tier (by medium, in chain order).
    loaded_blocks: dict[str, np.ndarray]
    #: Blocks written into each tier (stores into the host tier, demotions and write-through below).
    stored_blocks: dict[str, int] = field(default_factory=dict)


def device_hits(requests: Sequence[PlanRequest], capacity: int, block_tokens: int, output_tokens: int,
                order: Sequence[int] | None = None) -> np.ndarray:
    """Leading blocks of each request the device prefix cache holds (0 with no device cache),
    the requests taken in ``order`` (default: as given); ``output_tokens``: a reply's length
    where the log does not give it.

    The engine's free queue, block for block: a request takes its hit blocks out of it, pops
    its new ones from its head (evicting what they held), and at the end gives all of them back
    to its tail, last block first; a block that never filled (the reply's tail, or reply blocks
    no later prompt shows) holds no hash but takes its place in the queue all the same."""
    out = np.zeros(len(requests), dtype=np.int64)
    if capacity <= 0:
        return out

    def need(r: PlanRequest) -> int:  # blocks the request runs on: its prompt and its reply
        return -(-(r.prompt_tokens + (r.output_tokens or output_tokens) - 1) // block_tokens)

    dev = DeviceQueue(capacity)
    for i in (range(len(requests)) if order is None else order):
        r = requests[i]
        if r.blocks:
            out[i] = hit = dev.lookup(r.blocks)
            if hit:  # in use by the request: not what its new blocks evict
                dev.touch(r.blocks[:hit])
        kept = r.stored[:capacity]
        dev.run(kept, min(need(r), capacity) - len(kept))
    return out


def _blocks(tier: PlannedTier, block_bytes: int, most: int, overhead: tuple[int, int] = (0, 0)) -> int:
    """The tier's size in blocks, at most ``most``: a tier that holds every block the log stores
    never evicts, and its ledger need not be bigger (a petabyte is not allocated slot by slot).
    ``overhead``: what the kind keeps beside each block and in all (``TierKind.storage_overhead``),
    as the engine counts it."""
    per_block, fixed = overhead
    return max(1, min(max(tier.size_bytes - fixed, 0) // (block_bytes + per_block), most))


def build_chain(tiers: Sequence[PlannedTier], block_bytes: int, most: int = 1 << 62) -> HostTierChain:
    host = CPUTier(_blocks(tiers[0], block_bytes, most), tiers[0].policy)
    kinds: list[type[TierKind]] = [TIER_KINDS.load(t.medium) for t in tiers[1:]]
    lower = [LedgerTier(_blocks(t, block_bytes, most, kind.storage_overhead()), t.policy, kind.spec_type)
             for t, kind in zip(tiers[1:], kinds)]
    return HostTierChain(host, *lower, write_through=[t.write_through for t in tiers[1:]])


class _Replayer:
    def __init__(self, tiers: Sequence[PlannedTier], block_bytes: int, block_tokens: int, step_blocks: int,
                 most: int) -> None:
        self.chain = build_chain(tiers, block_bytes, most)
        self.block_tokens = block_tokens
        self.step_blocks = max(1, step_blocks)
        self.media = [t.medium for t in tiers]
        self.medium_of = {str(m): name for m, name in zip(
            [self.chain.primary.medium, *(t.medium for t in self.chain.secondaries)], self.media)}
        self.capacity = self.chain.primary.num_blocks
        self.stored = dict.fromkeys(self.media, 0)

    def _drain_demotions(self) -> None:
        chain = self.chain
        while chain.has_pending_demotions():
            for d in chain.take_demotions():
                medium = d.dst.medium()
                chain.complete_demotion(d.block_hashes, True, medium)
                self.stored[self.medium_of[str(medium)]] += len(d.block_hashes)

    def store(self, keys: list[Hashable]) -> None:
        chain = self.chain
        step = self.capacity if len(keys) <= self.capacity else max(1, self.capacity // 2)
        for lo in range(0, len(keys), step):
            part = keys[lo:lo + step]
            out = chain.prepare_store(part)
            if out is None:
                continue
            chain.touch(part)
            new = list(out.block_hashes_to_store)
            if new:
                chain.complete_store(new)
                self.stored[self.media[0]] += len(new)
            self._drain_demotions()

    def request(self, r: PlanRequest, dev: int, counts: dict[str, int]) -> None:
        chain = self.chain
        blocks = r.blocks
        full = r.stored[: r.prompt_tokens // self.block_tokens]  # the prompt's full blocks
        if full:
            chain.touch(full)
        store_from = 0
        if dev < len(blocks):
            found = chain.lookup_prefix(blocks[dev:])
            hits = found.hits
            if hits:
                keys = blocks[dev:dev + hits]
                store_from = dev + hits
                offset = dev
                for spec, seg in chain.prepare_load_segments(keys, found.media):
                    medium = spec.medium()
                    name = self.medium_of[str(medium)]
                    counts[name] += len(seg)
                    if name != self.media[0]:
                        store_from = min(store_from, offset)
                    chain.complete_load(seg, medium)
                    offset += len(seg)
        # Stored as the engine fills them: the prompt's blocks a step's worth at a time, then
        # each reply block as decoding fills it (each store touches its blocks: the order the
        # tiers evict in follows).
        prompt_end = max(store_from, len(full))
        for lo in range(store_from, prompt_end, self.step_blocks):
            self.store(list(r.stored[lo:min(lo + self.step_blocks, prompt_end)]))
        for k in range(prompt_end, len(r.stored)):
            self.store([r.stored[k]])


def replay_chain(requests: Sequence[PlanRequest], dev_hits: np.ndarray, tiers: Sequence[PlannedTier],
                 block_bytes: int, block_tokens: int, order: Sequence[int] | None = None,
                 progress: Callable[[int], None] | None = None, step_tokens: int = 1 << 30) -> ChainCounts:
    """The chain's loads and stores, the requests taken in ``order`` (default: as given);
    ``step_tokens``: the engine's step budget (a prompt's blocks are stored a step at a time)."""
    most = sum(len(r.stored) for r in requests) + 1  # more than the distinct blocks the log stores
    rep = _Replayer(tiers, block_bytes, block_tokens, step_tokens // block_tokens, most)
    loaded = {m: np.zeros(len(requests), dtype=np.int64) for m in rep.media}
    counts = dict.fromkeys(rep.media, 0)
    for k, i in enumerate(range(len(requests)) if order is None else order):
        for m in counts:
            counts[m] = 0
        rep.request(requests[i], int(dev_hits[i]), counts)
        for m, n in counts.items():
            if n:
                loaded[m][i] = n
        if progress is not None and k % 256 == 255:
            progress(256)
    return ChainCounts(rep.media, loaded, rep.stored)
