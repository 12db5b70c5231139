"""A plan: one replay of the device cache, then one of each configured chain, priced by the
profile into tokens and bytes per tier, prefill saved and time to first token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvoffload.plan.chain_replay import device_hits, replay_chain
from kvoffload.plan.log_reader import RequestLog
from kvoffload.plan.profile import Profile
from kvoffload.plan.tier_spec import PlannedTier, chain_label
from kvoffload.plan.timing import simulate_ttft

#: Bandwidth peaks are the busiest window of this many seconds.
PEAK_WINDOW_S = 1.0


@dataclass(slots=True)
class TierFigures:
    medium: str
    size_bytes: int
    tokens_served: int
    bytes_loaded: int
    bytes_stored: int
    load_bytes_per_s: float
    store_bytes_per_s: float
    peak_load_bytes_per_s: float


@dataclass(slots=True)
class PlanResult:
    label: str
    size_bytes: int
    tiers: list[TierFigures]
    prompt_tokens: int
    device_tokens: int
    prefill_tokens_saved: int
    prefill_s_saved: float
    ttft_p50_s: float
    ttft_p95_s: float
    base_ttft_p50_s: float
    base_ttft_p95_s: float
    returning_requests: int

    @property
    def hit_ratio(self) -> float:
        """Share of prompt tokens the tiers served (the device's own hits not counted)."""
        return self.prefill_tokens_saved / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d["hit_ratio"] = self.hit_ratio
        return d


#: A median TTFT without offload this many times the prefill alone means requests queue: the
#: report says so, and an objective out of reach is the engine's capacity, not the tiers'.
QUEUEING_NOTE = 5.0


@dataclass(slots=True)
class Plan:
    log_form: str
    requests: int
    block_tokens: int
    block_bytes: int
    device_blocks: int
    stand_in: bool
    #: Median of each request's TTFT without offload over its prefill alone: far above 1,
    #: requests queue, and TTFT measures the queue more than the tiers.
    queueing: float = 1.0
    #: The KV of every distinct block the log's requests store (their prompts' and replies'
    #: full blocks): what a cache must hold for every repeated prefix to hit.
    working_set_bytes: int = 0
    results: list[PlanResult] = field(default_factory=list)

    @property
    def device_bytes(self) -> int:
        return self.device_blocks * self.block_bytes


def returning_mask(log: RequestLog) -> np.ndarray:
    """A session seen before; in a log without sessions, a request sharing a block with an earlier one."""
    seen_sessions: set[str] = set()
    seen_first: set = set()
    out = np.zeros(len(log.requests), dtype=bool)
    have_sessions = any(r.session is not None for r in log.requests)
    for i, r in enumerate(log.requests):
        if have_sessions:
            out[i] = r.session in seen_sessions
            if r.session is not None:
                seen_sessions.add(r.session)
        elif r.blocks:
            out[i] = r.blocks[0] in seen_first
            seen_first.add(r.blocks[0])
    return out


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _peak(t: np.ndarray, nbytes: np.ndarray) -> float:
    if not nbytes.any():
        return 0.0
    # Only the windows that hold a request: one bin per second of the log's span would take
    # gigabytes for a log spanning years (an epoch timestamp among relative ones).
    _, window = np.unique(np.floor(t / PEAK_WINDOW_S), return_inverse=True)
    return float(np.bincount(window.ravel(), weights=nbytes).max() / PEAK_WINDOW_S)


def require_speeds(profile: Profile, chains: Sequence[tuple[PlannedTier, ...]], source: str) -> None:
    """ProfileError, naming ``source``, for the first tier of ``chains`` the profile has no speeds for."""
    for tiers in chains:
        for t in tiers:
            profile.tier(t.medium, source)


def make_plan(log: RequestLog, chains: Sequence[tuple[PlannedTier, ...]], block_bytes: int, device_blocks: int,
              profile: Profile, output_tokens: int = 128, progress: Callable[[int], None] | None = None,
              profile_source: str = "the profile") -> Plan:
    """``profile_source`` names the profile in the error for a tier it lacks."""
    require_speeds(profile, chains, profile_source)  # before any replay
    reqs = log.requests
    bt = log.block_tokens
    arrival = np.array([r.t for r in reqs])
    after = np.array([r.after for r in reqs], dtype=np.int64)
    think = np.array([r.think_s for r in reqs])
    prompt = np.array([r.prompt_tokens for r in reqs], dtype=np.int64)
    outputs = np.array([r.output_tokens or output_tokens for r in reqs], dtype=np.int64)
    returning = returning_mask(log)
    keys = [r.blocks for r in reqs]  # running requests share the device blocks of a common prefix
    eng = profile.engine
    # The caches see a request when the engine schedules it, not when it arrives: order the
    # replays by when the run without offload starts each prefill (from a first pass in
    # arrival order).
    order = None
    for _ in range(2):
        dev = device_hits(reqs, device_blocks, bt, output_tokens, order)
        dev_tok = np.minimum(dev * bt, np.maximum(prompt - 1, 0))
        base_new = prompt - dev_tok
        replay = simulate_ttft(arrival, np.zeros(len(reqs)), base_new, dev_tok, outputs, eng, block_tokens=bt,
                               capacity=device_blocks, after=after, think_s=think, prefix_keys=keys)
        base = replay.ttft
        order = np.argsort(replay.started, kind="stable").tolist()
    span = max(log.duration_s, PEAK_WINDOW_S)
    alone = eng.prefill_s(base_new, dev_tok)  # each by itself
    base_prefill = float(alone.sum())
    plan = Plan(log.form, len(reqs), bt, block_bytes, device_blocks, log.stand_in,
                queueing=float(np.median(base / np.maximum(alone, 1e-12))),
                working_set_bytes=len({h for r in reqs for h in r.stored}) * block_bytes)
    for tiers in chains:
        counts = replay_chain(reqs, dev, tiers, block_bytes, bt, order, progress, eng.max_batched_tokens)
        hit = dev_tok.copy()
        load_s = np.zeros(len(reqs))
        figures = []
        saved = 0
        for t in tiers:
            blocks = counts.loaded_blocks[t.medium]
            nbytes = blocks * block_bytes
            load_s += profile.tier(t.medium).load_s(nbytes)
            hit += blocks * bt
            tokens = int(blocks.sum()) * bt
            saved += tokens
            stored = counts.stored_blocks.get(t.medium, 0) * block_bytes
            figures.append(TierFigures(t.medium, t.size_bytes, tokens, int(nbytes.sum()), stored,
                                       float(nbytes.sum()) / span, stored / span, _peak(arrival, nbytes)))
        hit = np.minimum(hit, np.maximum(prompt - 1, 0))
        new = prompt - hit
        ttft = simulate_ttft(arrival, load_s, new, hit, outputs, eng, block_tokens=bt, capacity=device_blocks,
                             after=after, think_s=think, prefix_keys=keys).ttft
        prefill = float(eng.prefill_s(new, hit).sum())
        ret = returning if returning.any() else np.ones(len(reqs), dtype=bool)
        plan.results.append(PlanResult(
            chain_label(tiers), sum(t.size_bytes for t in tiers), figures, int(prompt.sum()), int(dev_tok.sum()),
            saved, base_prefill - prefill, _pct(ttft[ret], 50), _pct(ttft[ret], 95), _pct(base[ret], 50),
            _pct(base[ret], 95), int(returning.sum())))
    return plan
