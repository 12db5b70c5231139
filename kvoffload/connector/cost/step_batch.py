"""StepBatch: whether one more layer-wise hit should join the step being scheduled, or load
asynchronously and run in the next one.

Layer-wise hits found in one schedule all run in its step: each gets its first token when that
step ends, so every hit added makes the hits already in it wait for its tokens too. Loaded
asynchronously, the hit runs in the next step instead (its copy lands during this one). With
``m`` hits of ``S`` new tokens already in the step, adding one of ``n`` tokens costs the ``m``
others ``T(S + n) - T(S)`` each and gives it ``T(S + n)``; deferring gives it ``T(S) + T(n)``.
So it joins when ``(m + 1) * (T(S + n) - T(S)) < T(n)``, ``T`` the engine's measured forward
time. Where a step's time is mostly its tokens' (vLLM's CPU backend: 192 tokens in 60 ms, 576
in 150 ms) the second hit already waits: vLLM on this 2-core CPU ran a burst of five returning
turns as one 960-token step of 233 ms, all five waiting for it, while asynchronous loads ran the
first alone (60 ms) and the other four next, done at 210 ms. Where a step has a large fixed cost
(a GPU) several hits join before one waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.connector.cost.cost_fit import PrefillRate


@dataclass(slots=True)
class StepBatch:
    """Part of the plan of the step being scheduled (``NextStep``): a new schedule starts an
    empty one."""

    #: Layer-wise hits planned into the step being scheduled, and their new tokens.
    hits: int = 0
    tokens: int = 0

    def joins(self, new_tokens: int, prefill: PrefillRate) -> bool:
        """Whether a layer-wise hit computing ``new_tokens`` should run in this step."""
        if self.hits == 0 or new_tokens <= 0:
            return True
        s, n = self.tokens, new_tokens
        alone, with_it, before = prefill.seconds(n), prefill.seconds(s + n), prefill.seconds(s)
        if alone is None or with_it is None or before is None:
            return True  # no step timed yet
        return (self.hits + 1) * (with_it - before) < alone

    def add(self, new_tokens: int) -> None:
        self.hits += 1
        self.tokens += max(new_tokens, 0)
