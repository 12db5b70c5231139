"""The textbook block ledger: one Python object per block in OrderedDicts.

It is the baseline of `kvoffload bench manager` and the reference model of the property
tests: the semantics of SPEC section 6, written the most direct way, with no attention to
memory or speed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from itertools import islice


class Block:
    __slots__ = ("block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.ref_cnt = -1
        self.block_id = block_id


class TextbookManager:
    def __init__(self, num_blocks: int, policy: str = "lru") -> None:
        if policy not in ("lru", "arc"):
            raise ValueError(f"policy={policy!r}: the baseline knows lru and arc")
        self.num_blocks = num_blocks
        self.policy = policy
        self.allocated = 0
        self.free: list[int] = []
        self.events: list[tuple[list[Hashable], bool]] = []
        self.lru: OrderedDict[Hashable, Block] = OrderedDict()
        self.t1: OrderedDict[Hashable, Block] = OrderedDict()
        self.t2: OrderedDict[Hashable, Block] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()
        self.target = 0.0

    def get(self, h: Hashable) -> Block | None:
        if self.policy == "lru":
            return self.lru.get(h)
        return self.t1.get(h) or self.t2.get(h)

    def lookup(self, hashes: Iterable[Hashable]) -> int:
        n = 0
        for h in hashes:
            b = self.get(h)
            if b is None or b.ref_cnt < 0:
                break
            n += 1
        return n

    def touch(self, hashes: Iterable[Hashable]) -> None:
        for h in reversed(list(hashes)):
            if self.policy == "lru":
                if h in self.lru:
                    self.lru.move_to_end(h)
            elif h in self.t1:
                b = self.t1.pop(h)
                (self.t2 if b.ref_cnt >= 0 else self.t1)[h] = b
            elif h in self.t2:
                self.t2.move_to_end(h)
            elif h in self.b1:
                self.target = min(self.target + max(1.0, len(self.b2) / len(self.b1)), float(self.num_blocks))
                self.b1.move_to_end(h)
            elif h in self.b2:
                self.target = max(self.target - max(1.0, len(self.b1) / len(self.b2)), 0.0)
                self.b2.move_to_end(h)

    def prepare_load(self, hashes: Iterable[Hashable]) -> list[int]:
        blocks = [self.get(h) for h in hashes]
        assert all(b is not None and b.ref_cnt >= 0 for b in blocks)
        for b in blocks:
            b.ref_cnt += 1  # type: ignore[union-attr]
        return [b.block_id for b in blocks]  # type: ignore[union-attr]

    def complete_load(self, hashes: Iterable[Hashable]) -> None:
        for h in hashes:
            self.get(h).ref_cnt -= 1  # type: ignore[union-attr]

    def _evict(self, n: int, protected: set) -> list[tuple[Hashable, Block]] | None:
        ok = lambda item: item[1].ref_cnt == 0 and item[0] not in protected  # noqa: E731
        if self.policy == "lru":
            victims = list(islice(filter(ok, self.lru.items()), n))
            if len(victims) < n:
                return None
            for h, _ in victims:
                del self.lru[h]
            return victims
        c1 = (item for item in self.t1.items() if ok(item))
        c2 = (item for item in self.t2.items() if ok(item))
        chosen, virtual = [], len(self.t1)
        for _ in range(n):
            item = next(c1, None) if virtual >= int(self.target) else None
            from_t1 = item is not None
            if item is None:
                item = next(c2, None)
            if item is None:
                item, from_t1 = next(c1, None), True
            if item is None:
                return None
            chosen.append((item, from_t1))
            virtual -= from_t1
        for (h, _), from_t1 in chosen:
            del (self.t1 if from_t1 else self.t2)[h]
            (self.b1 if from_t1 else self.b2)[h] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.num_blocks:
                ghost.popitem(last=False)
        return [item for item, _ in chosen]

    def prepare_store(self, hashes: Iterable[Hashable]):
        hashes = list(dict.fromkeys(hashes))
        new = [h for h in hashes if self.get(h) is None]
        free = len(self.free) + self.num_blocks - self.allocated
        evicted: list[Hashable] = []
        if len(new) > free:
            victims = self._evict(len(new) - free, set(hashes))
            if victims is None:
                return None
            for h, b in victims:
                evicted.append(h)
                self.free.append(b.block_id)
            self.events.append((evicted, True))
        slots = []
        for h in new:
            if self.allocated < self.num_blocks:
                slot = self.allocated
                self.allocated += 1
            else:
                slot = self.free.pop()
            slots.append(slot)
            b = Block(slot)
            if self.policy == "lru":
                self.lru[h] = b
            else:
                self.t1[h] = b
                self.b1.pop(h, None)
                self.b2.pop(h, None)
        return new, slots, evicted

    def complete_store(self, hashes: Iterable[Hashable], success: bool = True) -> None:
        done = []
        for h in dict.fromkeys(hashes):
            b = self.get(h)
            if b is None or b.ref_cnt != -1:
                continue
            done.append(h)
            if success:
                b.ref_cnt = 0
            else:
                for d in (self.lru, self.t1, self.t2):
                    d.pop(h, None)
                self.free.append(b.block_id)
        if success and done:
            self.events.append((done, False))
