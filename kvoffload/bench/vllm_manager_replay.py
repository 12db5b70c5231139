"""kvoffload's manager vs vLLM's CPUOffloadingManager, same trace, same capacity.

Both are driven the way vLLM's OffloadingConnector drives a manager: per request a context,
key-by-key lookups up to the first miss, a load of the hit prefix, a store of the rest, and
the request's finish (where vLLM 0.32 applies recency). Keys are vLLM ``OffloadKey`` bytes.
kvoffload runs twice: behind its vLLM adapter (``KVOffloadManager``, what vLLM would call)
and through its own run-of-hashes API (what kvoffload's connector calls).
Needs vLLM importable: run it with the Python of a vLLM environment.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmCPUManager

from kvoffload.bench.ledger_replay import replay as replay_native
from kvoffload.bench.measure import interleaved
from kvoffload.integrations.vllm_manager import KVOffloadManager
from kvoffload.offload import CPUTier


def as_keys(requests: list[list[int]]) -> list[list[bytes]]:
    cache: dict[int, bytes] = {}
    return [[cache.setdefault(h, make_offload_key(h.to_bytes(8, "big"), 0)) for h in r] for r in requests]


def replay_vllm_protocol(mgr: Any, requests: list[list[bytes]]) -> tuple[int, int, float]:
    """(block operations, blocks hit, seconds) through vLLM's manager contract."""
    ops = hits_total = 0
    hit = LookupResult.HIT
    t0 = time.perf_counter()
    for i, keys in enumerate(requests):
        ctx = ReqContext(str(i))
        mgr.on_new_request(ctx)
        hits = 0
        for k in keys:
            if mgr.lookup(k, ctx) is not hit:
                break
            hits += 1
        ops += min(len(keys), hits + 1)
        if hits:
            head = keys[:hits]
            mgr.prepare_load(head, ctx)
            mgr.complete_load(head, ctx)
            ops += 2 * hits
            hits_total += hits
        out = mgr.prepare_store(keys[hits:], ctx)
        if out is not None:
            mgr.complete_store(out.keys_to_store, ctx)
            ops += 2 * len(out.keys_to_store)
        mgr.on_request_finished(ctx)
    return ops, hits_total, time.perf_counter() - t0


def bytes_per_block(factory: Callable[[], Any], num_blocks: int) -> float:
    """Memory to track ``num_blocks`` ready blocks, the key objects excluded (created first)."""
    keys = as_keys([list(range(10**9, 10**9 + num_blocks))])[0]
    gc.collect()
    tracemalloc.start()
    mgr = factory()
    for i in range(0, num_blocks, 4096):  # one finished request per 4096 blocks
        ctx = ReqContext(str(i))
        mgr.on_new_request(ctx)
        out = mgr.prepare_store(keys[i : i + 4096], ctx)
        mgr.complete_store(out.keys_to_store, ctx)
        mgr.on_request_finished(ctx)
        del ctx
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del mgr
    return current / num_blocks


#: (kvoffload policy, vLLM policy it is measured against, capacity as a share of unique blocks)
CASES = (("lru", "lru", 0.01), ("lru", "lru", 0.05), ("arc", "arc", 0.01), ("arc", "arc", 0.05),
         ("arc_classic", "arc", 0.01), ("arc_classic", "arc", 0.05))


def run(name: str, requests: list[list[int]], reps: int, mem_blocks: int) -> None:
    keys = as_keys(requests)
    refs = sum(map(len, requests))
    unique = len({b for r in requests for b in r})
    print(f"\n== {name}: {len(requests):,} requests, {refs:,} block refs, {unique:,} unique blocks; "
          f"microseconds per block ref, median ± half-range of {reps} interleaved runs")
    print(f"{'case':<20}{'vLLM':>14}{'kvoffload API':>16}{'ratio':>14}{'via adapter':>14}{'ratio':>14}"
          f"{'hit blocks (vLLM / ours)':>28}")
    for ours_policy, vllm_policy, share in CASES:
        capacity = max(1, int(unique * share))

        def vllm_run(c: int = capacity, p: str = vllm_policy) -> float:
            return replay_vllm_protocol(VllmCPUManager(c, cache_policy=p), keys)[2] * 1e6 / refs

        def adapter_run(c: int = capacity, p: str = ours_policy) -> float:
            mgr = KVOffloadManager(lambda: CPUTier(c, cache_policy=p))
            return replay_vllm_protocol(mgr, keys)[2] * 1e6 / refs

        def api_run(c: int = capacity, p: str = ours_policy) -> float:
            return replay_native(CPUTier(c, cache_policy=p), keys)[2] * 1e6 / refs

        m = interleaved({"vllm": vllm_run, "api": api_run, "adapter": adapter_run}, reps)
        vllm_hits = replay_vllm_protocol(VllmCPUManager(capacity, cache_policy=vllm_policy), keys)[1]
        our_hits = replay_native(CPUTier(capacity, cache_policy=ours_policy), keys)[1]
        case = f"{ours_policy} @{share:.0%}"
        v, a, d = m["vllm"], m["api"], m["adapter"]
        print(f"{case:<20}{v.fmt():>14}{a.fmt():>16}{(v.ratio(a)).fmt() + 'x':>14}{d.fmt():>14}"
              f"{(v.ratio(d)).fmt() + 'x':>14}{f'{vllm_hits:,} / {our_hits:,}':>28}")
    print(f"\nbytes per tracked block ({mem_blocks:,} ready blocks, key objects excluded):")
    for policy in ("lru", "arc", "arc_classic"):
        theirs = bytes_per_block(partial(VllmCPUManager, mem_blocks, cache_policy="arc" if policy == "arc_classic" else policy),
                                 mem_blocks)
        ours = bytes_per_block(partial(KVOffloadManager, partial(CPUTier, mem_blocks, cache_policy=policy)),
                               mem_blocks)
        print(f"  {policy:<12} vLLM {theirs:7.1f}   kvoffload {ours:7.1f}   ({ours / theirs:.2f}x)")


def main(requests: list[list[int]], mooncake: list[list[int]] | None, reps: int) -> None:
    import vllm

    print(f"vLLM {vllm.__version__}; ratio = vLLM time / kvoffload time (higher is better); "
          "capacity as a share of the trace's unique blocks")
    if mooncake is not None:
        run("mooncake conversation trace", mooncake, reps, 200_000)
    else:
        run("synthetic prefix-sharing", requests, reps, 200_000)
