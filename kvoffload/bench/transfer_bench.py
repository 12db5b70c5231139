"""Device<->host block copy throughput: the batched path vs a per-block loop vs one copy.

(a) ``copy_block_groups`` over every canonical view and host chunk of the job, as the
handler issues it (one native call on CPU, one kernel launch on CUDA); (b) a per-block,
per-row ``copy_`` loop (how vLLM's original swap_blocks moved blocks); (c) one contiguous
copy of the same bytes (on CUDA: device <-> pinned host, the practical peak). On a CPU-only
machine the "device" cache is a CPU tensor, so this measures the copy mechanics (gather and
scatter of many rows), which is what the CPU backend runs. Per-layer KV: each layer is a
``(2, num_blocks, row)`` tensor, so a block has ``2 * layers`` rows; cross-layer: one row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from kvoffload.bench.measure import Sample, add_reps, bench_parser, interleaved, preamble, timed
from kvoffload.bench.transfer_overlap import kernel_sms, kv_layers, matmul_slowdown, measure_both
from kvoffload.transfer.host_buffer import HostBlockBuffer
from kvoffload.transfer.host_tables import host_copy_groups
from kvoffload.transfer.layout import canonicalize
from kvoffload.transfer.result import DEVICE_TO_HOST, HOST_TO_DEVICE
from kvoffload_ext import copy_block_groups
from kvoffload_ext.copies.cpu_copy import COPY_THREADS, copy_ranges_cpu

D2H, H2D = "device->host", "host->device"


def measure(layout: str, page_bytes: int, total_bytes: int, reps: int, device: torch.device, layers: int,
            direction: str = D2H) -> dict[str, Sample]:
    n = max(8, total_bytes // page_bytes)
    num_blocks = n * 2
    cuda = device.type == "cuda"
    kv = canonicalize(kv_layers(layout, layers, num_blocks, page_bytes, device), num_blocks)
    host = HostBlockBuffer(n, kv.page_bytes, pin=cuda)
    rng = np.random.default_rng(0)
    dev_ids = rng.permutation(num_blocks)[:n]
    host_ids = rng.permutation(n)
    stream = torch.cuda.Stream(device) if cuda else None

    def on_stream(fn: Callable[[], None]) -> Callable[[], None]:
        if stream is None:
            return fn

        def run() -> None:
            with torch.cuda.stream(stream):
                fn()
            stream.synchronize()

        return run

    def batched() -> None:
        by_layer = host_copy_groups(kv, host, DEVICE_TO_HOST if direction == D2H else HOST_TO_DEVICE, dev_ids, host_ids)
        copy_block_groups([g for layer in by_layer for g in layer])

    def per_block_loop() -> None:
        for d, h in zip(dev_ids.tolist(), host_ids.tolist()):
            row = host.row(h)
            for view, off in zip(kv.views, kv.row_offsets):
                cols = row[off : off + view.shape[1]]
                if direction == D2H:
                    cols.copy_(view[d], non_blocking=cuda)
                else:
                    view[d].copy_(cols, non_blocking=cuda)

    flat_dev = torch.randint(0, 255, (n * kv.page_bytes,), dtype=torch.uint8, device=device)
    flat_host = torch.empty(n * kv.page_bytes, dtype=torch.uint8, pin_memory=cuda)

    if cuda:

        def flat() -> None:
            if direction == D2H:
                flat_host.copy_(flat_dev, non_blocking=True)
            else:
                flat_dev.copy_(flat_host, non_blocking=True)

    else:
        # The same native loop on the same threads as (a), over the bytes as one contiguous run
        # in 1 MiB pieces (one memcpy per piece: glibc switches to non-temporal stores for
        # single copies above ~3/4 of the last-level cache, slower on this kind of machine), so
        # only the layout differs; torch's own copy would add OpenMP workers that keep spinning
        # after it and take a core from the next timed copy.
        nbytes = n * kv.page_bytes
        offs = np.arange(0, nbytes, 1 << 20, dtype=np.int64)
        lens = np.minimum(1 << 20, nbytes - offs)
        src, dst = flat_dev.data_ptr() + offs, flat_host.data_ptr() + offs
        if direction == H2D:
            src, dst = dst, src

        def flat() -> None:
            copy_ranges_cpu(src, dst, lens)

    fns = {"ext": on_stream(batched), "loop": on_stream(per_block_loop), "flat": on_stream(flat)}
    for fn in fns.values():
        fn()  # touch every page and compile the kernel before timing
    gb = n * kv.page_bytes / 1e9

    def rate(fn: Callable[[], None]) -> Callable[[], float]:
        return lambda: gb / timed(fn)

    return interleaved({name: rate(fn) for name, fn in fns.items()}, reps)


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("transfer", __doc__)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N for the GPU path")
    parser.add_argument("--total-mib", type=int, default=None, help="bytes per measurement (default 128 cpu, 1024 cuda)")
    parser.add_argument("--layers", type=int, default=None,
                        help="per-layer KV: layers (default 8 on cpu; 32 on cuda, Llama-3-8B-like)")
    parser.add_argument("--per-layer-kib", type=int, nargs="*", default=None,
                        help="per-layer: block sizes in KiB (all rows of a block; default 64 256 1024 cpu, "
                             "512 1024 2048 4096 cuda = 8-64 KiB rows x 32 layers x K,V)")
    parser.add_argument("--cross-layer-kib", type=int, nargs="*", default=None,
                        help="cross-layer: block sizes in KiB (default 8 64 1024 cpu, 1024 2048 cuda)")
    add_reps(parser)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is visible; use --device cpu")
    cuda = device.type == "cuda"
    total = (args.total_mib or (1024 if cuda else 128)) << 20
    layers = args.layers or (32 if cuda else 8)
    per_layer = args.per_layer_kib if args.per_layer_kib is not None else ([512, 1024, 2048, 4096] if cuda else [64, 256, 1024])
    cross = args.cross_layer_kib if args.cross_layer_kib is not None else ([1024, 2048] if cuda else [8, 64, 1024])
    name = torch.cuda.get_device_name(device) if cuda else f"cpu, {torch.get_num_threads()} torch threads"
    print(f"block copies on {name}, {total >> 20} MiB per measurement; GB/s; {preamble(args.reps)}")
    flat = "one torch copy_" if cuda else f"1 MiB memcpys by (a)'s native loop on its {COPY_THREADS} threads"
    print(f"(a) batched copy_block_groups  (b) per-block per-row copy_ loop  (c) one contiguous copy of the same "
          f"bytes ({flat})")
    print(f"{'direction':<14}{'layout':<12}{'block':>8}{'row':>8}{'(a) ext':>16}{'(b) loop':>16}{'(c) flat':>16}"
          f"{'a/b':>14}{'a/c':>14}")
    directions = (D2H, H2D) if cuda else (D2H,)
    for direction in directions:
        for layout, pages in (("per-layer", per_layer), ("cross-layer", cross)):
            for kib in pages:
                m = measure(layout, kib << 10, total, args.reps, device, layers, direction)
                a, b, c = m["ext"], m["loop"], m["flat"]
                row = (kib << 10) // (2 * layers) if layout == "per-layer" else kib << 10
                print(f"{direction:<14}{layout:<12}{kib:>6}Ki{row >> 10:>6}Ki{a.fmt():>16}{b.fmt():>16}{c.fmt():>16}"
                      f"{a.ratio(b).fmt('.1f'):>14}{a.ratio(c).fmt():>14}")
    if cuda:
        _beside_compute(device, total, layers, per_layer, cross, args.reps)


def _beside_compute(device: torch.device, total: int, layers: int, per_layer: list[int], cross: list[int],
                    reps: int) -> None:
    """Both directions at once, the copy methods the runs above settled, and compute beside copies."""
    from kvoffload_ext.copies.cuda_copy import methods_for

    print("\nboth directions at once (a store and a load on two streams; GB/s of both; (c) two contiguous copies)")
    print(f"{'layout':<12}{'block':>8}{'row':>8}{'(a) ext':>16}{'(c) flat':>16}{'a/c':>14}")
    for layout, pages in (("per-layer", per_layer), ("cross-layer", cross)):
        for kib in pages:
            m = measure_both(layout, kib << 10, total, reps, device, layers)
            row = (kib << 10) // (2 * layers) if layout == "per-layer" else kib << 10
            print(f"{layout:<12}{kib:>6}Ki{row >> 10:>6}Ki{m['ext'].fmt():>16}{m['flat'].fmt():>16}"
                  f"{m['ext'].ratio(m['flat']).fmt():>14}")
    chosen = methods_for(device)
    print(f"\ncopy methods for {chosen.name} (methods: {', '.join(chosen.methods)}; GB/s on a 16 MiB probe)")
    for r in chosen.rows():
        print("  " + r.describe())
    print("\n" + kernel_sms(device))
    print("a bf16 8192^3 matmul loop on the compute stream while a store and a load copy beside it; slowdown:")
    for layout, pages in (("per-layer", per_layer[:1]), ("cross-layer", cross[-1:])):
        for kib in pages:
            s = matmul_slowdown(layout, kib << 10, total, device, layers, reps)
            print(f"  {layout:<12}{kib:>6} KiB blocks: {s.fmt('.1f', 100.0)} %")
