"""FsTier: a hit in any tier keeps the block's record recent in the shared directory
(at most once a second per block, off the caller's thread), and reports give the directory's
fill as every process left it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from kvoffload.auth import RecordTagger
from kvoffload.tiers.fs import tier as tier_module
from kvoffload.tiers.fs.bucket import allocated
from kvoffload.tiers.fs.directory import FsDirectory
from kvoffload.tiers.fs.store import FsStore
from kvoffload.tiers.fs.tier import FsTier
from kvoffload.tiers.store.io import StoreIO
from kvoffload.tiers.store.keys import StoreKeys

BLOCK = 4096


def _setup(root: Path):
    store = FsStore([FsDirectory(root, 1 << 20, BLOCK + 64, "fs")], io_threads=1)
    keys = StoreKeys.of("ns", 16, BLOCK, 1)
    io = StoreIO(FsStore([FsDirectory(root, 1 << 20, BLOCK + 64, "fs")], io_threads=1), keys, 0, BLOCK,
                 8 * (BLOCK + 64), RecordTagger())
    data = np.zeros((2, BLOCK), dtype=np.uint8)
    io.write([data[0].data, data[1].data], [0, 1], [b"a" * 16, b"b" * 16])
    return store, keys, FsTier(store, keys, BLOCK + 64, 64, 10.0)


def _mtime(store: FsStore, keys: StoreKeys, h: bytes) -> int:
    return os.stat(store.place(keys.key(h, 0))[1]).st_mtime_ns


def _settle(mgr: FsTier) -> None:
    mgr._toucher.submit(lambda: None).result()  # the refresh thread has run what was queued


def test_a_hit_in_an_upper_tier_refreshes_the_record_once_a_second(tmp_path, monkeypatch):
    store, keys, mgr = _setup(tmp_path)
    for h in (b"a" * 16, b"b" * 16):
        os.utime(store.place(keys.key(h, 0))[1], ns=(10**9, 10**9))
    assert mgr.lookup([b"a" * 16, b"b" * 16]) in (None, 2)
    while mgr.lookup([b"a" * 16, b"b" * 16]) is None:  # the answer arrives on the lookup thread
        time.sleep(0.005)
    mgr.touch([b"a" * 16, b"unknown"])
    _settle(mgr)
    assert _mtime(store, keys, b"a" * 16) > 10**9 * 1000 and _mtime(store, keys, b"b" * 16) == 10**9
    os.utime(store.place(keys.key(b"a" * 16, 0))[1], ns=(10**9, 10**9))
    mgr.touch([b"a" * 16])  # within the second: not again
    _settle(mgr)
    assert _mtime(store, keys, b"a" * 16) == 10**9
    monkeypatch.setattr(tier_module, "REFRESH_S", 0.0)
    mgr.touch([b"a" * 16])
    _settle(mgr)
    assert _mtime(store, keys, b"a" * 16) > 10**9 * 1000
    mgr.close()
    assert not mgr._toucher._threads or all(not t.is_alive() for t in mgr._toucher._threads)


def test_reports_give_the_directory_s_fill(tmp_path):
    store, keys, mgr = _setup(tmp_path)
    report = mgr.report()
    assert report.blocks_used == 2 and report.capacity_blocks == (1 << 20) // allocated(BLOCK + 64)
    mgr.close()
