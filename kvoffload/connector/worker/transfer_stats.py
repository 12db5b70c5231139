"""The worker's copy statistics, per direction: jobs, failures, bytes, seconds and their
histograms (the buckets the Prometheus exporters use), plus the recent copies for exporters
that observe each one."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict

from kvoffload.metrics import BYTES_BUCKETS, SECONDS_BUCKETS
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE, TransferResult


def _bucket(buckets: tuple[float, ...], value: float) -> int:
    return next((i for i, bound in enumerate(buckets) if value <= bound), len(buckets))


class DirectionStatsDict(TypedDict):
    jobs: int
    failed: int
    bytes: int
    seconds: float
    gb_per_s: float
    seconds_hist: list[int]
    bytes_hist: list[int]


@dataclass(slots=True)
class DirectionStats:
    jobs: int = 0
    failed: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    #: Jobs per bucket (the last one is +Inf), not cumulative.
    seconds_hist: list[int] = field(default_factory=lambda: [0] * (len(SECONDS_BUCKETS) + 1))
    bytes_hist: list[int] = field(default_factory=lambda: [0] * (len(BYTES_BUCKETS) + 1))

    def as_dict(self) -> DirectionStatsDict:
        gbps = self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0
        return {"jobs": self.jobs, "failed": self.failed, "bytes": self.nbytes, "seconds": self.seconds, "gb_per_s": gbps,
                "seconds_hist": list(self.seconds_hist), "bytes_hist": list(self.bytes_hist)}


@dataclass(slots=True)
class TransferStats:
    by_direction: dict[str, DirectionStats] = field(
        default_factory=lambda: {DEVICE_TO_HOST: DirectionStats(), HOST_TO_DEVICE: DirectionStats()}
    )
    #: (direction, seconds, bytes) of recent copies, for exporters that observe each one
    #: (vLLM's histograms); bounded, so nobody draining it costs nothing but the newest 10k.
    recent: deque[tuple[str, float, int]] = field(default_factory=lambda: deque(maxlen=10_000))

    def record(self, r: TransferResult) -> None:
        d = self.by_direction.setdefault(r.direction, DirectionStats())
        d.jobs += 1
        # A store skipped by backpressure is not a failed copy (kvoffload_tier_stores_skipped_total
        # counts it): a tier running late would read as a broken one.
        d.failed += not r.success and not r.skipped
        d.nbytes += r.nbytes
        d.seconds += r.seconds
        d.seconds_hist[_bucket(SECONDS_BUCKETS, r.seconds)] += 1
        d.bytes_hist[_bucket(BYTES_BUCKETS, r.nbytes)] += 1
        self.recent.append((r.direction, r.seconds, r.nbytes))

    def take_recent(self) -> list[tuple[str, float, int]]:
        out = list(self.recent)
        self.recent.clear()
        return out
