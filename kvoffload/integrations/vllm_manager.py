"""KVOffloadManager: a kvoffload OffloadingManager behind vLLM's own manager contract.

vLLM's ``OffloadingConnector`` asks its manager one key at a time (``lookup``) and passes a
per-request context; kvoffload's managers answer runs of hashes. This adapter translates the
calls and nothing else: slots, ref-counts, eviction and the reuse filter stay in kvoffload.

Recency follows vLLM 0.32: its scheduler no longer calls ``touch``; a request's accesses are
applied once, in prefix order, when it finishes: blocks it reused (loaded, or offered for
storing while cached) are touched, blocks it only inserted are refreshed (recency, not a
reuse: ARC keeps them in T1). Store offers of absent blocks are shown to the policy first,
so ARC learns from its ghost lists before insertion forgets them (vLLM's ``on_store_miss``).
Tensor-free: this runs in vLLM's scheduler process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics

from kvoffload.config import HintsConfig
from kvoffload.offload.abstract import Medium as KVMedium
from kvoffload.offload.abstract import OffloadingManager as KVOffloadingManager
from kvoffload.offload.abstract import PrepareStoreOutput as KVPrepareStoreOutput
from kvoffload.offload.hints import RequestHint, parse_hint, tenant_digest
from kvoffload.offload.host_tier_chain import as_chain


@dataclass(slots=True)
class _RequestAccess:
    """Keys one request used, in first-seen order, each mapped to "reused" (else: inserted)."""

    generation: int
    keys: dict[OffloadKey, bool] = field(default_factory=dict)
    #: Keys already shown to the policy as store misses: once per request, however often a
    #: full tier makes vLLM offer them again.
    store_misses: set[OffloadKey] = field(default_factory=set)
    #: The request's hint (``kv_transfer_params["kvoffload"]``), given with its keys at its finish,
    #: and its tenant (this route sees no cache salt: the operator's ``hints.tenant_keys`` only).
    hint: RequestHint | None = None
    tenant: bytes = b""


class KVOffloadManager(OffloadingManager):
    def __init__(self, build: Callable[[], KVOffloadingManager], hints: HintsConfig | None = None) -> None:
        self._build = build
        self._hints = hints or HintsConfig()
        self._generation = 0
        self._use(build())

    def _use(self, inner: KVOffloadingManager) -> None:
        self.inner = chain = as_chain(inner)
        #: prepare_store sizes since the last get_stats, and the filter's skip count then.
        self._allocation_sizes: list[int] = []
        self._skipped_reported = chain.report().filter_skipped_blocks
        # vLLM looks keys up one at a time: bind the cheapest single-key checks once (a host
        # tier alone: the C ledger's own methods).
        self._is_ready, self._is_pending = chain.key_probes()
        #: Recency without reuse goes to the host tier's policy (the one stores land in).
        self._refresh = chain.host.refresh

    # ---- helpers -------------------------------------------------------------------------
    def _access(self, ctx: ReqContext) -> _RequestAccess:
        state = ctx.get_state(_RequestAccess)
        if state is None or state.generation != self._generation:
            state = _RequestAccess(self._generation)
            ctx.set_state(state)
        return state

    # ---- vLLM contract -------------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        params = req_context.kv_transfer_params
        if isinstance(params, dict):
            state = self._access(req_context)
            state.hint = parse_hint(params.get("kvoffload"), self._hints.max_priority)
            if state.hint is not None:
                state.tenant = tenant_digest(params.get(k) for k in self._hints.tenant_keys)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._is_ready(key):
            return LookupResult.HIT
        return LookupResult.HIT_PENDING if self._is_pending(key) else LookupResult.MISS

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = self.inner.prepare_load(list(keys))
        seen = self._access(req_context).keys
        for k in keys:
            seen.setdefault(k, True)  # re-reading what this request inserted is not a reuse
        return CPULoadStoreSpec(spec.block_ids)  # vLLM copies it into int32

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.touch(list(keys))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.complete_load(list(keys))

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        offered = list(keys)
        state = self._access(req_context)
        misses = state.store_misses
        fresh = [k for k in offered if k not in misses] if misses else offered
        if fresh:
            misses.update(self.inner.on_store_miss(fresh))
        out = self.inner.prepare_store(offered)
        seen = state.keys
        if out is None or out.block_hashes_to_store:  # vLLM counts each allocation it attempts
            self._allocation_sizes.append(len(out.block_hashes_to_store) if out is not None else sum(
                1 for k in offered if not (self._is_ready(k) or self._is_pending(k))))
        if out is None:  # nothing stored, but the resident chunks it offered are still reuses
            for k in offered:
                if k not in seen and self._is_ready(k):
                    seen[k] = True
            return None
        if len(out.block_hashes_to_store) == len(offered) and seen.keys().isdisjoint(offered):
            # Every offered key is stored fresh and new to this request (the usual store): the
            # loop below in C.
            seen.update(dict.fromkeys(offered, False))
            return self._store_output(out)
        new = set(out.block_hashes_to_store)
        for k in offered:
            if k in new:
                seen.setdefault(k, False)
            elif k not in seen and self._is_ready(k):
                seen[k] = True
        return self._store_output(out)

    @staticmethod
    def _store_output(out: KVPrepareStoreOutput) -> PrepareStoreOutput:
        # The lists are the ledger's fresh ones (the evicted one is also in a removal event,
        # which nobody changes): handed over as they are.
        return PrepareStoreOutput(
            keys_to_store=out.block_hashes_to_store,
            store_spec=CPULoadStoreSpec(out.store_spec.block_ids),  # vLLM copies it into int32
            evicted_keys=out.block_hashes_evicted,
        )

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        self.inner.complete_store(list(keys), success)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestAccess)
        if state is None or state.generation != self._generation or not state.keys:
            return
        chain = list(state.keys) if state.hint is not None else []  # prefix order: a policy reads a chain
        self._recency(state)
        if state.hint is not None:
            self.inner.hint(chain, state.hint.at(time.monotonic(), state.tenant))

    def _recency(self, state: _RequestAccess) -> None:
        """Show the policy the request's keys, reused ones as reuses, the rest as recency."""
        # Already in prefix order: with one full-attention group (all KVOffloadWorker takes) vLLM
        # loads the hit prefix before storing, and stores chunks head to tail. Runs of the same
        # kind go tail first, so the prefix head ends up the most recent.
        keys = state.keys
        flags = list(keys.values())
        reused_head = flags.count(True)
        if flags[:reused_head].count(True) == reused_head:
            # The usual request: the keys it reused (loaded) first, then those it only inserted.
            ordered = list(keys)
            keys.clear()
            if reused_head < len(ordered):
                self._refresh(ordered[reused_head:])
            if reused_head:
                self.inner.touch(ordered[:reused_head])
            return
        runs: list[tuple[bool, list[OffloadKey]]] = []
        for k, reused in keys.items():
            if runs and runs[-1][0] == reused:
                runs[-1][1].append(k)
            else:
                runs.append((reused, [k]))
        state.keys.clear()
        for reused, run in reversed(runs):
            (self.inner.touch if reused else self._refresh)(run)

    def get_stats(self) -> OffloadingConnectorStats:
        """vLLM's own CPU-offload metrics (``vllm:kv_offload_*``) from our ledger: pinned and
        written shares of the tier, allocation sizes, stores the reuse filter skipped."""
        stats = OffloadingConnectorStats()
        report = self.inner.report()
        host = report.tiers[0]
        capacity, reading, writing = host.capacity_blocks, host.pinned_blocks, host.writing_blocks
        usage = (reading + writing) / capacity if capacity else 0.0
        write = writing / capacity if capacity else 0.0
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write, 0.0))
        for size in self._allocation_sizes:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self._allocation_sizes.clear()
        skipped = report.filter_skipped_blocks
        if report.reuse_filter:  # reported only with a filter, as vLLM's own manager does
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, skipped - self._skipped_reported)
            self._skipped_reported = skipped
        return stats

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Host memory as vLLM's CPU medium, every other tier as STORAGE, local unless every
        replica reaches it; each store expects its removal (a tier evicts what it stored), so
        vLLM's event tracker keeps a block's description while any tier holds it."""
        for ev in self.inner.take_events():
            medium = KVMedium.of(ev.medium)
            yield OffloadingEvent(keys=list(ev.block_hashes), medium=Medium.CPU if medium == "CPU" else Medium.STORAGE,
                                  removed=ev.removed, locality=None if medium.shared else Locality.LOCAL,
                                  removal_expected=not ev.removed)

    def reset_cache(self) -> None:
        """Forget every block: vLLM never completes jobs issued before a reset."""
        self.inner.close()
        self._use(self._build())
        self._generation += 1

    def shutdown(self) -> None:
        self.inner.close()
