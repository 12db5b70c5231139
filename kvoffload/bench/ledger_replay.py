"""Replaying block-hash requests against a ledger the way the connector drives it, shared by
the ledger benchmarks (ours vs the textbook design, ours vs vLLM's)."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Hashable, Sequence
from typing import Any


def replay(mgr: Any, requests: Sequence[Sequence[Hashable]]) -> tuple[int, int, float]:
    """(block operations, blocks hit, seconds)."""
    ops = hits_total = 0
    t0 = time.perf_counter()
    for hashes in requests:
        hits = mgr.lookup(hashes)
        mgr.touch(hashes)
        ops += 2 * len(hashes)
        if hits:
            head = hashes[:hits]
            mgr.prepare_load(head)
            mgr.complete_load(head)
            ops += 2 * hits
            hits_total += hits
        out = mgr.prepare_store(hashes[hits:])
        if out is not None:
            stored = out[0] if isinstance(out, tuple) else out.block_hashes_to_store
            mgr.complete_store(stored)
            ops += 2 * len(stored)
    return ops, hits_total, time.perf_counter() - t0


def bytes_per_block(factory, num_blocks: int) -> float:
    """Memory to track ``num_blocks`` ready blocks (the hash keys themselves excluded)."""
    keys = list(range(10**9, 10**9 + num_blocks))
    gc.collect()
    tracemalloc.start()
    mgr = factory()
    chunk = 4096
    for i in range(0, num_blocks, chunk):
        out = mgr.prepare_store(keys[i : i + chunk])
        stored = out[0] if isinstance(out, tuple) else out.block_hashes_to_store
        mgr.complete_store(stored)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del mgr
    return current / num_blocks
