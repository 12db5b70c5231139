"""LayeredStore: one store job fed layer by layer while the forward pass runs.

A store used to start after the step that computed its blocks; a layered store copies each
layer's blocks out as soon as the forward pass has written that layer (``save_kv_layer``),
overlapping the later layers. Each layer is a job of its own on the copy streams, submitted
only once its data exists, so no copy thread ever waits for the forward pass. The job as a
whole is done, and so published to the tier, only when the step is over and every layer has
landed: the step's end submits the layers nobody saved and gives the verdict, and a step whose
synchronous load failed aborts it (its KV may have been computed from bad blocks) — the copied
layers land in slots the scheduler then frees, and nothing is published.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvoffload.transfer.streams import JobHandle, StreamPool


class StoreAborted(Exception):
    """A layer-wise store whose step did not end well (a synchronous load failed): nothing published."""


class LayeredStore(JobHandle):
    def __init__(self, layer_copies: list[Callable[[], None]], pool: StreamPool, direction: str,
                 inline: bool = False) -> None:
        self._copies = layer_copies
        self._inline = inline  # each layer small enough to copy in the caller (StreamPool.submit)
        self._pool = pool
        self._direction = direction
        self._handles: list[JobHandle | None] = [None] * len(layer_copies)
        #: None while its step runs; True: every layer submitted; False: aborted.
        self._verdict: bool | None = None
        self._lock = threading.Lock()

    def layer_written(self, layer: int) -> None:
        """The forward pass has written ``layer``: copy it out (once; unknown layers ignored)."""
        with self._lock:
            if self._verdict is None and 0 <= layer < len(self._handles) and self._handles[layer] is None:
                self._handles[layer] = self._pool.submit(self._direction, self._copies[layer], self._inline)

    def end(self, commit: bool) -> None:
        """The step is over: ``commit`` copies every layer not yet saved; else abort the job."""
        with self._lock:
            if self._verdict is not None:
                return
            if commit:
                for layer, handle in enumerate(self._handles):
                    if handle is None:
                        self._handles[layer] = self._pool.submit(self._direction, self._copies[layer], self._inline)
            self._verdict = commit

    def _submitted(self) -> list[JobHandle]:
        with self._lock:
            return [h for h in self._handles if h is not None]

    def done(self) -> bool:
        return self._verdict is not None and all(h.done() for h in self._submitted())

    def wait(self) -> None:
        if self._verdict is None:
            raise RuntimeError("a layer-wise store was waited for before its step ended; end_layered_stores "
                               "(wait_for_save) must run first")
        for handle in self._submitted():
            handle.wait()

    def error(self) -> BaseException | None:
        for handle in self._submitted():
            err = handle.error()
            if err is not None:
                return err
        return StoreAborted("the step's synchronous load failed") if self._verdict is False else None

    def seconds(self) -> float:
        return sum(h.seconds() for h in self._submitted() if h.error() is None)
