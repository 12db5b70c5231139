"""Host memory for offloaded blocks, allocated in chunks.

Pinning one huge buffer can take seconds and fail outright; chunks of a few hundred MiB pin
quickly and let the tier start before all of it is touched. A row holds one engine block's
page; an offloaded block is ``block_size_factor`` consecutive rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

DEFAULT_CHUNK_BYTES = 256 << 20


class HostBlockBuffer:
    def __init__(self, num_rows: int, row_bytes: int, pin: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 row_multiple: int = 1) -> None:
        if num_rows < 1 or row_bytes < 1:
            raise ValueError(f"host buffer of {num_rows} rows x {row_bytes} bytes: both must be >= 1")
        self.num_rows = num_rows
        self.row_bytes = row_bytes
        # An offloaded block's rows (row_multiple of them) never straddle two chunks.
        per_chunk = max(1, chunk_bytes // row_bytes)
        self.rows_per_chunk = max(row_multiple, per_chunk - per_chunk % row_multiple)
        self.chunks: list[torch.Tensor] = []
        remaining = num_rows
        while remaining:
            n = min(remaining, self.rows_per_chunk)
            self.chunks.append(torch.empty((n, row_bytes), dtype=torch.uint8, pin_memory=pin))
            remaining -= n

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.row_bytes

    def group(self, rows: np.ndarray, others: np.ndarray) -> Iterator[tuple[torch.Tensor, np.ndarray, np.ndarray]]:
        """Split (host row, other id) pairs by chunk: (chunk, local rows, other ids)."""
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"host row out of range [0, {self.num_rows})")
        chunk_of = rows // self.rows_per_chunk
        for c in np.unique(chunk_of):
            sel = chunk_of == c
            yield self.chunks[int(c)], rows[sel] - int(c) * self.rows_per_chunk, others[sel]

    def rows(self, first: int, count: int) -> torch.Tensor:
        """``count`` consecutive rows inside one chunk, as a 2-D view."""
        c, local = divmod(first, self.rows_per_chunk)
        if local + count > self.rows_per_chunk:
            raise IndexError(f"rows {first}..{first + count - 1} straddle a chunk boundary")
        return self.chunks[c][local : local + count]

    def row(self, r: int) -> torch.Tensor:
        return self.chunks[r // self.rows_per_chunk][r % self.rows_per_chunk]
