"""The host copy loops in C, a whole job per call with the GIL released, compiled on first use
(``kvoffload_ext.build``): ``kvo_copy_ranges`` (one memcpy per byte range) and ``kvo_copy_rows``
(a ``RowTable``'s groups walked by block ids: the addresses computed, and bounds checked, in C).

Each range starts on a page the hardware prefetcher has not seen (rows of a few KiB scattered
over the KV cache), so the loop prefetches the next range's first lines on both sides while it
copies the current one: measured here on 4 KiB rows, +12% against the plain loop."""

from __future__ import annotations

import ctypes

from kvoffload_ext.build import compile_library

_SOURCE = r"""
#include <stdint.h>
#include <string.h>
void kvo_copy_ranges(const int64_t* src, const int64_t* dst, const int64_t* len, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (i + 1 < n) { /* the next range's first lines: its page walks overlap this copy */
            __builtin_prefetch((const void*)(uintptr_t)src[i + 1], 0, 0);
            __builtin_prefetch((const void*)(uintptr_t)dst[i + 1], 1, 0);
        }
        memcpy((void*)(uintptr_t)dst[i], (const void*)(uintptr_t)src[i], (size_t)len[i]);
    }
}
/* Group g of table t is t[7g .. 7g+6]: src base, src stride, src rows, dst base, dst stride,
   dst rows, width. Row s[i] of every group's source goes to row d[i] of its destination, row i
   of every group before row i + 1 (a block's layers fill its host row in order). Returns 0, or
   1 + i for the first pair out of bounds, before anything is copied. */
int64_t kvo_copy_rows(const int64_t* t, int64_t ng, const int64_t* s, const int64_t* d, int64_t n) {
    int64_t srows = INT64_MAX, drows = INT64_MAX;
    for (int64_t g = 0; g < ng; g++) {
        if (t[7 * g + 2] < srows) srows = t[7 * g + 2];
        if (t[7 * g + 5] < drows) drows = t[7 * g + 5];
    }
    for (int64_t i = 0; i < n; i++)
        if (s[i] < 0 || s[i] >= srows || d[i] < 0 || d[i] >= drows) return 1 + i;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t g = 0; g < ng; g++) {
            const int64_t* r = t + 7 * g;
            int64_t ni = g + 1 < ng ? i : i + 1;
            if (ni < n) {
                const int64_t* q = g + 1 < ng ? r + 7 : t;
                __builtin_prefetch((const void*)(uintptr_t)(q[0] + s[ni] * q[1]), 0, 0);
                __builtin_prefetch((const void*)(uintptr_t)(q[3] + d[ni] * q[4]), 1, 0);
            }
            memcpy((void*)(uintptr_t)(r[3] + d[i] * r[4]), (const void*)(uintptr_t)(r[0] + s[i] * r[1]),
                   (size_t)r[6]);
        }
    }
    return 0;
}
"""


def _declare(lib: ctypes.CDLL) -> None:
    lib.kvo_copy_ranges.restype = None
    lib.kvo_copy_ranges.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.kvo_copy_rows.restype = ctypes.c_int64
    lib.kvo_copy_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]


def native_lib() -> ctypes.CDLL | None:
    """The copy loops' library (``kvo_copy_ranges``, ``kvo_copy_rows``), or None."""
    return compile_library("kvo_copy", lambda: _SOURCE, _declare, "host block copies use the slower Python memmove loop")
