"""LoadBlocks: the device blocks each load writes, and those whose load failed.

An engine that recomputes per block (vLLM) asks after each step which device blocks hold no
valid KV (``take``); one that recomputes per request (the bundled engine) asks only for
synchronous loads, whose requests run in the very step. So the blocks of asynchronous loads
are kept only where asked for (``collect``).
"""

from __future__ import annotations


class LoadBlocks:
    def __init__(self) -> None:
        #: Keep the blocks of asynchronous loads too (vLLM sets it).
        self.collect = False
        self._dst: dict[int, list[int]] = {}
        self._failed: set[int] = set()

    def track(self, job_id: int, blocks: list[int], sync: bool) -> None:
        """A load submitted into ``blocks``."""
        if sync or self.collect:
            self._dst[job_id] = blocks

    def refused(self, blocks: list[int], sync: bool) -> None:
        """A load that could not be submitted: its blocks hold nothing."""
        if sync or self.collect:
            self._failed.update(blocks)

    def landed(self, job_id: int, success: bool) -> None:
        blocks = self._dst.pop(job_id, [])
        if not success:
            self._failed.update(blocks)

    def take(self) -> set[int]:
        """Device blocks whose load failed since the last call (their KV must be recomputed)."""
        failed, self._failed = self._failed, set()
        return failed
