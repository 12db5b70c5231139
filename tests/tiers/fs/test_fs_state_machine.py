"""A state machine over one fs directory: random writes, reads, deletions, evictions, writers
killed mid-write, files truncated or deleted behind the tier's back, sweeps, by two stores
sharing it (native and Python record files, as two processes of different builds would).
Invariants: the directory never holds more than its capacity, the count is never below what it
holds, and a read returns the block written under that key or a miss, never other bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvoffload.tiers.fs.bucket import allocated
from kvoffload.tiers.fs.directory import FsDirectory
from kvoffload.tiers.fs.store import MISSING, FsStore
from kvoffload_ext.fs_records import fs_files

RECORD = 4096 - 64 + 100  # allocated as 8 KiB
KEYS = st.sampled_from([f"ns/k{i}" for i in range(24)])
#: Which store a step uses: the native one (where it builds) or the Python one.
WHICH = st.sampled_from([True, False] if fs_files.available() else [False])


def value(key: str) -> np.ndarray:
    return np.random.default_rng(abs(hash(key)) % 2**32).integers(0, 256, RECORD, dtype=np.uint8)


class FsDirectoryMachine(RuleBasedStateMachine):
    @initialize(buckets=st.sampled_from([1, 2]), records=st.integers(2, 8))
    def open(self, buckets, records):
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="kvoffload-fs-sm-"))
        self.capacity = buckets * records * allocated(RECORD)
        (self.root / "kvoffload-fs.json").write_text(f'{{"format": 1, "buckets": {buckets}}}\n')
        self.stores = {native: FsStore([FsDirectory(self.root, self.capacity, RECORD, "fs")], io_threads=1,
                                       native=native) for native in ([True, False] if fs_files.available() else [False])}
        self.store = self.stores[False]

    def teardown(self):
        import shutil

        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)

    def _on_disk(self) -> int:
        return sum(allocated(p.stat().st_size) for p in self.root.rglob("*") if p.suffix in (".kv", ".tmp"))

    @rule(key=KEYS, native=WHICH)
    def put(self, key, native):
        v = value(key)
        assert self.stores[native].put_from([key], [v.ctypes.data], [v.nbytes]) == [0]
        assert self.store.exists([key]) == [1]  # just written (or already there): present

    @rule(key=KEYS, native=WHICH)
    def get(self, key, native):
        out = np.zeros(RECORD, dtype=np.uint8)
        (status,) = self.stores[native].get_into([key], [out.ctypes.data], [RECORD])
        assert status == MISSING or status >= 0, status  # a wrong size is reported, then deleted
        if status == RECORD:
            assert np.array_equal(out, value(key)), "served bytes of another key"

    @rule(key=KEYS)
    def remove(self, key):
        self.store.remove([key])
        assert self.store.exists([key]) == [0]

    @rule(key=KEYS, keep=st.integers(0, RECORD - 1))
    def truncated_behind_our_back(self, key, keep):
        path = Path(self.store.place(key)[1])
        if path.exists():
            with open(path, "r+b") as f:
                f.truncate(keep)

    @rule(key=KEYS)
    def deleted_behind_our_back(self, key):
        Path(self.store.place(key)[1]).unlink(missing_ok=True)

    @rule(key=KEYS, written=st.integers(0, RECORD))
    def writer_killed_mid_write(self, key, written):
        """What kill -9 leaves: the count raised, a temporary partly written, nothing renamed."""
        bucket, path = self.store.place(key)
        with bucket.locked() as held:
            if not held.reserve(allocated(RECORD)):
                return
        Path(path[: -len(".kv")] + ".99999.tmp").write_bytes(value(key).tobytes()[:written])

    @rule()
    def sweep(self):
        self.store.sweep_all()
        assert not list(self.root.rglob("*.tmp"))
        assert self.store.usage()[0] == self._on_disk()

    @invariant()
    def within_capacity_and_counted_high(self):
        if hasattr(self, "store"):
            on_disk = self._on_disk()
            assert on_disk <= self.capacity
            assert self.store.usage()[0] >= on_disk  # outside truncations and deletions only lower what is there


FsDirectoryMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestFsDirectory = FsDirectoryMachine.TestCase
