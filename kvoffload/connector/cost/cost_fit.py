"""Live estimates the load cost model decides by: a copy's time as latency + size x per-unit
cost, and the engine's prefill time per token by step size.

Both forget old samples exponentially, and both clip a sample far above the current estimate
(one page-cache miss or scheduler hiccup moves the estimate a little). A second such sample in a
row is not a hiccup: a load fit takes it whole, so a tier that slowed down is priced as slow
from its second slow job (clipping every sample grew the estimate only ~1.3x a job); so is a
sample the caller knows to be evidence (a job seen overrunning while it ran).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A sample above this many times the current estimate counts as this many times it.
CLIP = 4.0


@dataclass(slots=True)
class LinearFit:
    """``seconds ≈ latency + per_unit * units``, by exponentially weighted least squares."""

    alpha: float = 0.1
    samples: int = 0
    #: The last sample was far above the estimate.
    _high: bool = False
    _w: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def add(self, units: float, seconds: float, trusted: bool = False) -> None:
        """One job's time; ``trusted``: known not to be a hiccup (never clipped)."""
        if units <= 0 or seconds < 0:
            return
        if self.samples >= 3:
            bound = CLIP * self.estimate(units)
            high = seconds > bound
            if high and not (trusted or self._high):
                seconds = bound
            self._high = high
        keep = 1.0 - self.alpha
        self._w = self._w * keep + 1.0
        self._sx = self._sx * keep + units
        self._sy = self._sy * keep + seconds
        self._sxx = self._sxx * keep + units * units
        self._sxy = self._sxy * keep + units * seconds
        self.samples += 1

    def restart(self, units: float, seconds: float) -> None:
        """Forget the history: the tier changed (a job ran far past what it predicted), and
        this job's time is all that is known of it now. It stays measured (no warm-up)."""
        self._w, self._sx, self._sy = 1.0, units, seconds
        self._sxx, self._sxy = units * units, units * seconds
        self._high = False
        self.samples = max(self.samples, 1)

    def coefficients(self) -> tuple[float, float]:
        """(latency, per_unit), both >= 0. Jobs all of one size cannot tell the two apart: then
        the whole time is per unit (a larger job is estimated proportionally slower)."""
        if self._w <= 0:
            return 0.0, 0.0
        mx, my = self._sx / self._w, self._sy / self._w
        var = self._sxx / self._w - mx * mx
        if var > 1e-9 * max(mx * mx, 1.0):
            slope = (self._sxy / self._w - mx * my) / var
            intercept = my - slope * mx
            if slope >= 0 and intercept >= 0:
                return intercept, slope
            if slope < 0:  # bigger jobs were not slower: a fixed cost per job
                return my, 0.0
        return 0.0, (self._sxy / self._sxx if self._sxx > 0 else 0.0)

    def units_per_second(self) -> float:
        """Observed throughput, latency included (recent jobs weigh most); 0 before any job."""
        return self._sx / self._sy if self._sy > 0 else 0.0

    def estimate(self, units: float) -> float:
        latency, per_unit = self.coefficients()
        return latency + per_unit * units


def bucket_of(tokens: int) -> int:
    """Steps are grouped by the power of two at or above their token count."""
    return max(0, (max(tokens, 1) - 1).bit_length())


@dataclass(slots=True)
class PrefillRate:
    """Seconds per token of a forward pass, per step-size bucket: a step of 16 tokens is
    dominated by per-step overhead, one of 1024 by the tokens, so recomputing n tokens is
    priced at the rate of steps about n tokens long."""

    alpha: float = 0.1
    per_token: dict[int, float] = field(default_factory=dict)
    samples: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        b = bucket_of(tokens)
        rate = seconds / tokens
        old = self.per_token.get(b)
        if old is None:
            self.per_token[b] = rate
        else:
            self.per_token[b] = old + self.alpha * (min(rate, CLIP * old) - old)
        self.samples += 1

    def seconds(self, tokens: int) -> float | None:
        """Estimated forward time of ``tokens`` more tokens (None before any step was timed):
        the rate of their bucket, else of the nearest bucket measured."""
        if not self.per_token or tokens <= 0:
            return None if not self.per_token else 0.0
        b = bucket_of(tokens)
        nearest = min(self.per_token, key=lambda k: (abs(k - b), -k))
        return tokens * self.per_token[nearest]

    def tokens_per_second(self) -> dict[str, float]:
        """Measured throughput by bucket, labelled by the bucket's upper bound in tokens."""
        return {str(1 << b): 1.0 / r for b, r in sorted(self.per_token.items()) if r > 0}
