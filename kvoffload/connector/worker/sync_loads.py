"""StepSyncLoads: the step's synchronous (layer-wise) loads, which its forward pass reads.

They are submitted before the forward pass; the pass waits for each layer of them as it
reaches it (all of a job whose handler cannot tell layers apart), and they are over by
``wait_for_save``. One that fails, or cannot even be submitted, aborts the stores the step
planned: they may hold KV computed from its blocks. What the worker half keeps of them, and
how long the pass waited (the cost model's figure).
"""

from __future__ import annotations

import time

from kvoffload.transfer.handler import TransferRouter
from kvoffload.transfer.layer_progress import LayerProgress


class StepSyncLoads:
    def __init__(self) -> None:
        #: job -> its layer progress (None: wait for the whole job).
        self.progress: dict[int, LayerProgress | None] = {}
        #: One of them failed (or was refused): the step's stores are not submitted.
        self.failed = False
        #: Blocks the step loads inside its forward pass, and how long the pass waited for them.
        self.blocks = 0
        self.wait_s = 0.0

    def begin(self) -> None:
        self.blocks, self.wait_s = 0, 0.0

    def add(self, job_id: int, progress: LayerProgress | None, blocks: int) -> None:
        self.progress[job_id] = progress
        self.blocks += blocks

    def __bool__(self) -> bool:
        return bool(self.progress)

    def layers_known(self) -> bool:
        """Every load says which layers landed (else stores wait for its report, after the step)."""
        return all(p is not None for p in self.progress.values())

    def wait_layer(self, router: TransferRouter, layer: int | None) -> None:
        """Until ``layer`` has landed from every load (all of a load that cannot tell)."""
        t0 = time.perf_counter()
        for job_id, progress in self.progress.items():
            if progress is None or layer is None:
                router.wait([job_id])
            else:
                progress.wait(layer)
        self.wait_s += time.perf_counter() - t0

    def wait_all(self, router: TransferRouter) -> None:
        if self.progress:
            t0 = time.perf_counter()
            router.wait(list(self.progress))
            self.wait_s += time.perf_counter() - t0

    def succeeded(self) -> bool:
        """None failed, as far as their progress tells (the step's stores may commit)."""
        return not self.failed and all(p is not None and not p.failed for p in self.progress.values())

    def landed(self, job_id: int, success: bool) -> bool:
        """A finished copy: whether it was one of these (then it is over)."""
        if job_id not in self.progress:
            return False
        del self.progress[job_id]
        if not success:
            self.failed = True
        return True
