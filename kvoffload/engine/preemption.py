"""What preempting a request does to it: its KV is swapped out through the connector where
swap preemption is on (and the connector takes it), its blocks are freed, and it restarts from
token 0 (or from the swapped tokens, which the connector loads back at admission)."""

from __future__ import annotations

from kvoffload.connector.base import KVConnectorBase
from kvoffload.engine.kv_cache_manager import KVCacheManager
from kvoffload.engine.request import Request, RequestStatus
from kvoffload.engine.scheduler_stats import SchedulerStats


def release_preempted(request: Request, kv_cache_manager: KVCacheManager, swap_to: KVConnectorBase | None,
                      stats: SchedulerStats) -> None:
    """Free ``request``'s blocks and mark it preempted; ``swap_to``: the connector to swap its
    computed KV out to first (None: recompute preemption)."""
    request.swapped_tokens = 0
    request.computed_before_preemption = max(request.computed_before_preemption, request.num_computed_tokens)
    # A copy-on-write planned this step for this request never runs: swap out the source.
    redirect = kv_cache_manager.cancel_copy_on_write(request.request_id)
    if swap_to is not None:
        groups = kv_cache_manager.get_block_ids(request.request_id)
        ids = tuple([redirect.get(b, b) for b in group] for group in groups)
        if swap_to.swap_out(request, ids):
            request.swapped_tokens = request.num_computed_tokens
            stats.swapped_out_tokens += request.num_computed_tokens
    kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    stats.preemptions += 1
