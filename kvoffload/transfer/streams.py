"""Stream/event pools that run copy jobs asynchronously, in submission order per direction.

Each job gets a stream from the pool, a start and an end event, and waits for the end event
of the previous job in the same direction, so completions arrive in submission order.
Device-to-host jobs first wait for the compute stream, so they read finished KV.

CPU backend: copy threads stand in for streams and futures for events (the copies release
the GIL, so this is real concurrency). CUDA backend: torch streams and events.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from kvoffload.transfer.result import DEVICE_TO_HOST


class JobHandle(ABC):
    @abstractmethod
    def done(self) -> bool: ...

    @abstractmethod
    def wait(self) -> None: ...

    @abstractmethod
    def error(self) -> BaseException | None:
        """The exception the job raised, once done (None = success)."""

    @abstractmethod
    def seconds(self) -> float: ...


class StreamPool(ABC):
    @abstractmethod
    def submit(self, direction: str, fn: Callable[[], None], inline: bool = False) -> JobHandle:
        """Run ``fn`` after the direction's earlier jobs. ``inline``: the job is so small that
        handing it to a copy thread costs the caller more than running it; a pool may then run
        it in the caller (the CPU pool does when no earlier job of the direction is running)."""

    def close(self) -> None:
        """Wait for every submitted job and release the streams."""


class _FutureHandle(JobHandle):
    __slots__ = ("future",)

    def __init__(self, future: cf.Future[float]) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def wait(self) -> None:
        cf.wait([self.future])

    def error(self) -> BaseException | None:
        return self.future.exception()

    def seconds(self) -> float:
        return self.future.result() if self.future.exception() is None else 0.0


class CPUStreamPool(StreamPool):
    def __init__(self, num_streams: int = 4) -> None:
        if num_streams < 1:
            raise ValueError(f"num_streams={num_streams}: need at least one copy thread")
        self._executor = cf.ThreadPoolExecutor(num_streams, thread_name_prefix="kvoffload-copy")
        self._last: dict[str, cf.Future[float]] = {}
        self._lock = threading.Lock()

    def submit(self, direction: str, fn: Callable[[], None], inline: bool = False) -> JobHandle:
        with self._lock:
            prev = self._last.get(direction)
            if inline and (prev is None or prev.done()):
                # Waking a copy thread and getting the GIL back costs the caller tens of
                # microseconds, more than a small copy: run it here, in the direction's order.
                future: cf.Future[float] = cf.Future()
                self._last[direction] = future
            else:

                def run() -> float:
                    if prev is not None:
                        cf.wait([prev])  # the previous job's end event
                    t0 = time.perf_counter()
                    fn()
                    return time.perf_counter() - t0

                self._last[direction] = self._executor.submit(run)
                return _FutureHandle(self._last[direction])
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a failed copy is a failed job, as on a copy thread
            future.set_exception(e)
        else:
            future.set_result(time.perf_counter() - t0)
        return _FutureHandle(future)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class DirectionLanes(StreamPool):
    """A thread per direction: a direction's jobs run in order, and no direction waits behind
    another's (a tier's loads never queue behind its stores, however slow those are). Never
    inline: its jobs do file and network I/O."""

    def __init__(self) -> None:
        self._lanes: dict[str, cf.ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def submit(self, direction: str, fn: Callable[[], None], inline: bool = False) -> JobHandle:
        with self._lock:
            lane = self._lanes.get(direction)
            if lane is None:
                lane = self._lanes[direction] = cf.ThreadPoolExecutor(1, thread_name_prefix=f"kvoffload-{direction}")

        def run() -> float:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        return _FutureHandle(lane.submit(run))

    def close(self) -> None:
        with self._lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.shutdown(wait=True)


def failed_handle(exc: BaseException) -> JobHandle:
    """A job that is over before it started (e.g. a store skipped by backpressure)."""
    future: cf.Future[float] = cf.Future()
    future.set_exception(exc)
    return _FutureHandle(future)


class _CudaHandle(JobHandle):
    __slots__ = ("end", "exc", "start")

    def __init__(self, start: torch.cuda.Event, end: torch.cuda.Event, exc: BaseException | None) -> None:
        self.start, self.end, self.exc = start, end, exc

    def done(self) -> bool:
        return self.exc is not None or bool(self.end.query())  # type: ignore[no-untyped-call]

    def wait(self) -> None:
        if self.exc is None:
            self.end.synchronize()

    def error(self) -> BaseException | None:
        return self.exc

    def seconds(self) -> float:
        return 0.0 if self.exc is not None else self.start.elapsed_time(self.end) / 1000.0


class CUDAStreamPool(StreamPool):
    def __init__(self, device: torch.device, num_streams: int = 4) -> None:
        self.device = device
        self._streams = [torch.cuda.Stream(device) for _ in range(num_streams)]  # type: ignore[no-untyped-call]
        self._next = 0
        self._last: dict[str, torch.cuda.Event] = {}

    def submit(self, direction: str, fn: Callable[[], None], inline: bool = False) -> JobHandle:
        stream = self._streams[self._next]  # fn only queues work on the stream: always "inline"
        self._next = (self._next + 1) % len(self._streams)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        if direction == DEVICE_TO_HOST:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        prev = self._last.get(direction)
        if prev is not None:
            stream.wait_event(prev)
        exc: BaseException | None = None
        with torch.cuda.stream(stream):
            start.record(stream)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a failed copy is a failed job, never an engine crash
                exc = e
            end.record(stream)
        self._last[direction] = end
        return _CudaHandle(start, end, exc)

    def close(self) -> None:
        for stream in self._streams:
            stream.synchronize()


def make_stream_pool(backend: str, device: torch.device, num_streams: int) -> StreamPool:
    """``auto`` picks CUDA when the KV cache lives on a CUDA device."""
    if backend == "auto":
        backend = "cuda" if device.type == "cuda" else "cpu"
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"transfer.backend=cuda but the KV cache is on {device}; use auto or cpu")
        return CUDAStreamPool(device, num_streams)
    if device.type != "cpu":
        raise ValueError(f"transfer.backend=cpu but the KV cache is on {device}; use auto or cuda")
    return CPUStreamPool(num_streams)
