"""LoadOverheads: the host work a loaded request costs beyond its copies.

Loading a request's hit takes host time on both halves of the connector: planning its jobs
(scheduler) and issuing its copies (worker; on CUDA the copies are launched from the thread
that runs the forward pass). A copy's own time is what its tier's fit prices; this host time
is not in it, and every request of the step waits for it, so a load is charged it once per
request of the step. On a large model it is small beside a prefill; on a small model on a fast
GPU, whose steps are host-bound, it can be what decides against loading. Each side measures
its own and reports seconds per loaded request; the last ``batch`` is the requests the
engine's latest step ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.connector.cost.cost_fit import CLIP

#: Weight of a new sample in the running averages.
ALPHA = 0.1
#: Samples of a side before its per-request host time counts.
WARMUP = 3


@dataclass(slots=True)
class LoadOverheads:
    #: Host seconds per loaded request, by side ("scheduler", "worker").
    host_s: dict[str, float] = field(default_factory=dict)
    host_samples: dict[str, int] = field(default_factory=dict)
    #: Requests the engine's latest step ran (at least 1).
    batch: int = 1

    def observe_host(self, side: str, requests: int, seconds: float) -> None:
        """``side`` spent ``seconds`` of host time loading ``requests`` requests."""
        if requests <= 0 or seconds < 0:
            return
        per = seconds / requests
        old = self.host_s.get(side)
        # A sample far above the average is clipped (a preempted thread, a page fault): host
        # time on a busy machine would otherwise turn small hits into recomputes.
        self.host_s[side] = per if old is None else old + ALPHA * (min(per, CLIP * old) - old)
        self.host_samples[side] = self.host_samples.get(side, 0) + 1

    def observe_batch(self, requests: int) -> None:
        self.batch = max(1, requests)

    def per_request_s(self) -> float:
        """Host seconds a loaded request costs (sides not yet measured count 0)."""
        return sum(s for side, s in self.host_s.items() if self.host_samples.get(side, 0) >= WARMUP)

    def host_cost_s(self) -> float:
        """What one more loaded request's host work costs the step's requests together."""
        return self.per_request_s() * self.batch
