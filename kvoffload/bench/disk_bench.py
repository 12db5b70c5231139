"""Disk tier throughput (record writes/reads with checksums) vs plain sequential I/O, and
index recovery time. Both sides go through the OS page cache, as the tier does in service."""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble, sample
from kvoffload.tiers.disk.format import RECORD_HEADER, DiskLayout, data_checksum, parse_record_header, record_header
from kvoffload.tiers.disk.tier import DiskTier


def tier_io(path: str, block_bytes: int, total: int) -> tuple[float, float, float, float]:
    """(tier write, tier read, sequential write, sequential read) in GB/s. The baseline writes
    and reads the same bytes as one file in 8 MiB calls through the page cache (the write
    fsync'd, as the tier's): what this file system gives at best, not O_DIRECT device speed."""
    n = max(4, total // block_bytes)
    layout = DiskLayout("bench", block_bytes, 16, n)
    mgr = DiskTier(path, layout)
    fd = mgr._fds[0]
    data = np.random.default_rng(0).integers(0, 255, block_bytes, dtype=np.uint8)
    slots = np.random.default_rng(1).permutation(n).tolist()
    t0 = time.perf_counter()
    for i, slot in enumerate(slots):
        mv = data.data
        os.pwritev(fd, [record_header(i, data_checksum(mv)), mv], layout.offset(slot))
    os.fsync(fd)
    w = time.perf_counter() - t0
    buf = np.empty(block_bytes, dtype=np.uint8)
    header = bytearray(RECORD_HEADER)
    t0 = time.perf_counter()
    for slot in slots:
        os.preadv(fd, [header, buf.data], layout.offset(slot))
        parsed = parse_record_header(bytes(header))
        assert parsed is not None and parsed[1] == data_checksum(buf.data)
    r = time.perf_counter() - t0
    mgr.close()
    plain = os.path.join(path, "plain.bin")
    chunk = data.tobytes() * max(1, (8 << 20) // block_bytes)
    t0 = time.perf_counter()
    with open(plain, "wb", buffering=0) as f:
        written = 0
        while written < n * block_bytes:
            written += f.write(chunk)
        os.fsync(f.fileno())
    dw = time.perf_counter() - t0
    t0 = time.perf_counter()
    with open(plain, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    dr = time.perf_counter() - t0
    os.unlink(plain)
    gb = n * block_bytes / 1e9
    return gb / w, gb / r, gb / dw, gb / dr


def recovery(path: str, num_blocks: int, block_bytes: int = 1024) -> float:
    layout = DiskLayout("recovery", block_bytes, 16, num_blocks)
    mgr = DiskTier(path, layout)
    data = memoryview(bytes(block_bytes))
    check = data_checksum(data)
    for slot in range(num_blocks):
        os.pwritev(mgr._fds[0], [record_header(slot, check), data], layout.offset(slot))
    mgr.close()
    t0 = time.perf_counter()
    again = DiskTier(path, layout)
    dt = time.perf_counter() - t0
    assert again.num_recovered == num_blocks
    again.close()
    return dt


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("disk", __doc__)
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--recovery-blocks", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    add_reps(parser, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"disk tier (random slots, one record per call) vs one sequential file (8 MiB calls, page cache), "
              f"{args.total_mib} MiB, in {tmp}; GB/s; {preamble(args.reps)}")
        print(f"{'block':>8}{'tier write':>16}{'seq write':>16}{'ratio':>14}{'tier read':>16}{'seq read':>16}{'ratio':>14}")
        for block in (64 << 10, 1 << 20):
            runs = [tier_io(tmp, block, args.total_mib << 20) for _ in range(args.reps)]
            tw, tr, dw, dr = (Sample(tuple(r[i] for r in runs)) for i in range(4))
            print(f"{block >> 10:>6}Ki{tw.fmt():>16}{dw.fmt():>16}{tw.ratio(dw).fmt():>14}{tr.fmt():>16}{dr.fmt():>16}"
                  f"{tr.ratio(dr).fmt():>14}")
        dt = sample(lambda: recovery(tmp, args.recovery_blocks), args.reps)
        print(f"recovery of {args.recovery_blocks:,} blocks: {dt.fmt()} s "
              f"({dt.median / args.recovery_blocks * 1e6:.1f} us/block)")
