"""Copies beside other GPU work: both directions at once, and a matmul loop while they run.

A serving engine stores the blocks a step wrote while it loads the blocks a returning request
needs, and both run while the model computes. Two figures follow from that: the bandwidth
of a store and a load issued together on two streams (against two contiguous copies issued
the same way: what the link gives both ways at once), and how much a bf16 matmul loop on the
compute stream slows while a job's copies run on copy streams (the kernel's thread blocks
hold SMs; the copy engines hold none). CUDA only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvoffload.bench.measure import Sample, interleaved
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.host_tables import host_copy_groups
from kvoffload.transfer.layout import CanonicalKVCache, canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE
from kvoffload_ext import copy_block_groups
from kvoffload_ext.copies import CopyGroup


def kv_layers(layout: str, layers: int, num_blocks: int, page_bytes: int, device: torch.device) -> list[torch.Tensor]:
    """Per-layer KV: a ``(2, num_blocks, row)`` tensor a layer (2 x layers rows a block);
    cross-layer: one ``(num_blocks, page)`` tensor (one row a block)."""
    if layout == "per-layer":
        row = page_bytes // (2 * layers)
        return [torch.randint(0, 255, (2, num_blocks, row), dtype=torch.uint8, device=device) for _ in range(layers)]
    return [torch.randint(0, 255, (num_blocks, page_bytes), dtype=torch.uint8, device=device)]


@dataclass(slots=True)
class BothWays:
    """A store job and a load job of ``n`` blocks each over disjoint device blocks and host rows."""

    kv: CanonicalKVCache
    store: list[CopyGroup]
    load: list[CopyGroup]
    nbytes: int  # both jobs together

    @classmethod
    def build(cls, layout: str, page_bytes: int, total_bytes: int, device: torch.device, layers: int) -> BothWays:
        n = max(8, total_bytes // page_bytes)
        kv = canonicalize(kv_layers(layout, layers, 2 * n, page_bytes, device), 2 * n)
        host = HostBlockBuffer(2 * n, kv.page_bytes, pin=True)
        rng = np.random.default_rng(0)
        dev = rng.permutation(2 * n)
        rows = rng.permutation(2 * n)
        store = host_copy_groups(kv, host, DEVICE_TO_HOST, dev[:n], rows[:n])
        load = host_copy_groups(kv, host, HOST_TO_DEVICE, dev[n:], rows[n:])
        return cls(kv, [g for t in store for g in t], [g for t in load for g in t], 2 * n * kv.page_bytes)


def measure_both(layout: str, page_bytes: int, total_bytes: int, reps: int, device: torch.device,
                 layers: int) -> dict[str, Sample]:
    """GB/s (bytes of both directions) of a store and a load issued together on two streams
    ("ext", the path a handler takes), and of two contiguous copies of the same sizes ("flat")."""
    job = BothWays.build(layout, page_bytes, total_bytes, device, layers)
    half = job.nbytes // 2
    flat_dev = torch.empty(2 * half, dtype=torch.uint8, device=device)
    flat_host = torch.empty(2 * half, dtype=torch.uint8, pin_memory=True)
    streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))

    def together(store, load) -> float:
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        ends = []
        for stream, work in zip(streams, (store, load)):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                work()
                end = torch.cuda.Event(enable_timing=True)
                end.record(stream)
                ends.append(end)
        torch.cuda.synchronize(device)
        return job.nbytes / 1e9 / (max(start.elapsed_time(e) for e in ends) / 1e3)

    fns = {
        "ext": lambda: together(lambda: copy_block_groups(job.store), lambda: copy_block_groups(job.load)),
        "flat": lambda: together(lambda: flat_host[:half].copy_(flat_dev[:half], non_blocking=True),
                                 lambda: flat_dev[half:].copy_(flat_host[half:], non_blocking=True)),
    }
    for fn in fns.values():
        fn()
    return interleaved(fns, reps)


def matmul_slowdown(layout: str, page_bytes: int, total_bytes: int, device: torch.device, layers: int,
                    reps: int, size: int = 8192, matmuls: int = 40) -> Sample:
    """How much longer ``matmuls`` bf16 products of ``size`` square take on the compute stream
    while a store and a load job copy on two other streams (the copies queued first, repeated
    to outlast the products), as a fraction of their time alone, run by run."""
    job = BothWays.build(layout, page_bytes, total_bytes, device, layers)
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    compute = torch.cuda.Stream(device)
    streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))

    def products(gate: torch.cuda.Event | None = None) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        if gate is not None:
            compute.wait_event(gate)
        with torch.cuda.stream(compute):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(compute)
            for _ in range(matmuls):
                torch.mm(a, b)
            end.record(compute)
        return start, end

    def alone() -> float:
        start, end = products()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)

    products_ms = alone()
    copy_ms = job.nbytes / 2 / 40e9 * 1e3  # a job's time at a plausible 40 GB/s
    repeat = max(2, int(3 * products_ms / max(copy_ms, 1e-3)) + 1)

    def beside() -> float:
        # Everything waits behind a spin on the default stream until all of it is queued, so
        # the copies and the products start together however long the host took to issue them.
        torch.cuda._sleep(100_000_000)
        gate = torch.cuda.Event()
        gate.record()
        for stream, groups in zip(streams, (job.store, job.load)):
            stream.wait_event(gate)
            with torch.cuda.stream(stream):
                for _ in range(repeat):
                    copy_block_groups(groups)
        start, end = products(gate)
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)

    ratios = []
    for _ in range(reps):
        base = alone()
        ratios.append(beside() / base - 1.0)
    return Sample(tuple(ratios))


def kernel_sms(device: torch.device) -> str:
    """How many SMs the copy kernel can hold: one thread block an SM at most, grid capped."""
    from kvoffload_ext.copies.cuda_copy import GRID_BLOCKS, THREADS

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return f"copy kernel: at most {GRID_BLOCKS} thread blocks of {THREADS} threads, so at most {GRID_BLOCKS} of {sms} SMs"
