"""How much of the LRU -> MIN gap can an online policy close on a trace? Two bounds behind
`examples/policy_experiment.md`:

1. LRU with an *oracle admission*: a block is stored only if the trace references it again
   (perfect knowledge of "will it ever be reused", none of "when"). If this misses the target,
   so does every policy whose admission is a guess and whose order is recency.
2. The reuse share of first-sighting blocks by the kinds `prefix_value` uses (distance from the
   chain's end, new vs returning chain, new blocks in the request): how well what a live engine
   knows separates blocks that come back from blocks that never do.

    python examples/policy_bounds.py ../shared/traces/mooncake_fast25/conversation_trace.jsonl.gz
"""

from __future__ import annotations

import sys
from collections import OrderedDict, defaultdict

from kvoffload_policies.experiment import load_trace


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


def main(path: str) -> None:
    reqs, _, _, _ = load_trace(path, "auto", None)
    unique = len({h for hs in reqs for h in hs})
    again = next_use(reqs)
    print(f"{len(reqs):,} requests, {unique:,} unique blocks")
    for share in (1, 2, 5, 10):
        cap = unique * share // 100
        print(f"{share:>3}%  LRU {lru_hits(reqs, cap, None):6.2f}%   LRU + oracle admission "
              f"{lru_hits(reqs, cap, again):6.2f}%")
    kinds = first_sighting_kinds(reqs, again)
    total = sum(n for n, _ in kinds.values())
    print("first-sighting blocks by kind: share of blocks, share reused later")
    for kind, (n, reused) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {' / '.join(kind):34s} {100 * n / total:5.1f}%  {100 * reused / n:5.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
