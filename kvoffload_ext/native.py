"""An optional native row-copy loop, compiled on first use with the system C compiler.

One ctypes call copies every row of a view (ctypes releases the GIL for its duration), so
small rows no longer pay a Python iteration each. Built into a per-user cache directory
with an atomic rename; when no compiler is present the pure-Python memmove loop is used.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
void kvo_copy_rows(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride, int64_t row,
                   const int64_t* src_ids, const int64_t* dst_ids, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        int64_t j = i + 1;
        if (src_stride == row && dst_stride == row) {
            while (j < n && src_ids[j] == src_ids[j - 1] + 1 && dst_ids[j] == dst_ids[j - 1] + 1) j++;
        }
        memcpy(dst + dst_ids[i] * dst_stride, src + src_ids[i] * src_stride, (size_t)(row * (j - i)));
        i = j;
    }
}
"""

_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    base = os.environ.get("KVOFFLOAD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kvoffload"
    )
    return Path(base)


def _build() -> ctypes.CDLL | None:
    if os.environ.get("KVOFFLOAD_NO_NATIVE"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:12]
    target = _cache_dir() / f"kvo_copy_{digest}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "kvo_copy.c"
                src.write_text(_SOURCE)
                out = Path(tmp) / "kvo_copy.so"
                subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)],
                               check=True, capture_output=True, timeout=60)
                staged = target.with_suffix(f".{os.getpid()}.tmp")
                shutil.copyfile(out, staged)
                os.replace(staged, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    fn = lib.kvo_copy_rows
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def native_lib() -> ctypes.CDLL | None:
    global _lib, _tried
    if not _tried:
        _tried = True
        _lib = _build()
    return _lib
