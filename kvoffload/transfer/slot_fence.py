"""Fences between a copy that reads a host slot and a later copy that overwrites it.

A CPU-tier victim is demoted to disk by a job that reads its slot, while the store that took
the slot over is already planned. The demotion marks the slot; the store waits on the mark
before writing, so the victim's bytes reach disk intact.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from kvoffload.transfer.streams import JobHandle


class SlotFences:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fences: dict[int, JobHandle] = {}

    def mark(self, slots: Iterable[int], handle: JobHandle) -> None:
        with self._lock:
            for s in slots:
                self._fences[s] = handle

    def clear(self, slots: Iterable[int]) -> bool:
        """No job still reads any of ``slots`` (a copy into them would not wait)."""
        with self._lock:
            return not any((h := self._fences.get(s)) is not None and not h.done() for s in slots)

    def wait(self, slots: Iterable[int]) -> None:
        with self._lock:
            handles = {id(h): h for s in slots if (h := self._fences.get(s)) is not None}
        for h in handles.values():
            h.wait()
        with self._lock:
            for s in slots:
                h = self._fences.get(s)
                if h is not None and h.done():
                    del self._fences[s]
