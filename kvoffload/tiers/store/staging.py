"""StagingArena: host memory registered with a store once, lent out in records per copy.

Registration is expensive (RDMA pins and maps the pages), so it happens once, at start-up,
for ``local_buffer`` bytes; copies borrow rows of it and give them back. A copy larger than
the arena runs in chunks; a copy waits only for rows, never for another copy to finish.
"""

from __future__ import annotations

import threading

import numpy as np

from kvoffload.tiers.store.kv_store import KeyValueStore


class StagingArena:
    def __init__(self, store: KeyValueStore, record_bytes: int, total_bytes: int) -> None:
        num_records = total_bytes // record_bytes
        if num_records < 1:
            raise ValueError(f"{total_bytes} bytes of staging memory hold no {record_bytes}-byte record")
        self.store = store
        self.record_bytes = record_bytes
        self.rows = np.empty((num_records, record_bytes), dtype=np.uint8)
        self.base = self.rows.ctypes.data
        store.register(self.base, self.rows.nbytes)
        self._free = list(range(num_records))
        self._cond = threading.Condition()

    def take(self, want: int) -> list[int]:
        """Between 1 and ``want`` free rows (waits for one when none is free)."""
        with self._cond:
            while not self._free:
                self._cond.wait()
            n = min(want, len(self._free))
            rows, self._free = self._free[-n:], self._free[:-n]
            return rows

    def give_back(self, rows: list[int]) -> None:
        with self._cond:
            self._free.extend(rows)
            self._cond.notify_all()

    def address(self, row: int) -> int:
        return self.base + row * self.record_bytes

    def close(self) -> None:
        self.store.unregister(self.base)
