"""A slow tier on demand: every read and write of the named secondary tiers waits a fixed
latency per job plus its bytes over a set bandwidth, then does the real I/O.

``ThrottledOffloadingSpec`` is the tiered spec with those tiers' I/O wrapped; name it with
``spec_name: ThrottledOffloadingSpec`` and ``spec_module_path: kvoffload.testing.throttle``.
The throttles come from ``ThrottledOffloadingSpec.throttles`` or, for engines in child
processes, ``KVOFFLOAD_THROTTLE`` (``disk:20MB/s:50ms``, several joined by ``,``).

A tier that degrades mid-run: ``disk:1MB/s:0ms:after=6`` runs at full speed for its first six
reads (a cost model times it as fast), then every read and write is throttled.

A congested device (``:queue``, e.g. ``disk:1MB/s:0ms:after=6:queue``): its throttled reads and
writes are served one at a time, in the order they come, as by one busy disk; without it they
overlap (each of the tier's copy threads waits on its own).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvoffload.errors import ConfigError
from kvoffload.offload.abstract import BlockHash
from kvoffload.tiers.base import TierKind
from kvoffload.tiers.tiered_spec import TieredOffloadingSpec
from kvoffload.transfer.tier_io import TierIO

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
_SPEC_RE = re.compile(r"^(\w+):([\d.]+)([kmg]?)b/s:([\d.]+)(ms|s)(?::after=(\d+))?(:queue)?$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Throttle:
    bytes_per_second: float
    latency_s: float
    #: Reads served at full speed before the throttle starts (0: from the first).
    after_reads: int = 0
    #: Throttled I/O is served one at a time (a congested device), not side by side.
    one_queue: bool = False

    def delay(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_second


def parse_throttles(text: str) -> dict[str, Throttle]:
    """``disk:20MB/s:50ms,fs:1GB/s:1ms`` -> {"disk": Throttle(...), ...} (tier media, lower case)."""
    out: dict[str, Throttle] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _SPEC_RE.match(part)
        if m is None:
            raise ConfigError(f"throttle {part[:60]!r}: use MEDIUM:BANDWIDTH:LATENCY[:after=READS], e.g. "
                              "disk:20MB/s:50ms or disk:1MB/s:0ms:after=6")
        medium, amount, unit, latency, latency_unit, after, queue = m.groups()
        bandwidth = float(amount) * _UNITS[unit.lower()]
        if bandwidth <= 0:
            raise ConfigError(f"throttle {part[:60]!r}: the bandwidth must be positive")
        out[medium.lower()] = Throttle(bandwidth, float(latency) / (1000 if latency_unit == "ms" else 1),
                                       int(after or 0), bool(queue))
    return out


class _FifoLock:
    """One at a time, in arrival order (a plain Lock lets a releasing thread take it again)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket = next(self._tickets)
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class ThrottledIO(TierIO):
    def __init__(self, inner: TierIO, throttle: Throttle) -> None:
        self.inner = inner
        self.throttle = throttle
        self.name = f"throttled {inner.name}"
        self._reads = itertools.count(1)
        self._slow = throttle.after_reads == 0
        self._device = _FifoLock() if throttle.one_queue else contextlib.nullcontext()

    def _wait(self, nbytes: int) -> None:
        with self._device:
            time.sleep(self.throttle.delay(nbytes))

    def write(self, blocks: Sequence[memoryview], slots: list[int], keys: list[BlockHash]) -> None:
        if self._slow:
            self._wait(sum(b.nbytes for b in blocks))
        self.inner.write(blocks, slots, keys)

    def read(self, slots: list[int], keys: list[BlockHash], out: Sequence[memoryview]) -> None:
        self._slow = self._slow or next(self._reads) > self.throttle.after_reads
        if self._slow:
            self._wait(sum(o.nbytes for o in out))
        self.inner.read(slots, keys, out)

    def register_memory(self, ptr: int, nbytes: int) -> None:
        self.inner.register_memory(ptr, nbytes)

    def close(self) -> None:
        self.inner.close()


def _throttled(kind: TierKind, throttle: Throttle) -> TierKind:
    """The same kind, its workers' I/O throttled (a subclass, so everything else is its own)."""
    base = type(kind)

    class Throttled(base):  # type: ignore[valid-type,misc]
        def build_io(self) -> TierIO:
            return ThrottledIO(super().build_io(), throttle)

    Throttled.__name__ = f"Throttled{base.__name__}"
    kind.__class__ = Throttled
    return kind


class ThrottledOffloadingSpec(TieredOffloadingSpec):
    throttles: ClassVar[dict[str, Throttle]] = {}

    def tier_kinds(self) -> list[TierKind]:
        env = os.environ.get("KVOFFLOAD_THROTTLE")
        throttles = parse_throttles(env) if env else self.throttles
        return [_throttled(k, throttles[str(k.medium).lower()]) if str(k.medium).lower() in throttles else k
                for k in super().tier_kinds()]
