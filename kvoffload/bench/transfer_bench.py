"""Device<->host block copy throughput: batched kvoffload_ext path vs a per-block loop vs one copy.

On a CPU-only machine the "device" cache is a CPU tensor, so this measures the copy
mechanics (scatter/gather of many blocks), which is what the CPU backend runs.
(a) kvoffload_ext.copy_blocks per canonical view, (b) a per-block-per-layer ``copy_`` loop
(how vLLM's original swap_blocks moved blocks), (c) one contiguous copy of the same bytes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload_ext import copy_blocks

LAYERS = 8


def _layers(layout: str, num_blocks: int, page_bytes: int) -> list[torch.Tensor]:
    if layout == "per-layer":
        row = page_bytes // (2 * LAYERS)
        return [torch.randint(0, 255, (2, num_blocks, row), dtype=torch.uint8) for _ in range(LAYERS)]
    return [torch.randint(0, 255, (num_blocks, page_bytes), dtype=torch.uint8)]


def _best(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(layout: str, page_bytes: int, total_bytes: int) -> tuple[float, float, float]:
    n = max(8, total_bytes // page_bytes)
    num_blocks = n * 2
    kv = canonicalize(_layers(layout, num_blocks, page_bytes), num_blocks)
    host = HostBlockBuffer(n, kv.page_bytes)
    rng = np.random.default_rng(0)
    dev_ids = rng.permutation(num_blocks)[:n]
    host_ids = rng.permutation(n)
    offsets = np.cumsum((0,) + kv.row_bytes[:-1]).tolist()

    def batched() -> None:
        for view, off in zip(kv.views, offsets):
            for chunk, rows, dev in host.group(host_ids, dev_ids):
                copy_blocks(view, chunk[:, off : off + view.shape[1]], dev, rows)

    def per_block_loop() -> None:
        for d, h in zip(dev_ids.tolist(), host_ids.tolist()):
            dst = host.row(h)
            for view, off in zip(kv.views, offsets):
                dst[off : off + view.shape[1]].copy_(view[d])

    flat_src = torch.randint(0, 255, (n * kv.page_bytes,), dtype=torch.uint8)
    flat_dst = torch.empty_like(flat_src)
    batched()  # touch the host pages once before timing
    nbytes = n * kv.page_bytes
    return (nbytes / _best(batched) / 1e9, nbytes / _best(per_block_loop) / 1e9,
            nbytes / _best(lambda: flat_dst.copy_(flat_src)) / 1e9)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvoffload bench transfer")
    parser.add_argument("--total-mib", type=int, default=128)
    args = parser.parse_args(argv)
    print(f"device->host copy, {args.total_mib} MiB per measurement, {LAYERS} layers, "
          f"{torch.get_num_threads()} torch threads; GB/s (best of 3)")
    print(f"{'layout':<12}{'block':>8}{'(a) ext':>10}{'(b) loop':>10}{'(c) flat':>10}{'a/b':>7}{'a/c':>7}")
    for layout in ("per-layer", "cross-layer"):
        for page in (8 << 10, 64 << 10, 1 << 20):
            a, b, c = measure(layout, page, args.total_mib << 20)
            print(f"{layout:<12}{page >> 10:>6}Ki{a:>10.2f}{b:>10.2f}{c:>10.2f}{a / b:>7.1f}{a / c:>7.2f}")
