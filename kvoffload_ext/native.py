"""An optional native copy loop, compiled on first use with the system C compiler.

One ctypes call copies every byte range of a job (ctypes releases the GIL for its duration),
so small rows no longer pay a Python iteration each. Built into a per-user cache directory
with an atomic rename; when no compiler is present the pure-Python memmove loop is used, and
that is logged once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("kvoffload")

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
void kvo_copy_ranges(const int64_t* src, const int64_t* dst, const int64_t* len, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        memcpy((void*)(uintptr_t)dst[i], (const void*)(uintptr_t)src[i], (size_t)len[i]);
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
        log.info("no C compiler found: host block copies use the slower Python memmove loop")
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
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not build the native copy loop with %s (%s): host block copies use the slower "
                    "Python memmove loop", compiler, e)
        return None
    fn = lib.kvo_copy_ranges
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def native_lib() -> ctypes.CDLL | None:
    global _lib, _tried
    if not _tried:
        _tried = True
        _lib = _build()
    return _lib
