"""fs tier throughput with 1, 2 and 4 processes on one directory: stores and loads of keyed,
checksummed block records (the tier's own FsStore and StoreIO), and lookups, vs plain
sequential file I/O of the same bytes by the same processes in the same run (one file per
process, written and read in block-sized calls). Both go through the OS page cache, as the tier
does in service; neither side fsyncs (the tier does not: a record torn by a power loss fails its
checksum and is a miss), and the page cache is flushed between phases, so no phase pays for the
writeback of another."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble
from kvoffload_ext.fs_records import fs_files

BLOCKS = (64 << 10, 256 << 10, 1 << 20, 2 << 20)
PHASES = ("store", "load", "lookup", "plain_write", "plain_read")
JOB_BLOCKS = 16  # blocks per store or load call, as the tier's handler batches them


@dataclass(frozen=True, slots=True)
class Job:
    rank: int
    procs: int
    dirs: tuple[str, ...]
    block: int
    total: int
    reps: int
    io_threads: int


def _worker(job: Job, barrier: Any, out: Any) -> None:
    data = np.random.default_rng(job.rank).integers(0, 256, (JOB_BLOCKS, job.block), dtype=np.uint8)
    for rep in range(job.reps):
        roots = [Path(d, f"rep{rep}") for d in job.dirs]
        barrier.wait()
        n, times = _one_rep(job, roots, data, barrier)
        out.put((rep, job.rank, n, times))
        barrier.wait()
        if job.rank == 0:
            for r in roots:
                shutil.rmtree(r, ignore_errors=True)


def _one_rep(job: Job, roots: list[Path], data: np.ndarray, barrier: Any) -> tuple[int, dict[str, tuple[float, float]]]:
    """Each phase on this process's share of the bytes, started together with the others'."""
    from kvoffload.auth import RecordTagger
    from kvoffload.offload.abstract import BlockHash
    from kvoffload.tiers.fs.directory import FsDirectory
    from kvoffload.tiers.fs.store import FsStore
    from kvoffload.tiers.store.io import StoreIO
    from kvoffload.tiers.store.keys import StoreKeys
    from kvoffload.tiers.store.record import HEADER_BYTES

    n = max(JOB_BLOCKS, job.total // job.block // job.procs)
    views = [row.data for row in data]
    back = np.empty_like(data)
    back_views = [row.data for row in back]
    capacity = 4 * job.total // len(roots)  # room for every block: nothing is evicted while measuring
    store = FsStore([FsDirectory(r, capacity, HEADER_BYTES + job.block, "bench") for r in roots], job.io_threads)
    io = StoreIO(store, StoreKeys.of("bench", 16, job.block, 1), 0, job.block, JOB_BLOCKS * (HEADER_BYTES + job.block),
                 RecordTagger())
    keys: list[BlockHash] = [job.rank << 32 | i for i in range(n)]
    batches = [keys[i : i + JOB_BLOCKS] for i in range(0, n, JOB_BLOCKS)]
    names = io.keys.rank_keys(keys, 0)
    plain = roots[job.rank % len(roots)] / f"plain-{job.rank}.bin"

    def store_all() -> None:
        for b in batches:
            io.write(views[: len(b)], list(range(len(b))), b)

    def load_all() -> None:
        for b in batches:
            io.read(list(range(len(b))), b, back_views[: len(b)])

    def lookup_all() -> None:
        for i in range(0, n, 64):
            assert all(s == 1 for s in store.exists(names[i : i + 64]))

    def plain_write() -> None:
        fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for i in range(n):
            os.write(fd, views[i % JOB_BLOCKS])
        os.close(fd)

    def plain_read() -> None:
        fd = os.open(plain, os.O_RDONLY)
        for i in range(n):
            os.readv(fd, [back_views[i % JOB_BLOCKS]])
        os.close(fd)

    times: dict[str, tuple[float, float]] = {}
    for name, fn in zip(PHASES, (store_all, load_all, lookup_all, plain_write, plain_read)):
        os.sync()  # the previous phase's (and run's) writeback is not charged to this one
        barrier.wait()
        t0 = time.monotonic()
        fn()
        times[name] = (t0, time.monotonic())
    assert np.array_equal(back[0], data[0])
    store.close()
    return n, times


def measure(procs: int, dirs: tuple[str, ...], block: int, total: int, reps: int, io_threads: int = 4
            ) -> dict[str, Sample]:
    """Per phase, the aggregate rate of ``procs`` processes (GB/s; lookups: keys/s) per rep."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(Job(r, procs, dirs, block, total, reps, io_threads), barrier, out))
               for r in range(procs)]
    for w in workers:
        w.start()
    runs: dict[int, list[tuple[int, dict[str, tuple[float, float]]]]] = {}
    for _ in range(procs * reps):
        rep, _rank, n, times = out.get(timeout=600)
        runs.setdefault(rep, []).append((n, times))
    for w in workers:
        w.join(timeout=60)
        if w.exitcode != 0:
            raise RuntimeError(f"bench fs: a worker exited with {w.exitcode}")
    rates: dict[str, list[float]] = {p: [] for p in PHASES}
    for rep in sorted(runs):
        for p in PHASES:
            start = min(t[p][0] for _, t in runs[rep])
            end = max(t[p][1] for _, t in runs[rep])
            count = sum(n for n, _ in runs[rep])
            rates[p].append(count / (end - start) if p == "lookup" else count * block / 1e9 / (end - start))
    return {p: Sample(tuple(v)) for p, v in rates.items()}


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("fs", __doc__)
    parser.add_argument("--total-mib", type=int, default=256, help="bytes each run moves, over all processes")
    parser.add_argument("--dir", action="append", default=None,
                        help="a directory to measure in (repeat for paths: over several; default: a temp dir)")
    parser.add_argument("--procs", default="1,2,4", help="process counts, comma-separated")
    parser.add_argument("--blocks", default=",".join(str(b >> 10) for b in BLOCKS), help="block sizes in KiB")
    parser.add_argument("--io-threads", type=int, default=4, help="the tier's io_threads in each process")
    add_reps(parser, default=3)
    args = parser.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",")]
    blocks = [int(b) << 10 for b in args.blocks.split(",")]
    with tempfile.TemporaryDirectory(prefix="kvoffload-fs-bench-") as tmp:
        given = tuple(args.dir or ())
        named = "one directory" if len(given) == 1 else f"paths: {len(given)} directories"
        setups = [(given, named)] if given else [
            ((tmp,), "one directory"), ((f"{tmp}/a", f"{tmp}/b"), "paths: two directories (one file system here)")]
        files = "native" if fs_files.available() else "Python (no C compiler)"
        print(f"fs tier ({files} record files, io_threads {args.io_threads}) vs plain sequential file I/O of the "
              f"same bytes (one file per process, block-sized calls, page cache), {args.total_mib} MiB per run; "
              f"GB/s, lookups in keys/s; {preamble(args.reps)}")
        for dirs, label in setups:
            print(f"\n{label}: {', '.join(dirs)}")
            print(f"{'procs':>5}{'block':>8}{'store':>14}{'plain write':>14}{'ratio':>13}"
                  f"{'load':>14}{'plain read':>14}{'ratio':>13}{'lookups/s':>18}")
            for block in blocks:
                for n in procs:
                    s = measure(n, dirs, block, args.total_mib << 20, args.reps, args.io_threads)
                    print(f"{n:>5}{block >> 10:>6}Ki{s['store'].fmt():>14}{s['plain_write'].fmt():>14}"
                          f"{s['store'].ratio(s['plain_write']).fmt():>13}{s['load'].fmt():>14}"
                          f"{s['plain_read'].fmt():>14}{s['load'].ratio(s['plain_read']).fmt():>13}"
                          f"{s['lookup'].fmt(',.0f'):>18}", flush=True)
