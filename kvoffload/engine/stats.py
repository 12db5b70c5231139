"""EngineStats: ``LLM.stats()`` as a typed record, each counter said once, with what it counts.

``stats()`` stays a dict (the stable API, and what metrics read); this record is the way to read
it in code: the three hit counters that look alike are told apart here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class EngineStats:
    requests: int
    prompt_tokens: int
    generated_tokens: int
    #: Prompt tokens the engine computed (not served from any cache).
    prefill_tokens_computed: int
    #: Prompt tokens served, by where from: "device" (the engine's own prefix cache) and each
    #: offload tier ("cpu", "disk", ...). Counted at every admission, so a request preempted and
    #: admitted again counts its hits again; a tier counts only blocks that landed.
    prefix_hit_tokens: dict[str, int]
    #: Tokens hit (device or tier) at each request's *first* admission: at most its prompt, so
    #: ``prompt_hit_tokens / prompt_tokens`` is a hit rate that never exceeds 100%.
    prompt_hit_tokens: int
    #: Tokens an offload tier's lookup promised, at every admission (what the scheduler planned
    #: to load; compare ``failed_external_hit_tokens``).
    external_hit_tokens: int
    #: Of those, tokens whose load failed and were recomputed.
    failed_external_hit_tokens: int
    failed_loads: int
    preemptions: int
    swapped_out_tokens: int
    recomputed_after_preemption: int
    forks: int
    cow_copies: int
    steps: int
    device_cache_evictions: int
    #: Time to first token of every finished request, in seconds.
    ttft_s: list[float] = field(default_factory=list)
    #: The offload connector's counters (scheduler side), and its transfer counters (worker side).
    connector: dict[str, Any] = field(default_factory=dict)
    transfer: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, stats: dict[str, Any]) -> EngineStats:
        return cls(**stats)

    @property
    def offload_hit_tokens(self) -> int:
        """Prompt tokens served by the offload tiers (every tier but the device's cache)."""
        return sum(n for tier, n in self.prefix_hit_tokens.items() if tier != "device")
