"""Trace replay through the production scheduler-side code.

Each request is replayed as the connector issues it: ``touch`` the request's offloaded
blocks, ``lookup`` the leading run, load the hits (``prepare_load``/``complete_load``), offer
the rest for store (``prepare_store``, the connector's ``touch``, ``complete_store``). The
manager, policies and reuse filter are the ones the connector runs. ``page`` mode is the
plain page-cache loop the ARC paper measures: touch, lookup, store on a miss.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field

from kvoffload.offload import CPUTier, FilterReusedOffloadingManager, OffloadingManager
from kvoffload.offload.abstract import LookupResult, PrefixLookup
from kvoffload.offload.hints import BlockHint
from kvoffload.offload.host_tier_chain import HostTierChain, as_chain
from kvoffload.offload.policy import CachePolicy, OfflinePolicy


@dataclass(slots=True)
class SimResult:
    policy: str
    capacity: int
    store_threshold: int
    requests: int
    block_refs: int
    hit_blocks: int
    hit_tokens: int
    total_tokens: int
    blocks_written: int
    evicted_blocks: int
    seconds: float
    #: Block hit ratio in each of ``WINDOWS`` equal slices of the trace (by request), in order:
    #: how a policy warms up and follows shifts in the workload.
    window_hit_ratios: list[float] = field(default_factory=list)

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(block_hit_ratio=self.block_hit_ratio, token_hit_ratio=self.token_hit_ratio,
                 refs_per_s=self.block_refs / self.seconds if self.seconds else 0.0)
        return d


#: Slices of the trace that ``window_hit_ratios`` reports.
WINDOWS = 20


def group_blocks(requests: Sequence[Sequence[Hashable]], factor: int) -> list[list[Hashable]]:
    """Offloaded blocks of ``factor`` trace blocks, keyed by the last one's (prefix) hash."""
    if factor == 1:
        return [list(r) for r in requests]
    return [list(r[factor - 1 :: factor]) for r in requests]


def build_manager(policy: str | CachePolicy, capacity: int, store_threshold: int = 0,
                  native: bool | None = None) -> tuple[CPUTier | FilterReusedOffloadingManager,
                                                       CPUTier]:
    """The manager a replay drives (the reuse filter in front when ``store_threshold`` >= 2), and
    the tier behind it. By name, "lru", "arc" and "arc_classic" run on the native ledger where
    it is built."""
    tier = CPUTier(capacity, cache_policy=policy, native=native)
    if store_threshold >= 2:
        return FilterReusedOffloadingManager(tier, store_threshold), tier
    return tier, tier


def replay(
    requests: Sequence[Sequence[Hashable]],
    capacity: int,
    policy: str | CachePolicy = "lru",
    store_threshold: int = 0,
    tokens_per_block: int = 1,
    input_lengths: Sequence[int] | None = None,
    mode: str = "prefix",
    native: bool | None = None,
    hints: Sequence[BlockHint | None] | None = None,
    label: str | None = None,
) -> SimResult:
    """``hints``: one per request (or None), given to the manager after the request's first
    touch, as the connector does when the request arrives; ``label`` names the row (default:
    the policy)."""
    if mode not in ("prefix", "page"):
        raise ValueError(f"mode={mode!r}: use 'prefix' (connector order) or 'page' (page cache)")
    mgr, tier = build_manager(policy, capacity, store_threshold, native)
    pol = tier.index.policy
    offline = pol if isinstance(pol, OfflinePolicy) else None
    if offline is not None:
        offline.set_future(requests)
    hit_blocks = hit_tokens = total_tokens = written = evicted = refs = 0
    n = len(requests)
    win_hits = [0] * WINDOWS
    win_refs = [0] * WINDOWS
    t0 = time.perf_counter()
    for r, hashes in enumerate(requests):
        if offline is not None:
            offline.advance(r)
        hashes = list(hashes)
        refs += len(hashes)
        mgr.touch(hashes)
        if hints is not None:
            hint = hints[r]
            if hint is not None:
                tier.index.hint(hashes, hint)  # the filter in front has no policy of its own
        hits = mgr.lookup(hashes) or 0
        if hits:
            head = hashes[:hits]
            mgr.prepare_load(head)
            mgr.complete_load(head)
        rest = hashes[hits:]
        if offline is not None:
            rest = [h for h in rest if offline.admit(h)]
        if rest:
            out = mgr.prepare_store(rest)
            if out is not None:
                if mode == "prefix":
                    mgr.touch(rest)
                mgr.complete_store(out.block_hashes_to_store)
                written += len(out.block_hashes_to_store)
                evicted += len(out.block_hashes_evicted)
        length = input_lengths[r] if input_lengths is not None else len(hashes) * tokens_per_block
        hit_blocks += hits
        hit_tokens += min(hits * tokens_per_block, length)
        total_tokens += length
        w = r * WINDOWS // n
        win_hits[w] += hits
        win_refs[w] += len(hashes)
    seconds = time.perf_counter() - t0
    windows = [h / c if c else 0.0 for h, c in zip(win_hits, win_refs)]
    name = label or (policy if isinstance(policy, str) else type(policy).__name__)
    return SimResult(name, capacity, store_threshold, len(requests), refs, hit_blocks, hit_tokens, total_tokens,
                     written, evicted, seconds, windows)


class OpRecorder(HostTierChain):
    """The chain of one over a live manager's host tier, recording every call of the small
    contract, so a run can be replayed exactly."""

    def __init__(self, backing: OffloadingManager) -> None:
        chain = as_chain(backing)
        if type(chain) is not HostTierChain or chain.secondaries:
            raise TypeError(f"OpRecorder records a chain of one tier; got {type(backing).__name__}")
        super().__init__(chain.primary)
        self.ops: list[tuple[str, list[Hashable], bool]] = []

    def lookup_prefix(self, block_hashes):
        # Through the recorded lookup; the stop from the tier itself.
        hashes = list(block_hashes)
        hits = self.lookup(hashes)
        if hits == len(hashes):
            return PrefixLookup([self.medium] * hits, LookupResult.HIT)
        pending = self.host.is_pending(hashes[hits])
        return PrefixLookup([self.medium] * hits, LookupResult.HIT_PENDING if pending else LookupResult.MISS)

    def lookup(self, block_hashes):
        hashes = list(block_hashes)
        self.ops.append(("lookup", hashes, True))
        return super().lookup(hashes)

    def touch(self, block_hashes):
        hashes = list(block_hashes)
        self.ops.append(("touch", hashes, True))
        super().touch(hashes)

    def prepare_load(self, block_hashes):
        hashes = list(block_hashes)
        self.ops.append(("prepare_load", hashes, True))
        return self.primary.prepare_load(hashes)

    def prepare_load_segments(self, block_hashes, media=None):
        # One tier: the load goes through prepare_load above, so it is recorded.
        hashes = list(block_hashes)
        return [(self.prepare_load(hashes), hashes)]

    def complete_load(self, block_hashes, medium=None):
        hashes = list(block_hashes)
        self.ops.append(("complete_load", hashes, True))
        super().complete_load(hashes, medium)

    def prepare_store(self, block_hashes):
        hashes = list(block_hashes)
        self.ops.append(("prepare_store", hashes, True))
        return super().prepare_store(hashes)

    def complete_store(self, block_hashes, success=True):
        hashes = list(block_hashes)
        self.ops.append(("complete_store", hashes, success))
        super().complete_store(hashes, success)


def replay_ops(ops: Sequence[tuple[str, list[Hashable], bool]], capacity: int, policy: str = "lru",
               store_threshold: int = 0) -> int:
    """Replay a recorded call log on a fresh manager; returns the blocks loaded (tier hits)."""
    mgr, _ = build_manager(policy, capacity, store_threshold)
    calls = {"lookup": mgr.lookup, "touch": mgr.touch, "complete_load": mgr.complete_load,
             "prepare_store": mgr.prepare_store}
    loaded = 0
    for op, hashes, flag in ops:
        if op == "prepare_load":
            loaded += len(mgr.prepare_load(hashes))
        elif op == "complete_store":
            mgr.complete_store(hashes, flag)
        else:
            calls[op](hashes)
    return loaded
