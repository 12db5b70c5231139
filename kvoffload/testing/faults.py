"""Fault injection as a wrapper around real transfer handlers.

``FaultyHandler`` forwards every copy to the handler it wraps, except the ones its script picks
to fail (an I/O error on a disk read names the slot, as the disk handler does; a failed write
is a failed job) and the completions it holds back for a few polls (a slow copy, seen from
the scheduler). ``FaultyOffloadingSpec`` is the CPU/disk spec with every handler wrapped; name
it with ``spec_name: FaultyOffloadingSpec`` and ``spec_module_path: kvoffload.testing.faults``.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from kvoffload.offload.abstract import LoadStoreSpec, Medium
from kvoffload.offload.mediums import KeyedLoadStoreSpec
from kvoffload.tiers.tiered_spec import TieredOffloadingSpec
from kvoffload.transfer.handler import OffloadingHandler
from kvoffload.transfer.layer_progress import LayerProgress
from kvoffload.transfer.layout import CanonicalKVCache
from kvoffload.transfer.result import DEVICE_TO_HOST, TransferResult, TransferSpec
from kvoffload.transfer.secondary_handler import copy_direction


@dataclass(frozen=True, slots=True)
class FaultScript:
    """Per-job probabilities. ``read_error``: a disk read fails with EIO; ``write_error``: a
    disk write fails (ENOSPC/EIO); ``store_error``: a device → host store fails; ``delay``:
    the completion is reported up to ``max_delay_polls`` polls late; ``corrupt_loads``: every
    loaded block's bytes are flipped once its load lands (a negative control: outputs must
    change, so a test that compares them can fail)."""

    read_error: float = 0.0
    write_error: float = 0.0
    store_error: float = 0.0
    delay: float = 0.0
    max_delay_polls: int = 8
    corrupt_loads: bool = False
    seed: int = 0

    @classmethod
    def from_env(cls, default: FaultScript) -> FaultScript:
        """``KVOFFLOAD_FAULT_PLAN`` (JSON of these fields) reaches engines in child processes."""
        raw = os.environ.get("KVOFFLOAD_FAULT_PLAN")
        return cls(**json.loads(raw)) if raw else default


class FaultyHandler(OffloadingHandler):
    def __init__(self, inner: OffloadingHandler, script: FaultScript, rng: random.Random,
                 kv: CanonicalKVCache | None = None) -> None:
        self.inner = inner
        self.script = script
        self.rng = rng
        self.kv = kv
        self._loads: dict[int, np.ndarray] = {}  # job -> device blocks, to corrupt once landed
        self._lock = threading.Lock()
        self._ready: list[TransferResult] = []
        self._held: list[tuple[int, TransferResult]] = []
        #: Jobs someone waited for: done, never held back again.
        self._waited: set[int] = set()
        self.injected = 0

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        return self._inject(job_id, spec) or self.inner.transfer_async(job_id, spec)

    def open_layered_store(self, job_id: int, spec: TransferSpec) -> bool:
        return self._inject(job_id, spec) or self.inner.open_layered_store(job_id, spec)

    def layer_written(self, layer: int) -> None:
        self.inner.layer_written(layer)

    def end_layered_stores(self, commit: bool) -> None:
        self.inner.end_layered_stores(commit)

    def _inject(self, job_id: int, spec: TransferSpec) -> bool:
        """Whether this job fails by the script (its failure is reported; nothing runs)."""
        src, dst = spec
        p = self.script
        direction, io = "", True
        slots: tuple[int, ...] = ()
        if isinstance(src, KeyedLoadStoreSpec) and self.rng.random() < p.read_error:
            direction, slots = copy_direction(src.medium(), dst.medium()), (int(src.block_ids[0]),)
        elif isinstance(dst, KeyedLoadStoreSpec) and self.rng.random() < p.write_error:
            direction = copy_direction(src.medium(), dst.medium())
        elif src.medium() is Medium.GPU and self.rng.random() < p.store_error:
            direction, io = DEVICE_TO_HOST, False
        if not direction:
            if p.corrupt_loads and dst.medium() is Medium.GPU:
                self._loads[job_id] = dst.block_ids
            return False
        self.injected += 1
        with self._lock:
            self._ready.append(TransferResult(job_id, False, 0, 0.0, direction, slots, io))
        return True

    def get_finished(self) -> list[TransferResult]:
        out = self.inner.get_finished()
        with self._lock:
            out += self._ready
            self._ready = []
            ready = [r for polls, r in self._held if polls <= 0]
            self._held = [(polls - 1, r) for polls, r in self._held if polls > 0]
        held = []
        for r in out:
            if r.job_id in self._waited:
                self._waited.discard(r.job_id)
                ready.append(r)
            elif self.rng.random() < self.script.delay:
                held.append((self.rng.randint(1, self.script.max_delay_polls), r))
            else:
                ready.append(r)
        with self._lock:
            self._held += held
        if self.kv is not None:
            corrupt_landed_loads(self._loads, self.kv, ready)
        return ready

    def wait(self, job_ids: Collection[int]) -> None:
        self.inner.wait(job_ids)
        with self._lock:  # a waited-for job is done: release it now
            ids = set(job_ids)
            self._waited |= ids
            self._ready += [r for _, r in self._held if r.job_id in ids]
            self._held = [(p, r) for p, r in self._held if r.job_id not in ids]

    def layer_progress(self, job_id: int) -> LayerProgress | None:
        return self.inner.layer_progress(job_id)

    def close(self) -> None:
        self.inner.close()


def corrupt_landed_loads(pending: dict[int, np.ndarray], kv: CanonicalKVCache, results: list[Any]) -> None:
    """Flip the bytes of the device blocks of every load in ``results`` that succeeded."""
    for r in results:
        ids = pending.pop(r.job_id, None)
        if ids is not None and r.success:
            index = torch.from_numpy(np.asarray(ids, dtype=np.int64))
            for view in kv.views:
                view[index.to(view.device)] ^= 0x5A


def flip_every_disk_record(directory: Path) -> int:
    """Flip one data byte of every record in ``directory``'s disk tier file (it must hold one):
    each read of them fails its checksum. Returns how many records were flipped."""
    from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER

    (path,) = directory.glob("*.kvdata")
    data = bytearray(path.read_bytes())
    flipped = 0
    for off in range(HEADER_BYTES, len(data), RECORD_HEADER):  # records start on 64-byte boundaries
        if data[off : off + 4] == b"KVB1":
            data[off + RECORD_HEADER + 100] ^= 0xFF
            flipped += 1
    path.write_bytes(bytes(data))
    return flipped


class FaultyOffloadingSpec(TieredOffloadingSpec):
    """The CPU(/disk) spec with each worker handler wrapped in a FaultyHandler."""

    script: ClassVar[FaultScript] = FaultScript()
    handlers: ClassVar[list[FaultyHandler]] = []

    def get_handlers(self, kv_caches: Any) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], Any]]:
        script = FaultScript.from_env(self.script)
        rng = random.Random(script.seed)
        wrapped: dict[int, FaultyHandler] = {}
        for src, dst, handler in super().get_handlers(kv_caches):
            if id(handler) not in wrapped:
                wrapped[id(handler)] = FaultyHandler(handler, script, rng, kv_caches)
                FaultyOffloadingSpec.handlers.append(wrapped[id(handler)])
            yield src, dst, wrapped[id(handler)]
