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
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmCPUManager

from kvoffload.bench.ledger_replay import replay as replay_native
from kvoffload.integrations.vllm_manager import KVOffloadManager
from kvoffload.offload import CPUOffloadingManager


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


def run(name: str, requests: list[list[int]], capacity: int, mem_blocks: int) -> None:
    keys = as_keys(requests)
    print(f"\n== {name}: {len(requests):,} requests, {sum(map(len, requests)):,} block refs, "
          f"capacity {capacity:,} slots")
    print(f"{'policy':<6} {'impl':<22} {'Mops/s':>8} {'hit blocks':>11} {'bytes/block':>12}")
    for policy in ("lru", "arc"):
        def ours(n: int, p: str = policy) -> KVOffloadManager:
            return KVOffloadManager(lambda: CPUOffloadingManager(n, cache_policy=p))

        def theirs(n: int, p: str = policy) -> Any:
            return VllmCPUManager(n, cache_policy=p)

        vllm_ops, vllm_hits, vllm_s = replay_vllm_protocol(VllmCPUManager(capacity, cache_policy=policy), keys)
        ad_ops, ad_hits, ad_s = replay_vllm_protocol(ours(capacity), keys)
        nat_ops, nat_hits, nat_s = replay_native(CPUOffloadingManager(capacity, cache_policy=policy), keys)
        vllm_mem = bytes_per_block(lambda: theirs(mem_blocks), mem_blocks)
        ours_mem = bytes_per_block(lambda: ours(mem_blocks), mem_blocks)
        v_rate = vllm_ops / vllm_s / 1e6
        rows = [("vLLM CPUOffloadingManager", v_rate, vllm_hits, vllm_mem),
                ("kvoffload via adapter", ad_ops / ad_s / 1e6, ad_hits, ours_mem),
                ("kvoffload native API", nat_ops / nat_s / 1e6, nat_hits, ours_mem)]
        for label, rate, hits, mem in rows:
            print(f"{policy:<6} {label:<22} {rate:8.2f} {hits:11,} {mem:12.1f}")
        for label, rate, hits, mem in rows[1:]:
            diff = (hits - vllm_hits) / max(1, vllm_hits)
            print(f"{policy:<6} {'ratio, ' + label.split()[-1]:<22} {rate / v_rate:8.2f}x {diff:+10.2%} "
                  f"{mem / vllm_mem:12.2f}x")


def main(requests: list[list[int]], mooncake: list[list[int]] | None, capacity: int) -> None:
    import vllm

    print(f"vLLM {vllm.__version__}; ratios are kvoffload / vLLM (ops/s: higher is better; bytes: lower is; "
          "hit difference relative to vLLM)")
    mem_blocks = min(capacity, 200_000)
    unique = len({b for r in requests for b in r})
    run("synthetic prefix-sharing", requests, capacity, mem_blocks)
    run("synthetic, capacity 10% of unique blocks", requests, max(1, unique // 10), mem_blocks)
    if mooncake is not None:
        unique = len({b for r in mooncake for b in r})
        run("mooncake conversation trace", mooncake, capacity, mem_blocks)
        run(f"mooncake at 5% of {unique:,} unique blocks", mooncake, max(1, unique // 20), mem_blocks)
