"""KVOffloadManager: a kvoffload OffloadingManager behind vLLM's own manager contract.

vLLM's ``OffloadingConnector`` asks its manager one key at a time (``lookup``) and passes a
per-request context; kvoffload's managers answer runs of hashes. This adapter translates the
calls and nothing else: slots, ref-counts, eviction and the reuse filter stay in kvoffload.

Recency follows vLLM 0.32: its scheduler no longer calls ``touch`` — a request's accesses
(blocks it loaded, blocks it offered for storing that are cached) are applied once, in prefix
order, when the request finishes. Tensor-free: this runs in vLLM's scheduler process.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from kvoffload.offload.abstract import OffloadingManager as KVOffloadingManager


@dataclass(slots=True)
class _RequestAccess:
    """Keys one request used, in first-seen order (dict = ordered set)."""

    generation: int
    keys: dict[OffloadKey, None] = field(default_factory=dict)


class KVOffloadManager(OffloadingManager):
    def __init__(self, build: Callable[[], KVOffloadingManager]) -> None:
        self._build = build
        self.inner = build()
        self._generation = 0

    # ---- helpers -------------------------------------------------------------------------
    def _access(self, ctx: ReqContext) -> _RequestAccess:
        state = ctx.get_state(_RequestAccess)
        if state is None or state.generation != self._generation:
            state = _RequestAccess(self._generation)
            ctx.set_state(state)
        return state

    def _is(self, what: str, key: OffloadKey) -> bool:
        check = getattr(self.inner, what, None)
        return bool(check(key)) if check is not None else False

    # ---- vLLM contract -------------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._access(req_context)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        hits = self.inner.lookup([key])
        if hits is None:
            return LookupResult.RETRY
        if hits:
            return LookupResult.HIT
        return LookupResult.HIT_PENDING if self._is("is_pending", key) else LookupResult.MISS

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = self.inner.prepare_load(list(keys))
        self._access(req_context).keys.update(dict.fromkeys(keys))
        return CPULoadStoreSpec(spec.block_ids.tolist())

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.touch(list(keys))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.complete_load(list(keys))

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        offered = list(keys)
        out = self.inner.prepare_store(offered)
        if out is None:
            return None
        new = set(out.block_hashes_to_store)
        cached = [k for k in offered if k not in new and self._is("is_ready", k)]
        self._access(req_context).keys.update(dict.fromkeys(cached))
        return PrepareStoreOutput(
            keys_to_store=list(out.block_hashes_to_store),
            store_spec=CPULoadStoreSpec(out.store_spec.block_ids.tolist()),
            evicted_keys=list(out.block_hashes_evicted),
        )

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        self.inner.complete_store(list(keys), success)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestAccess)
        if state is None or state.generation != self._generation or not state.keys:
            return
        keys = list(state.keys)
        positions = [req_context.get_offload_key_position(k) for k in keys]
        if None not in positions:
            keys = [k for _, k in sorted(zip(positions, keys))]  # type: ignore[type-var]
        state.keys.clear()
        # kvoffload's touch makes its first hash the most recent: the prefix head outlives the tail.
        self.inner.touch(keys)

    def take_events(self) -> Iterable[OffloadingEvent]:
        for ev in self.inner.take_events():
            medium = Medium.CPU if ev.medium == "CPU" else Medium.STORAGE
            yield OffloadingEvent(keys=list(ev.block_hashes), medium=medium, removed=ev.removed)

    def reset_cache(self) -> None:
        """Forget every block: vLLM never completes jobs issued before a reset."""
        self.inner.close()
        self.inner = self._build()
        self._generation += 1

    def shutdown(self) -> None:
        self.inner.close()
