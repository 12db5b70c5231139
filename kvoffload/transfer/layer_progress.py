"""LayerProgress: how far a layer-wise load job has got, so the forward pass waits for the
layer it is about to read and no more (layer 0's attention runs while later layers copy).

The copy marks each KV tensor (layer) as it lands, in order. On the CPU backend the copy runs
on a copy thread and a waiter blocks until its layer is marked; on CUDA the copy only enqueues
work on its stream, so marking records an event there and a waiter makes the compute stream
wait for it (the host does not block). A copy that fails releases every waiter (its failure is
reported with the job: the engine recomputes the blocks).
"""

from __future__ import annotations

import threading

import torch


class LayerProgress:
    def __init__(self, num_layers: int, cuda: bool = False) -> None:
        self.num_layers = num_layers
        self.cuda = cuda
        self._landed = 0
        #: The job is over and did not land every layer (its blocks are recomputed).
        self.failed = False
        self._cond = threading.Condition()
        self._events: list[torch.cuda.Event | None] = [None] * num_layers

    def landed(self, layer: int) -> None:
        """Every copy of ``layer`` (and of each layer before it) is issued (CUDA) or done (CPU)."""
        if self.cuda:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()  # on the copy's stream: the job runs inside its stream context
            self._events[layer] = event
        with self._cond:
            self._landed = max(self._landed, layer + 1)
            self._cond.notify_all()

    def release(self, failed: bool = False) -> None:
        """The job is over (done or failed): nobody waits any longer."""
        with self._cond:
            self.failed = self.failed or failed
            self._landed = self.num_layers
            self._cond.notify_all()

    def wait(self, layer: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._landed > layer)
        event = self._events[layer] if self.cuda and 0 <= layer < self.num_layers else None
        if event is not None:
            torch.cuda.current_stream().wait_event(event)
