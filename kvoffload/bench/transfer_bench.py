"""Device<->host block copy throughput: batched kvoffload_ext path vs a per-block loop vs one copy.

On a CPU-only machine the "device" cache is a CPU tensor, so this measures the copy
mechanics (scatter/gather of many blocks), which is what the CPU backend runs.
(a) kvoffload_ext.copy_blocks per canonical view, (b) a per-block-per-layer ``copy_`` loop
(how vLLM's original swap_blocks moved blocks), (c) one contiguous copy of the same bytes.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from kvoffload.bench.measure import Sample, add_reps, interleaved, preamble, timed
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.layout import canonicalize
from kvoffload_ext import copy_blocks

LAYERS = 8


def _layers(layout: str, num_blocks: int, page_bytes: int) -> list[torch.Tensor]:
    if layout == "per-layer":
        row = page_bytes // (2 * LAYERS)
        return [torch.randint(0, 255, (2, num_blocks, row), dtype=torch.uint8) for _ in range(LAYERS)]
    return [torch.randint(0, 255, (num_blocks, page_bytes), dtype=torch.uint8)]


def measure(layout: str, page_bytes: int, total_bytes: int, reps: int) -> dict[str, Sample]:
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
    gb = n * kv.page_bytes / 1e9
    return interleaved({"ext": lambda: gb / timed(batched), "loop": lambda: gb / timed(per_block_loop),
                        "flat": lambda: gb / timed(lambda: flat_dst.copy_(flat_src))}, reps)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvoffload bench transfer")
    parser.add_argument("--total-mib", type=int, default=128)
    add_reps(parser)
    args = parser.parse_args(argv)
    print(f"device->host copy, {args.total_mib} MiB per measurement, {LAYERS} layers, "
          f"{torch.get_num_threads()} torch threads; GB/s; {preamble(args.reps)}")
    print(f"{'layout':<12}{'block':>8}{'(a) ext':>16}{'(b) loop':>16}{'(c) flat':>16}{'a/b':>14}{'a/c':>14}")
    for layout in ("per-layer", "cross-layer"):
        for page in (8 << 10, 64 << 10, 1 << 20):
            m = measure(layout, page, args.total_mib << 20, args.reps)
            a, b, c = m["ext"], m["loop"], m["flat"]
            print(f"{layout:<12}{page >> 10:>6}Ki{a.fmt():>16}{b.fmt():>16}{c.fmt():>16}{a.ratio(b).fmt('.1f'):>14}"
                  f"{a.ratio(c).fmt():>14}")
