"""The fs tier's record files in native code (``fs_files.c``): one ctypes call writes one
bucket's records under its lock, or reads a batch of records, with the GIL released.

Measured on 256 KiB records (tmpfs, 2-core machine): the Python loop spends about as much
time around each record's five system calls as in them, and its I/O threads cannot overlap
because each call retakes the GIL; here a batch is one call.
"""

from __future__ import annotations

import ctypes
import os
from array import array
from collections.abc import Sequence
from importlib.resources import files

from kvoffload_ext.build import compile_library

WRITTEN = 0
EXISTED = 1
#: A record that did not fit its bucket's count (or the count is missing): sweep, then retry.
NEEDS_ROOM = 2


def _source() -> str:
    return files("kvoffload_ext.fs_records").joinpath("fs_files.c").read_text()


def _declare(lib: ctypes.CDLL) -> None:
    lib.kvo_fs_put.restype = ctypes.c_int64
    lib.kvo_fs_put.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_int64,
                               ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p]
    lib.kvo_fs_get.restype = None
    lib.kvo_fs_get.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_double, ctypes.c_void_p]


def _library() -> ctypes.CDLL | None:
    return compile_library("kvo_fs_files", _source, _declare, "the fs tier reads and writes files from Python")


def available() -> bool:
    return _library() is not None


def _required() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("kvoffload_ext.fs_files: the native library is not built; check available() first")
    return lib


class _Batch:
    """One call's arguments as C arrays (kept alive for the call by this object)."""

    def __init__(self, paths: Sequence[str], ptrs: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]]) -> None:
        self.n = len(paths)
        self.paths = self.strings(paths)
        firsts = array("q", [0])
        for p in ptrs:
            firsts.append(firsts[-1] + len(p))
        self.firsts = firsts
        self.ptrs = array("q", [a for p in ptrs for a in p])
        self.lens = array("q", [n for s in sizes for n in s])
        self.status = array("q", bytes(8 * self.n))

    @staticmethod
    def strings(items: Sequence[str]) -> ctypes.Array[ctypes.c_char_p]:
        return (ctypes.c_char_p * len(items))(*[os.fsencode(s) for s in items])

    def args(self) -> list[int]:
        return [self.firsts.buffer_info()[0], self.ptrs.buffer_info()[0], self.lens.buffer_info()[0]]


def put_bucket(dir_fd: int, counter: str, capacity: int, alloc_unit: int, timeout_s: float, temps: Sequence[str],
               finals: Sequence[str], ptrs: Sequence[Sequence[int]], sizes: Sequence[Sequence[int]]
               ) -> tuple[int, list[int]]:
    """One bucket's writes under its lock (every name relative to ``dir_fd``): (the call's
    status, each record's status). The call's is 0, NEEDS_ROOM (the count is missing, or its
    file is not a plain file of ours: nothing done) or -errno (the lock file could not be
    opened, or stayed locked: -EBUSY); a record's is WRITTEN, EXISTED, NEEDS_ROOM or -errno."""
    lib = _required()
    batch = _Batch(finals, ptrs, sizes)
    temp_names = _Batch.strings(temps)
    code = lib.kvo_fs_put(dir_fd, os.fsencode(counter), capacity, alloc_unit, timeout_s, batch.n, temp_names,
                          batch.paths, *batch.args(), batch.status.buffer_info()[0])
    return int(code), batch.status.tolist()


def get_records(dir_fds: Sequence[int], names: Sequence[str], ptrs: Sequence[Sequence[int]],
                sizes: Sequence[Sequence[int]], touch_after_s: float) -> list[int]:
    """Each record (``names[i]`` in ``dir_fds[i]``) read whole into its parts: the bytes read,
    the file's size when it is not the parts' total (nothing read), -ELOOP for a name that is
    not a regular file of one link, or -errno."""
    lib = _required()
    batch = _Batch(names, ptrs, sizes)
    fds = array("q", dir_fds)
    lib.kvo_fs_get(batch.n, fds.buffer_info()[0], batch.paths, *batch.args(), touch_after_s, batch.status.buffer_info()[0])
    return batch.status.tolist()
