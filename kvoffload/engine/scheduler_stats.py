"""SchedulerStats: the scheduler's own counters (``LLM.stats()`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0
    #: Hits at every admission (a preempted request is admitted again and hits again).
    device_hit_tokens: int = 0
    external_hit_tokens: int = 0
    #: Hits at each request's first admission only: at most its prompt, so a hit rate of it
    #: over prompt tokens never exceeds 100%.
    prompt_hit_tokens: int = 0
    failed_loads: int = 0
    #: External hit tokens planned whose load failed (the request recomputed them).
    failed_external_hit_tokens: int = 0
    swapped_out_tokens: int = 0
    recomputed_after_preemption: int = 0
