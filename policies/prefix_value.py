"""Prefix-value: GreedyDual eviction over a reuse probability learned per kind of KV block.

A KV block is not a page: it is useful only with its whole prefix, it is the tail of one
request or the body of a shared context, it is seen first or again. Reuse differs by an
order of magnitude between those kinds (on the Mooncake conversation trace a request's last
block is reused ~1% of the time, a block seen four times ~78%), so the policy learns, online,
the share of blocks of each *kind* that are seen again, and keeps the blocks whose kind pays.

* **Kind** of a block, fixed at each sighting from the chain the engine offers (``touch``
  gets a request's hashes in prefix order): sightings (1, 2, 3, 4+), distance from the end
  of the request's chain (last, next 3, body), for a first sighting also whether the request
  extends a known chain (a returning conversation) and how many unknown blocks it brings.
* **Learning**: every sighting is an experiment; it succeeds when the block is sighted again
  (reused from the tier, or offered again after eviction) and fails when its hash leaves a
  bounded history of ``history_factor`` x capacity hashes unseen. ``p(kind)`` is the success
  share, counts halved every ``history`` outcomes so the estimate follows the workload.
* **Eviction** is GreedyDual: priority ``L + p(kind)`` at each sighting, where ``L`` is the
  priority of the last victim, so recency and value trade off without a tuning knob. Values
  sit on a 1/64 grid so that equal kinds tie exactly; ties go to recency (the touch call of the
  last sighting), then the deeper block (a tail leaves before its prefix). A heap with lazy
  invalidation keeps every operation O(log n).
* **Admission**: when the tier is full, blocks of kinds worth less than ``admit_threshold``
  are not stored (``admitted``), so a block that rarely returns does not evict one that might.

The native ledger runs this policy with the defaults below (``eviction_policy: prefix_value``);
other parameters take a policy object, which runs on the Python ledger.

A sighting is counted once per request: the engine touches a request's chain more than once
(lookup, then each store), and all those calls end at the same block hash, so a block
touched again by a call ending where its last sighting ended is the same request.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass

from kvoffload.offload.block_status import BlockStatus
from kvoffload.offload.policy import CachePolicy

#: Kind of a block we know nothing about (inserted without a touch, e.g. restored at start).
_DEFAULT_KIND = (1, 2, True, 3)
_GRID = 64.0


def _kind(sightings: int, from_end: int, new_chain: bool, new_blocks: int) -> tuple:
    fe = 0 if from_end == 0 else 1 if from_end < 4 else 2
    if sightings > 1:
        return (min(sightings, 4), fe == 0)
    nb = 0 if new_blocks <= 2 else 1 if new_blocks <= 8 else 2 if new_blocks <= 32 else 3
    return (1, fe, new_chain, nb)


@dataclass(slots=True)
class _Entry:
    block: BlockStatus
    kind: tuple
    sightings: int
    end: Hashable  # last hash of the touch that counted the last sighting
    depth: int
    epoch: int  # the touch call of its last sighting
    priority: float = 0.0
    seq: int = 0  # of its live heap entry; older entries are stale


@dataclass(slots=True)
class _Seen:
    """A hash not in the tier (offered, or evicted): its last sighting, waiting for an outcome."""

    kind: tuple
    sightings: int
    end: Hashable
    depth: int
    epoch: int


class PrefixValueCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int, history_factor: int = 2, prior: tuple[float, float] = (1.0, 3.0),
                 admit_threshold: float = 0.2) -> None:
        super().__init__(cache_capacity)
        if history_factor < 1:
            raise ValueError(f"history_factor={history_factor}: must be >= 1")
        if len(prior) != 2 or min(prior) <= 0:
            raise ValueError(f"prior={prior!r}: give (successes, failures), both > 0, e.g. (1.0, 3.0)")
        if not 0 <= admit_threshold <= 1:
            raise ValueError(f"admit_threshold={admit_threshold}: a reuse share in [0, 1] (0 admits every block)")
        self.blocks: dict[Hashable, _Entry] = {}
        self.history: OrderedDict[Hashable, _Seen] = OrderedDict()
        self.history_size = max(history_factor * cache_capacity, 1024)
        self.heap: list[tuple[float, int, int, int, Hashable]] = []
        self.level = 0.0  # GreedyDual's L
        self._seq = 0
        self.epoch = 0  # touch calls so far
        self.prior = prior
        self.wins: dict[tuple, float] = {}
        self.trials: dict[tuple, float] = {}
        self._outcomes = 0
        self.admit_threshold = admit_threshold

    # ---- learning ------------------------------------------------------------------------
    def value(self, kind: tuple) -> float:
        """Learned share of blocks of this kind that are sighted again."""
        a, b = self.prior
        return (self.wins.get(kind, 0.0) + a) / (self.trials.get(kind, 0.0) + a + b)

    def _outcome(self, kind: tuple, reused: bool) -> None:
        self.trials[kind] = self.trials.get(kind, 0.0) + 1.0
        if reused:
            self.wins[kind] = self.wins.get(kind, 0.0) + 1.0
        self._outcomes += 1
        if self._outcomes >= self.history_size:  # forget slowly: follow a changing workload
            self._outcomes = 0
            for d in (self.wins, self.trials):
                for k in d:
                    d[k] *= 0.5

    def _remember(self, h: Hashable, seen: _Seen) -> None:
        history = self.history
        history[h] = seen
        history.move_to_end(h)
        while len(history) > self.history_size:
            _, old = history.popitem(last=False)
            self._outcome(old.kind, False)

    # ---- ordering ------------------------------------------------------------------------
    def _push(self, h: Hashable, e: _Entry) -> None:
        # Values on a 1/64 grid: equal kinds tie exactly, so recency (the sighting's touch
        # call, then the deeper block first) orders them, not the drift of a learned share.
        e.priority = self.level + int(self.value(e.kind) * _GRID) / _GRID
        self._seq += 1
        e.seq = self._seq
        heapq.heappush(self.heap, (e.priority, e.epoch, -e.depth, self._seq, h))
        if len(self.heap) > 4 * len(self.blocks) + 64:
            self.heap = [(x.priority, x.epoch, -x.depth, x.seq, k) for k, x in self.blocks.items()]
            heapq.heapify(self.heap)

    # ---- the CachePolicy contract --------------------------------------------------------
    def get(self, h: Hashable) -> BlockStatus | None:
        e = self.blocks.get(h)
        return None if e is None else e.block

    def insert(self, h: Hashable, block: BlockStatus) -> None:
        seen = self.history.pop(h, None)
        if seen is None:
            e = _Entry(block, _DEFAULT_KIND, 1, None, 0, self.epoch)
        else:
            e = _Entry(block, seen.kind, seen.sightings, seen.end, seen.depth, seen.epoch)
        self.blocks[h] = e
        self._push(h, e)

    def remove(self, h: Hashable) -> None:
        self.blocks.pop(h, None)  # its heap entry goes stale

    def touch(self, block_hashes: Iterable[Hashable]) -> None:
        hashes = list(block_hashes)
        if not hashes:
            return
        end = hashes[-1]
        n = len(hashes)
        self.epoch += 1
        epoch = self.epoch
        blocks, history = self.blocks, self.history
        known = 0
        while known < n and (hashes[known] in blocks or hashes[known] in history):
            known += 1
        new_chain, new_blocks = known <= 1, n - known
        for i in range(n - 1, -1, -1):  # tail first: the head ends highest among equals
            h = hashes[i]
            e = blocks.get(h)
            if e is not None:
                if e.end == end or e.block.ref_cnt < 0:
                    continue  # this request counted it already, or it is still being written
                self._outcome(e.kind, True)
                e.sightings += 1
                e.kind = _kind(e.sightings, n - 1 - i, new_chain, new_blocks)
                e.end, e.depth, e.epoch = end, i, epoch
                self._push(h, e)
                continue
            seen = history.get(h)
            if seen is not None and seen.end == end:
                continue  # this request's later call (a suffix of its chain): nothing new
            sightings = 1
            if seen is not None:
                sightings = seen.sightings + 1
                self._outcome(seen.kind, True)
            kind = _kind(sightings, n - 1 - i, new_chain, new_blocks)
            self._remember(h, _Seen(kind, sightings, end, i, epoch))

    def admitted(self, block_hashes: list[Hashable]) -> list[Hashable]:
        if len(self.blocks) < self.cache_capacity:
            return block_hashes  # room to spare: storing displaces nothing
        bar = self.admit_threshold
        history, value = self.history, self.value
        out = []
        for h in block_hashes:
            seen = history.get(h)
            if value(seen.kind if seen is not None else _DEFAULT_KIND) >= bar:
                out.append(h)
        return out

    def evict(self, n: int, protected: Collection[Hashable]) -> list[tuple[Hashable, BlockStatus]] | None:
        if n <= 0:
            return []
        blocks, heap = self.blocks, self.heap
        out: list[tuple[Hashable, BlockStatus]] = []
        skipped: list[tuple[float, int, int, int, Hashable]] = []
        while heap and len(out) < n:
            item = heapq.heappop(heap)
            seq, h = item[3], item[4]
            e = blocks.get(h)
            if e is None or e.seq != seq:
                continue  # stale
            if e.block.ref_cnt != 0 or h in protected:
                skipped.append(item)
                continue
            out.append((h, e.block))
        for item in skipped:
            heapq.heappush(heap, item)
        if len(out) < n:  # not enough evictable blocks: change nothing
            for h, _ in out:
                e = blocks[h]
                heapq.heappush(heap, (e.priority, e.epoch, -e.depth, e.seq, h))
            return None
        for h, _ in out:
            e = blocks.pop(h)
            self.level = max(self.level, e.priority)
            self._remember(h, _Seen(e.kind, e.sightings, e.end, e.depth, e.epoch))
        return out
