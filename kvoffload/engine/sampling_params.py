"""Per-request generation settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvoffload.errors import require_positive


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    #: Parallel samples sharing the prompt's blocks (fork + copy-on-write); sample i uses seed + i.
    n: int = 1
    #: Greedy beam search width (length-normalised scores); 0 = off.
    beam_width: int = 0

    def __post_init__(self) -> None:
        for name in ("max_tokens", "top_k", "n", "beam_width"):
            _require_int(name, getattr(self, name))
        if self.seed is not None:
            _require_int("seed", self.seed)
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"SamplingParams.{name}={value!r}: must be a finite number")
        require_positive("SamplingParams.max_tokens", self.max_tokens)
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature}: must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k}: must be >= 0 (0 disables)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p={self.top_p}: must be in (0, 1]")
        require_positive("SamplingParams.n", self.n)
        if self.beam_width < 0 or (self.beam_width and self.n > 1):
            raise ValueError(f"SamplingParams.beam_width={self.beam_width}: must be >= 0 and not combined with n > 1")
        stop = tuple(self.stop_token_ids)
        for t in stop:
            _require_int("stop_token_ids[]", t)
        object.__setattr__(self, "stop_token_ids", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _require_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"SamplingParams.{name}={value!r}: must be an integer")
