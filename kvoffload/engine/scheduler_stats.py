"""SchedulerStats: the scheduler's own counters (``LLM.stats()`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvoffload.engine.request import Request


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

    def count_scheduled(self, request: Request, n: int) -> None:
        """``n`` tokens of ``request`` scheduled this step: decode or prefill, and of the prefill
        the tokens whose KV existed before a preemption (recomputed)."""
        if request.num_output_tokens > 0 and request.num_computed_tokens == request.num_tokens - 1:
            self.decode_tokens += n
            return
        self.prefill_tokens_computed += n
        lost = min(request.num_computed_tokens + n, request.computed_before_preemption)
        self.recomputed_after_preemption += max(0, lost - request.num_computed_tokens)
