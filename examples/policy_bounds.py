"""How much of the LRU -> MIN gap can an online policy close on a trace? Three bounds behind
`examples/policy_experiment.md`:

1. LRU with an *oracle admission*: a block is stored only if the trace references it again
   (perfect knowledge of "will it ever be reused", none of "when"). If this misses the target,
   so does every policy whose admission is a guess and whose order is recency.
2. The reuse share of first-sighting blocks by the kinds `prefix_value` uses (distance from the
   chain's end, new vs returning chain, new blocks in the request): how well what a live engine
   knows separates blocks that come back from blocks that never do.
3. `prefix_value`'s own scheme fed the *true* reuse share of every kind, measured over the
   whole trace in advance (GreedyDual order, admission above a threshold, the best of several
   thresholds): the ceiling of what learning those shares online could reach.

    python examples/policy_bounds.py ../shared/traces/mooncake_fast25/conversation_trace.jsonl.gz
"""

from __future__ import annotations

import heapq
import sys
from collections import OrderedDict, defaultdict

from kvoffload_policies.experiment import load_trace
from kvoffload_policies.prefix_value import _kind


def next_use(reqs: list[list]) -> list[list[bool]]:
    """For each reference: is the block referenced again later?"""
    seen: set = set()
    out: list[list[bool]] = []
    for hs in reversed(reqs):
        out.append([h in seen for h in hs])
        seen.update(hs)
    return out[::-1]


def lru_hits(reqs: list[list], capacity: int, admit: list[list[bool]] | None) -> float:
    """Prefix hits of LRU (a request's head most recent), storing only admitted misses."""
    cache: OrderedDict = OrderedDict()
    hits = refs = 0
    for r, hs in enumerate(reqs):
        refs += len(hs)
        k = 0
        while k < len(hs) and hs[k] in cache:
            k += 1
        hits += k
        for i in range(len(hs) - 1, -1, -1):
            h = hs[i]
            if h in cache or (i >= k and (admit is None or admit[r][i])):
                cache[h] = None
                cache.move_to_end(h)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return 100 * hits / refs


def first_sighting_kinds(reqs: list[list], again: list[list[bool]]) -> dict[tuple, list[int]]:
    seen: set = set()
    kinds: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r, hs in enumerate(reqs):
        known = 0
        while known < len(hs) and hs[known] in seen:
            known += 1
        n = len(hs)
        for i, h in enumerate(hs):
            if h in seen:
                continue
            fe = "last" if i == n - 1 else "next 3" if n - 1 - i < 4 else "body"
            kind = (fe, "new chain" if known <= 1 else "returning", "<=8 new" if n - known <= 8 else ">8 new")
            kinds[kind][0] += 1
            kinds[kind][1] += again[r][i]
        seen.update(hs)
    return kinds


def kinds_of(reqs: list[list]) -> list[list[tuple]]:
    """The kind of every reference, as prefix_value assigns it at that sighting."""
    sightings: dict = {}
    out = []
    for hs in reqs:
        n, known = len(hs), 0
        while known < n and hs[known] in sightings:
            known += 1
        row = []
        for i, h in enumerate(hs):
            sightings[h] = sightings.get(h, 0) + 1
            row.append(_kind(sightings[h], n - 1 - i, known <= 1, n - known))
        out.append(row)
    return out


def greedy_dual_with_true_shares(reqs: list[list], capacity: int, kinds: list[list[tuple]],
                                 share: dict[tuple, float], threshold: float) -> float:
    prio: dict = {}
    heap: list = []
    level = 0.0
    hits = refs = 0
    for r, hs in enumerate(reqs):
        refs += len(hs)
        k = 0
        while k < len(hs) and hs[k] in prio:
            k += 1
        hits += k
        for i, h in enumerate(hs):
            p = share[kinds[r][i]]
            if h not in prio and (i < k or (len(prio) >= capacity and p < threshold)):
                continue
            prio[h] = level + p - 1e-7 * i
            heapq.heappush(heap, (prio[h], r, i, h))
        while len(prio) > capacity:
            v, _, _, h = heapq.heappop(heap)
            if prio.get(h) == v:
                del prio[h]
                level = v
    return 100 * hits / refs


def main(path: str) -> None:
    reqs, _, _, _ = load_trace(path, "auto", None)
    unique = len({h for hs in reqs for h in hs})
    again = next_use(reqs)
    kinds = kinds_of(reqs)
    tally: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r, row in enumerate(kinds):
        for i, kind in enumerate(row):
            tally[kind][0] += 1
            tally[kind][1] += again[r][i]
    share = {kind: reused / n for kind, (n, reused) in tally.items()}
    print(f"{len(reqs):,} requests, {unique:,} unique blocks")
    for pct in (1, 2, 5, 10):
        cap = unique * pct // 100
        best = max(greedy_dual_with_true_shares(reqs, cap, kinds, share, t) for t in (0.0, 0.2, 0.3, 0.45))
        print(f"{pct:>3}%  LRU {lru_hits(reqs, cap, None):6.2f}%   LRU + oracle admission "
              f"{lru_hits(reqs, cap, again):6.2f}%   prefix_value's scheme with true kind shares {best:6.2f}%")
    first = first_sighting_kinds(reqs, again)
    total = sum(n for n, _ in first.values())
    print("first-sighting blocks by kind: share of blocks, share reused later")
    for kind, (n, reused) in sorted(first.items(), key=lambda kv: -kv[1][0]):
        print(f"  {' / '.join(kind):34s} {100 * n / total:5.1f}%  {100 * reused / n:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
