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
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
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
from kvoffload.offload.abstract import SlotIds
from kvoffload.offload.chain_writes import ChainWrites
from kvoffload.offload.hints import RequestHint, parse_hint, tenant_digest
from kvoffload.offload.host_tier_chain import as_chain
from kvoffload.offload.slot_table import Shown


@dataclass(slots=True)
class _RequestAccess:
    """Keys one request used, in first-seen order, each "reused" or "inserted"."""

    generation: int
    #: While no key can have been seen twice (one load, then one store of fresh keys: the usual
    #: request), the keys as they came, in runs of one kind: (reused, keys). A list per call
    #: instead of a dict entry per key.
    runs: list[tuple[bool, list[OffloadKey]]] = field(default_factory=list)
    #: Otherwise each key once, mapped to "reused" (first seen wins); the runs are folded in.
    keys: dict[OffloadKey, bool] | None = None
    #: Keys already shown to the policy as store misses: once per request, however often a
    #: full tier makes vLLM offer them again (a list until a second store needs to skip some).
    store_misses: Shown = field(default_factory=list)
    #: The request's hint (``kv_transfer_params["kvoffload"]``), given with its keys at its finish,
    #: and its tenant (this route sees no cache salt: the operator's ``hints.tenant_keys`` only).
    hint: RequestHint | None = None
    tenant: bytes = b""

    def seen(self) -> dict[OffloadKey, bool]:
        """The keys as one map, the runs folded in (from here on, every call adds to it)."""
        if self.keys is None:
            self.keys = {}
            for reused, run in self.runs:
                for k in run:
                    self.keys.setdefault(k, reused)
            self.runs.clear()
        return self.keys


def runs_distinct(a: list[OffloadKey], b: list[OffloadKey]) -> bool:
    """A request's two runs (a load, a store) hold each key once: a loaded key can have left the
    tier and been stored again by the same request (then its first-seen map decides)."""
    if len(a) > len(b):
        a, b = b, a
    return set(a).isdisjoint(b)  # a set of the shorter run, the longer one read through


_new_spec = CPULoadStoreSpec.__new__


def cpu_spec(slots: Sequence[int] | SlotIds) -> CPULoadStoreSpec:
    """vLLM's spec of these host slots, as its constructor makes it (``block_ids``, an int32
    vector) for a third of the cost: the constructor runs numpy's general conversion on every
    call, twice per request here (a test holds the two equal, attribute for attribute)."""
    spec = _new_spec(CPULoadStoreSpec)
    spec.block_ids = slots.astype(np.int32) if type(slots) is np.ndarray else np.array(slots, np.int32)
    return spec


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
        # vLLM calls once per key and per small run: bind the cheapest callables once. A chain
        # that is its host tier's table and nothing more (no events, no other tier, no filter)
        # is written to directly, in C where the native ledger runs: a Python frame per call
        # costs a tenth of the ledger's time.
        self._is_ready, self._is_pending = chain.key_probes()
        table = chain.sole_table()
        writes = table if table is not None else ChainWrites(chain)
        self._allocate, self._complete = writes.allocate, writes.complete
        self._pin, self._unpin, self._touch = writes.pin, writes.unpin, writes.touch
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
        hashes = keys if type(keys) is list else list(keys)  # vLLM passes lists: no copy, no frame
        slots = self._pin(hashes)
        state = req_context.get_state(_RequestAccess)  # _access, its usual case without a frame
        if state is None or state.generation != self._generation:
            state = self._access(req_context)
        if state.keys is None and not state.runs:  # the request's first keys: nothing to repeat
            state.runs.append((True, hashes))
        else:
            seen = state.seen()
            for k in hashes:
                seen.setdefault(k, True)  # re-reading what this request inserted is not a reuse
        return cpu_spec(slots)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._touch(list(keys))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._unpin(keys if type(keys) is list else list(keys))

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        offered = keys if type(keys) is list else list(keys)
        state = req_context.get_state(_RequestAccess)  # _access, its usual case without a frame
        if state is None or state.generation != self._generation:
            state = self._access(req_context)
        shown = state.store_misses
        if shown and type(shown) is list:  # a second store: skip what the first one showed
            shown = state.store_misses = set(shown)
        out = self._allocate(offered, shown, False)  # no tier behind to demote the victims into
        if out is None:  # nothing stored, but the resident chunks it offered are still reuses
            self._allocation_sizes.append(sum(1 for k in offered if not (self._is_ready(k) or self._is_pending(k))))
            seen = state.seen()
            for k in offered:
                if k not in seen and self._is_ready(k):
                    seen[k] = True
            return None
        new = out.new
        if new:
            self._allocation_sizes.append(len(new))  # vLLM counts each allocation it attempts
        runs = state.runs
        if len(new) == len(offered) and state.keys is None and (not runs or (len(runs) == 1 and runs[0][0])):
            # Every offered key stored fresh, after at most a load (the usual store): one run.
            runs.append((False, offered))
        else:
            stored = set(new)
            seen = state.seen()
            for k in offered:
                if k in stored:
                    seen.setdefault(k, False)
                elif k not in seen and self._is_ready(k):
                    seen[k] = True
        # The lists are the ledger's fresh ones (the evicted one is also in a removal event,
        # which nobody changes): handed over as they are.
        return PrepareStoreOutput(keys_to_store=new, store_spec=cpu_spec(out.slots), evicted_keys=out.evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        self._complete(keys if type(keys) is list else list(keys), success)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestAccess)
        if state is None or state.generation != self._generation:
            return
        runs = state.runs
        if state.keys is None and state.hint is None and (len(runs) < 2 or runs_distinct(runs[0][1], runs[1][1])):
            # Runs of one kind, applied tail first, so the prefix head ends up the most recent.
            for reused, run in reversed(runs):
                (self._touch if reused else self._refresh)(run)
            runs.clear()
            return
        keys = state.seen()
        if not keys:
            return
        chain = list(keys) if state.hint is not None else []  # prefix order: a policy reads a chain
        self._recency(keys)
        if state.hint is not None:
            self.inner.hint(chain, state.hint.at(time.monotonic(), state.tenant))

    def _recency(self, keys: dict[OffloadKey, bool]) -> None:
        """Show the policy the request's keys, reused ones as reuses, the rest as recency."""
        # Already in prefix order: with one full-attention group (all KVOffloadWorker takes) vLLM
        # loads the hit prefix before storing, and stores chunks head to tail. Runs of the same
        # kind go tail first, so the prefix head ends up the most recent.
        runs: list[tuple[bool, list[OffloadKey]]] = []
        for k, reused in keys.items():
            if runs and runs[-1][0] == reused:
                runs[-1][1].append(k)
            else:
                runs.append((reused, [k]))
        keys.clear()
        for reused, run in reversed(runs):
            (self._touch if reused else self._refresh)(run)

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
