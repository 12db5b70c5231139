"""Native loops compiled on first use with the system C compiler: the host copy loop
(``copies.host_loop``) and the fs tier's batched record files (``fs_records.fs_files``).

One ctypes call runs a whole job's loop (ctypes releases the GIL for its duration), so small
items no longer pay a Python iteration each and other threads run meanwhile. Each library is
built into a per-user cache directory with an atomic rename; when no compiler is present the
pure-Python fallback is used, and that is logged once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("kvoffload")

_libs: dict[str, ctypes.CDLL | None] = {}


def _cache_dir() -> Path:
    base = os.environ.get("KVOFFLOAD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "kvoffload"
    )
    return Path(base)


def compile_library(stem: str, source: Callable[[], str], declare: Callable[[ctypes.CDLL], None],
                    fallback: str) -> ctypes.CDLL | None:
    """``source()`` compiled into a shared library (cached on disk by its digest), loaded and its
    functions' signatures set by ``declare``, once per process; None without a compiler, with
    ``KVOFFLOAD_NO_NATIVE`` set, or when the build fails (logged once: ``fallback`` says what
    is used instead)."""
    if stem in _libs:
        return _libs[stem]
    lib = None if os.environ.get("KVOFFLOAD_NO_NATIVE") else _build(stem, source(), fallback)
    if lib is not None:
        declare(lib)
    _libs[stem] = lib
    return lib


def _build(stem: str, source: str, fallback: str) -> ctypes.CDLL | None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        log.info("no C compiler found: %s", fallback)
        return None
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    target = _cache_dir() / f"{stem}_{digest}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / f"{stem}.c"
                src.write_text(source)
                out = Path(tmp) / f"{stem}.so"
                subprocess.run([compiler, "-O2", "-std=c11", "-shared", "-fPIC", "-o", str(out), str(src)],
                               check=True, capture_output=True, timeout=60)
                staged = target.with_suffix(f".{os.getpid()}.tmp")
                shutil.copyfile(out, staged)
                os.replace(staged, target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not build %s with %s (%s): %s", stem, compiler, e, fallback)
        return None
