"""Which CUDA copy method moves rows of a given width fastest, measured once per device.

Three ways move a job's rows between device memory and pinned host memory, and which wins
depends on the row width, the GPU, its link and its driver: the gather/scatter kernel
(``cuda_copy``: SMs issue the loads, many in flight, best for the 8-64 KiB rows of per-layer
KV), ``cuMemcpyBatchAsync`` (``batch_memcpy``: the copy engines, one driver call for all rows)
and one ``copy_`` per row (copy engines, one call each: the fallback). A fixed width threshold
chose between them before; here the first copy of a width class (a power of two) and
direction on a device times each available method on a probe job of that width and keeps the
fastest for the life of the process. A layout's widths can be settled up front
(``prepare``, at handler start-up), so no job pays the probe; the choice is logged once per
device and layout, and ``rows`` lists it (``bench transfer`` prints it).

The probe itself is injected (``CopyMethods(probe=...)``): the CUDA one lives in ``cuda_copy``;
tests give a fake.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

log = logging.getLogger("kvoffload")

KERNEL, BATCH, COPY = "kernel", "batch", "copy"
D2H, H2D = "device->host", "host->device"


@dataclass(frozen=True, slots=True)
class MethodChoice:
    """One width class and direction: what each method measured, and the choice."""

    row_bytes: int  # the class's width (a power of two; rows up to it use this choice)
    direction: str
    gbps: dict[str, float]  # method -> GB/s on the probe (absent: unavailable)
    method: str

    def describe(self) -> str:
        if not self.gbps:
            return f"{_size(self.row_bytes)} rows {self.direction}: {self.method} (not measured)"
        others = ", ".join(f"{m} {g:.1f}" for m, g in self.gbps.items() if m != self.method)
        return (f"{_size(self.row_bytes)} rows {self.direction}: {self.method} "
                f"{self.gbps.get(self.method, 0.0):.1f} GB/s" + (f" ({others})" if others else ""))


#: probe(method, row_bytes, direction) -> GB/s, or None where the method cannot run.
Probe = Callable[[str, int, str], "float | None"]


def width_class(row_bytes: int) -> int:
    """The power of two at or above ``row_bytes`` (at least 1)."""
    return 1 << max(0, int(row_bytes) - 1).bit_length()


class CopyMethods:
    """One device's choices, filled on demand and kept for the process."""

    def __init__(self, name: str, probe: Probe, methods: Sequence[str],
                 unmeasured: Callable[[int], str] = lambda row_bytes: COPY) -> None:
        """``unmeasured(width class)``: the method where no probe could run (a device with no
        room left for one, say)."""
        self.name = name
        self._probe = probe
        self.methods = list(methods)
        self._unmeasured = unmeasured
        self._rows: dict[tuple[int, str], MethodChoice] = {}
        self._lock = threading.Lock()
        self._logged: set[tuple[int, ...]] = set()

    def method(self, row_bytes: int, direction: str) -> str:
        """The method for rows of ``row_bytes`` in ``direction`` (probed on first use)."""
        key = (width_class(row_bytes), direction)
        row = self._rows.get(key)
        if row is None:
            row = self._measure(*key)
        return row.method

    def prepare(self, widths: Iterable[int], directions: Sequence[str] = (D2H, H2D)) -> list[MethodChoice]:
        """Settle every width of a layout in both directions; logs the choices once per layout."""
        classes = tuple(sorted({width_class(w) for w in widths if w > 0}))
        rows = [self._rows.get((w, d)) or self._measure(w, d) for w in classes for d in directions]
        if classes not in self._logged:
            self._logged.add(classes)
            log.info("copy methods for %s: %s", self.name, "; ".join(r.describe() for r in rows))
        return rows

    def rows(self) -> list[MethodChoice]:
        return sorted(self._rows.values(), key=lambda r: (r.direction, r.row_bytes))

    def _measure(self, row_bytes: int, direction: str) -> MethodChoice:
        with self._lock:
            row = self._rows.get((row_bytes, direction))
            if row is not None:
                return row  # another thread measured it meanwhile
            gbps: dict[str, float] = {}
            for m in self.methods:
                rate = self._probe(m, row_bytes, direction)
                if rate is not None and rate > 0:
                    gbps[m] = rate
            method = _choose(gbps) if gbps else self._unmeasured(row_bytes)
            row = self._rows[(row_bytes, direction)] = MethodChoice(row_bytes, direction, gbps, method)
            return row


#: A method that takes no SM (the copy engines') is kept when it moves at least this share of
#: the kernel's bandwidth: the kernel's thread blocks hold SMs that compute queued meanwhile
#: waits for, the copy engines hold none.
SM_FREE_SHARE = 0.9


def _choose(gbps: dict[str, float]) -> str:
    """The fastest measured method (``gbps`` not empty), an SM-free one within the share kept."""
    best = max(gbps, key=lambda m: gbps[m])
    if best == KERNEL:
        free = [m for m in (BATCH, COPY) if m in gbps and gbps[m] >= SM_FREE_SHARE * gbps[KERNEL]]
        if free:
            return max(free, key=lambda m: gbps[m])
    return best


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"
