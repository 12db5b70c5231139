"""Worker-side transfer contract: handlers keyed by (source medium, destination medium)."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Collection, Iterable

from kvoffload.offload.abstract import LoadStoreSpec
from kvoffload.transfer.layer_progress import LayerProgress
from kvoffload.transfer.layered_store import StoreAborted
from kvoffload.transfer.result import (
    BlockTransferError,
    LoadCancelled,
    ReadProgress,
    StoreSkipped,
    TransferResult,
    TransferSpec,
)
from kvoffload.transfer.streams import JobHandle

logger = logging.getLogger(__name__)

class OffloadingHandler(ABC):
    """Moves blocks between two media. Never raises for a failed copy: it reports it."""

    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Start a copy; False if it could not even be submitted."""

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, in submission order per direction; never blocks."""

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the named jobs (those this handler owns) are done."""

    def layer_progress(self, job_id: int) -> LayerProgress | None:
        """How far a load job submitted just now has got, layer by layer; None where this
        handler copies all layers at once (the reader waits for the whole job)."""
        return None

    def loads_reading(self) -> dict[int, ReadProgress]:
        """Load jobs that are reading now, for how long (their own time, not the time they
        queued) and how far: evidence of a tier slower than it was timed. Empty where loads
        are memory copies (they never run long)."""
        return {}

    def cancel(self, job_id: int) -> bool:
        """Give up a load job that has not begun writing its device blocks: it is reported
        finished at once, failed and ``cancelled``, and never writes them. False where the
        job is past that point or this handler cannot cancel (it finishes as usual)."""
        return False

    def open_layered_store(self, job_id: int, spec: TransferSpec) -> bool:
        """Take a store of blocks the running forward pass is writing, to be copied layer by
        layer (``layer_written``) and finished by ``end_layered_stores``; False where this
        handler copies a store only whole (the caller submits it after the step)."""
        return False

    def layer_written(self, layer: int) -> None:
        """The forward pass has written KV tensor ``layer``: copy it out of the open stores."""

    def end_layered_stores(self, commit: bool) -> None:
        """The step is over: finish the open stores (``commit``) or abort them (nothing published)."""

    def close(self) -> None:
        """Finish outstanding jobs and release resources."""


class TrackedJobsHandler(OffloadingHandler):
    """Shared bookkeeping for handlers whose jobs run on a StreamPool: per-direction queues
    polled front-first, so completions come back in submission order per direction."""

    def __init__(self, directions: tuple[str, ...]) -> None:
        self._jobs: dict[str, deque[tuple[int, JobHandle, int]]] = {d: deque() for d in directions}
        self._by_id: dict[int, JobHandle] = {}
        self._lock = threading.Lock()
        self._logged_failures: set[tuple[object, ...]] = set()
        #: Loads submitted and not yet asked for their progress (layer_progress pops them).
        self._progress: dict[int, LayerProgress] = {}
        #: Jobs cancelled and not yet reported: reported at once, out of their direction's order.
        self._cancelled: set[int] = set()

    def _watch(self, job_id: int, num_layers: int, cuda: bool) -> LayerProgress:
        """A progress record for a load job, handed out once by ``layer_progress``."""
        progress = self._progress[job_id] = LayerProgress(num_layers, cuda)
        return progress

    def layer_progress(self, job_id: int) -> LayerProgress | None:
        return self._progress.pop(job_id, None)

    def _track(self, direction: str, job_id: int, handle: JobHandle, nbytes: int) -> None:
        with self._lock:
            self._jobs[direction].append((job_id, handle, nbytes))
            self._by_id[job_id] = handle

    def get_finished(self) -> list[TransferResult]:
        out: list[TransferResult] = []
        with self._lock:
            for direction, jobs in self._jobs.items():
                if self._cancelled:
                    for entry in [e for e in jobs if e[0] in self._cancelled]:
                        jobs.remove(entry)
                        self._cancelled.discard(entry[0])
                        out.append(self._result(direction, *entry, LoadCancelled()))
                while jobs and jobs[0][1].done():
                    out.append(self._result(direction, *jobs.popleft(), None))
        return out

    def _result(self, direction: str, job_id: int, handle: JobHandle, nbytes: int,
                cancelled: LoadCancelled | None) -> TransferResult:
        del self._by_id[job_id]
        self._progress.pop(job_id, None)  # a load nobody asked the progress of
        if cancelled is not None:
            return TransferResult(job_id, False, 0, 0.0, direction, cancelled=True)
        err = handle.error()
        bad: tuple[int, ...] = ()
        rejected: tuple[tuple[str, int], ...] = ()
        io = isinstance(err, OSError)
        if isinstance(err, BlockTransferError):
            bad, io, rejected = tuple(err.slots), err.io, tuple(sorted(err.reasons.items()))
        skipped = isinstance(err, StoreSkipped)
        if err is not None and not skipped and not isinstance(err, (StoreAborted, LoadCancelled)):
            self._log_failure(direction, err)
        return TransferResult(job_id, err is None, nbytes if err is None else 0, handle.seconds(), direction, bad,
                              io, rejected, skipped, isinstance(err, LoadCancelled))

    def _log_failure(self, direction: str, err: BaseException) -> None:
        """Once per (direction, cause): a failed copy is recomputed, but users must see why."""
        io = err.io if isinstance(err, BlockTransferError) else isinstance(err, OSError)
        cause = (direction, type(err).__name__, io, getattr(err, "errno", None))
        if cause not in self._logged_failures:
            self._logged_failures.add(cause)
            logger.warning("kvoffload: %s copy failed (%s: %s); the block is dropped and the engine keeps serving: "
                           "it recomputes the block (under vLLM's kv_load_failure_policy='fail' it fails that "
                           "request instead; further failures of this kind are not logged)", direction, type(err).__name__, err)

    def wait(self, job_ids: Collection[int]) -> None:
        with self._lock:
            handles = [self._by_id[j] for j in job_ids if j in self._by_id and j not in self._cancelled]
        for handle in handles:
            handle.wait()


class UnsupportedTransferError(ValueError):
    pass


class TransferRouter:
    """Dispatches each job to the handler registered for its media pair."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str], OffloadingHandler] = {}
        self._job_handler: dict[int, OffloadingHandler] = {}
        self._refusals_logged: set[tuple[str, str]] = set()
        #: Each handler once (one may serve several pairs), kept: asked for per layer and step.
        self._unique: list[OffloadingHandler] = []

    def register_handler(self, src: type[LoadStoreSpec], dst: type[LoadStoreSpec], handler: OffloadingHandler) -> None:
        key = (src.medium(), dst.medium())
        if key in self._handlers:
            raise ValueError(f"a handler for {key[0]} -> {key[1]} is already registered")
        self._handlers[key] = handler
        if all(handler is not h for h in self._unique):
            self._unique.append(handler)

    @property
    def handlers(self) -> list[OffloadingHandler]:
        """Each registered handler once, in registration order."""
        return self._unique

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        src, dst = spec
        key = (src.medium(), dst.medium())
        handler = self._handlers.get(key)
        if handler is None:
            known = ", ".join(f"{a}->{b}" for a, b in self._handlers)
            raise UnsupportedTransferError(f"no handler for {key[0]} -> {key[1]}; registered: {known}")
        if handler.transfer_async(job_id, spec):
            self._job_handler[job_id] = handler
            return True
        if key not in self._refusals_logged:  # a geometry or key mismatch: a bug, not a fault
            self._refusals_logged.add(key)
            logger.warning("kvoffload: the %s -> %s handler refused a copy of %d -> %d blocks (counts, block size "
                           "or keys do not match); those blocks are recomputed (logged once)", key[0], key[1],
                           len(src), len(dst))
        return False

    def layer_progress(self, job_id: int) -> LayerProgress | None:
        handler = self._job_handler.get(job_id)
        return handler.layer_progress(job_id) if handler is not None else None

    def cancel(self, job_id: int) -> bool:
        handler = self._job_handler.get(job_id)
        return handler is not None and handler.cancel(job_id)

    def loads_reading(self) -> dict[int, ReadProgress]:
        out: dict[int, ReadProgress] = {}
        for handler in self._unique:
            out.update(handler.loads_reading())
        return out

    def open_layered_store(self, job_id: int, spec: TransferSpec) -> bool:
        """False where no handler takes the pair layer by layer (the caller submits it whole)."""
        handler = self._handlers.get((spec[0].medium(), spec[1].medium()))
        if handler is None or not handler.open_layered_store(job_id, spec):
            return False
        self._job_handler[job_id] = handler
        return True

    def layer_written(self, layer: int) -> None:
        for handler in self._unique:
            handler.layer_written(layer)

    def end_layered_stores(self, commit: bool) -> None:
        for handler in self._unique:
            handler.end_layered_stores(commit)

    def get_finished(self) -> list[TransferResult]:
        results: list[TransferResult] = []
        for handler in self._unique:
            results.extend(handler.get_finished())
        for r in results:
            self._job_handler.pop(r.job_id, None)
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        by_handler: dict[int, tuple[OffloadingHandler, list[int]]] = {}
        for job_id in job_ids:
            handler = self._job_handler.get(job_id)
            if handler is not None:
                by_handler.setdefault(id(handler), (handler, []))[1].append(job_id)
        for handler, ids in by_handler.values():
            handler.wait(ids)

    def close(self) -> None:
        for handler in self._unique:
            handler.close()
