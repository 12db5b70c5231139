"""SwapPlanner: swap-mode preemption. A preempted request's computed blocks (and its partial
last block, keyed by request and length) are stored, and restored exactly when it resumes;
whatever cannot be restored whole is recomputed.
"""

from __future__ import annotations

import xxhash

from kvoffload.connector.base import EngineRequest, GroupBlockIds
from kvoffload.connector.group_keys import NULL_BLOCK_ID, group_key
from kvoffload.connector.jobs import JobKind, TransferJob
from kvoffload.connector.scheduler.request_state import RequestOffloadState, SwapRecord
from kvoffload.connector.scheduler.scheduler_records import Planner
from kvoffload.offload.abstract import BlockHash, PrepareStoreOutput
from kvoffload.offload.mediums import GPULoadStoreSpec


class SwapPlanner(Planner):
    def _first_block(self, group: int, computed: int) -> int:
        """The first engine block ``group`` needs to resume after ``computed`` tokens (a sliding
        window's: the block of the first position the next token attends to)."""
        window = self.groups.windows[group]
        return 0 if window is None else max(0, computed - window + 1) // self.records.block_size

    def _keys(self, request: EngineRequest, computed: int, tail: BlockHash | None,
              first: int = 0) -> list[tuple[int, int, list[BlockHash]]]:
        """Per group: (its first block, the index of the tail block, the keys of its blocks from
        there on and of its tail) for a request swapped out at ``computed`` tokens."""
        full = computed // self.records.block_size
        hashes = self.records.offload_hashes(request, 0, full)
        out = []
        for g in range(self.groups.num_groups):
            start = max(first, self._first_block(g, computed))
            keys = self.groups.keys(hashes[start:], g)
            out.append((start, full, keys + ([group_key(tail, g)] if tail is not None else [])))
        return out

    def restorable(self, request: EngineRequest, num_computed_tokens: int) -> int:
        """Tokens a swapped-out request can restore exactly (every group's blocks it needs + the tail)."""
        swapped = self.records.requests[request.request_id].swapped
        assert swapped is not None
        for _, _, keys in self._keys(request, swapped.computed_tokens, swapped.tail_key):
            if self.manager.lookup(keys) != len(keys) or not self.records.blocks_being_loaded.isdisjoint(keys):
                return 0
        return max(0, swapped.computed_tokens - num_computed_tokens)

    def swap_out(self, request: EngineRequest, block_ids: GroupBlockIds) -> bool:
        records = self.records
        if records.factor != 1:
            return False  # a partial tail does not fit a multi-block offloaded slot
        rid = request.request_id
        state = records.state(rid)
        if state.stale_kv:
            return False  # its KV is older than a reset: recompute it
        computed = request.num_computed_tokens
        if computed == 0:
            return False
        # The partial block has no chained hash; key it by request and length (16 bytes, so a
        # disk tier could hold it too).
        tail = xxhash.xxh3_128(f"swap|{rid}|{computed}".encode()).digest() if computed % records.block_size else None
        jobs = []
        for g, (start, full, keys) in enumerate(self._keys(request, computed, tail)):
            ids = list(block_ids[g])[start : full + (tail is not None)]
            if NULL_BLOCK_ID in ids:
                break  # a block it needs was released (cannot happen for a running request): recompute
            out = self.manager.prepare_store(keys)
            if out is None:
                break  # the tier is full of pinned blocks: store what we have, recompute
            if out.block_hashes_to_store:
                index_of = {h: i for i, h in enumerate(keys)}
                jobs.append(self._store_job(state, rid, out, [ids[index_of[h]] for h in out.block_hashes_to_store]))
        else:
            records.next_step.swap_out[rid] = jobs
            state.swapped = SwapRecord(computed, tail)
            state.next_stored = max(state.next_stored, computed // records.block_size)
            self.stats.swapped_out_blocks += sum(len(j.src) for j in jobs)
            return True
        if jobs:
            records.next_step.swap_out[rid] = jobs
        return False

    def _store_job(self, state: RequestOffloadState, rid: str, out: PrepareStoreOutput,
                   device_ids: list[int]) -> TransferJob:
        state.storing.update(out.block_hashes_to_store)
        return self.records.new_job(JobKind.SWAP_OUT, rid, out.block_hashes_to_store, GPULoadStoreSpec(device_ids),
                                 out.store_spec)

    def plan_swap_in(self, request: EngineRequest, state: RequestOffloadState, num_local: int,
                     num_external: int) -> None:
        records = self.records
        rid = request.request_id
        assert state.swapped is not None
        computed, tail = state.swapped.computed_tokens, state.swapped.tail_key
        state.swapped = None
        assert num_local + num_external == computed, "swap-in must restore exactly what was swapped out"
        jobs = []
        loading: list[BlockHash] = []
        for g, (start, full, keys) in enumerate(self._keys(request, computed, tail, num_local // records.block_size)):
            device_ids = state.block_ids[g][start : full + (tail is not None)]
            # Swapped blocks may have been demoted meanwhile: load each tier's run on its own.
            offset = 0
            for spec, seg in self.manager.prepare_load_segments(keys):
                jobs.append(records.new_job(JobKind.LOAD, rid, seg, spec,
                                         GPULoadStoreSpec(device_ids[offset : offset + len(seg)])))
                offset += len(seg)
            loading += keys
        records.next_step.reqs_to_load[rid] = jobs
        state.loading = loading
        records.blocks_being_loaded.update(loading)
        self.stats.swapped_in_blocks += len(loading)
