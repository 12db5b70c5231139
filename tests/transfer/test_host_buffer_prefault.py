"""Host buffers are faulted in when built, off the copy path, without changing their contents."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import torch

from kvoffload.transfer.host_buffer import PREFAULT_MIN_BYTES, HostBlockBuffer, prefault

ROW = 1 << 20
PAGE = mmap.PAGESIZE


def _whole_pages(t: torch.Tensor) -> tuple[int, int]:
    return -(-t.data_ptr() // PAGE) * PAGE, (t.data_ptr() + t.numel()) // PAGE * PAGE


def _resident_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s whole pages that are resident (mincore)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    start, end = _whole_pages(t)
    vec = (ctypes.c_ubyte * ((end - start) // PAGE))()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) == 0
    return sum(b & 1 for b in vec) * PAGE


def test_a_large_buffer_is_resident_when_built():
    buf = HostBlockBuffer(PREFAULT_MIN_BYTES // ROW + 32, ROW, chunk_bytes=32 * ROW)
    assert buf.prefaulted >= buf.nbytes - len(buf.chunks) * 2 * PAGE
    for chunk in buf.chunks:  # every whole page (all but an unaligned head and tail)
        start, end = _whole_pages(chunk)
        assert _resident_bytes(chunk) == end - start


def test_prefault_keeps_what_the_pages_hold():
    mm = mmap.mmap(-1, 16 << 20)  # a fresh mapping: no page touched yet (an allocator may reuse some)
    t = torch.frombuffer(mm, dtype=torch.uint8)
    marks = list(range(0, t.numel(), 3 * PAGE + 17))
    for i in marks[: len(marks) // 2]:  # half the pages written before, the rest untouched
        t[i] = i % 251 + 1
    assert _resident_bytes(t) < t.numel() // 2 + PAGE
    start, end = _whole_pages(t)
    assert prefault([t]) == end - start
    assert _resident_bytes(t) == end - start
    for i in marks[: len(marks) // 2]:
        assert int(t[i]) == i % 251 + 1, f"byte {i} changed by the prefault"


def test_small_buffers_are_left_to_fault_in_on_first_use():
    assert HostBlockBuffer(4, 4096).prefaulted == 0
    assert prefault([torch.empty(16, dtype=torch.uint8)]) == 0  # not one whole page


def test_a_cpu_tier_past_the_memory_available_now_is_one_line_before_it_is_allocated(monkeypatch):
    """#84: the packaged vllm_tiers example (an 8 GiB CPU tier) beside vLLM's default share of
    RAM ran a 24 GB host out of memory; the tier now checks what the host has available when it
    is built (after the engine's own reservation) and refuses in one line."""
    import pytest

    from kvoffload.errors import ConfigError
    from kvoffload.transfer import host_buffer

    monkeypatch.setattr(host_buffer, "available_memory_bytes", lambda: 5 << 30)
    made: list[int] = []
    monkeypatch.setattr(host_buffer.torch, "empty", lambda *a, **k: made.append(1))
    with pytest.raises(ConfigError) as exc:
        host_buffer.HostBlockBuffer(8 << 10, 1 << 20)
    assert "the CPU tier's 8.00 GiB is more than the 5.00 GiB of host memory available now" in str(exc.value)
    assert "--gpu-memory-utilization" in str(exc.value) and not made
