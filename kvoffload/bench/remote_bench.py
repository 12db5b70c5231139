"""Mooncake tier speed: the tier's store and load paths (StoreIO: staging copy, header,
checksum, one batched call per chunk) vs raw ``batch_put_from`` / ``batch_get_into`` of the
same bytes from registered memory, and the scheduler's lookup of a 64-block request vs a raw
``batch_is_exist``. Starts its own master on loopback unless one is given."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvoffload.bench.measure import Sample, bench_parser, positive_int, preamble, timed
from kvoffload.testing.mooncake_master import MooncakeMaster
from kvoffload.tiers.mooncake.options import parse_options
from kvoffload.tiers.mooncake.spec import MooncakeLoadStoreSpec
from kvoffload.tiers.mooncake.store import MooncakeStore
from kvoffload.tiers.store.io import StoreIO
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.tiers.store.lookups import StoreLookups
from kvoffload.tiers.store.tier import SharedStoreTier


def _paths(store: MooncakeStore, io: StoreIO, data: np.ndarray, out: np.ndarray, hashes: list[int], names: list[str],
           batch: int) -> dict[str, Callable[[], object]]:
    """The four timed paths of one repetition, over the same blocks in calls of ``batch``."""
    n, block_bytes = data.shape
    raw_names = [f"raw/{k}" for k in names]
    chunks = [range(i, min(n, i + batch)) for i in range(0, n, batch)]

    def ours_store() -> None:
        for c in chunks:
            io.write([data[i].data for i in c], list(c), [hashes[i] for i in c])

    def raw_put() -> None:
        for c in chunks:
            status = store.put_from([raw_names[i] for i in c], [data[i].ctypes.data for i in c], [block_bytes] * len(c))
            assert all(s == 0 for s in status), status

    def ours_load() -> None:
        for c in chunks:
            io.read(list(c), [hashes[i] for i in c], [out[i].data for i in c])

    def raw_get() -> None:
        for c in chunks:
            status = store.get_into([raw_names[i] for i in c], [out[i].ctypes.data for i in c], [block_bytes] * len(c))
            assert all(s == block_bytes for s in status), status

    return {"store": ours_store, "raw put": raw_put, "load": ours_load, "raw get": raw_get}


def bench_paths(store: MooncakeStore, block_bytes: int, total_bytes: int, batch: int, reps: int) -> list[str]:
    n = max(batch, total_bytes // block_bytes // batch * batch)
    keys = StoreKeys.of("bench", 16, block_bytes, 1)
    io = StoreIO(store, keys, 0, block_bytes, staging_bytes=2 * batch * (block_bytes + 64))
    data = np.random.default_rng(0).integers(0, 255, (n, block_bytes), dtype=np.uint8)
    out = np.empty_like(data)
    io.register_memory(data.ctypes.data, data.nbytes)  # as the handler registers the host tier's buffer
    io.register_memory(out.ctypes.data, out.nbytes)
    results: dict[str, list[float]] = {k: [] for k in ("store", "raw put", "load", "raw get")}
    gb = n * block_bytes / 1e9
    try:
        for rep in range(-1, reps):  # a warm-up round first, not counted
            hashes = [(rep + 1) * n + i for i in range(n)]
            names = keys.rank_keys(hashes, 0)
            paths = _paths(store, io, data, out, hashes, names, batch)
            order = ["raw put", "store", "raw get", "load"] if rep % 2 else ["store", "raw put", "load", "raw get"]
            for name in order:
                out[:] = 0
                speed = gb / timed(paths[name])
                assert np.array_equal(out, data) or name in ("store", "raw put")
                if rep >= 0:
                    results[name].append(speed)
            store.remove(names + [f"raw/{k}" for k in names])
    finally:
        io.close_memory()
    size = f"{block_bytes >> 10} KiB"
    rows = []
    for ours, raw in (("store", "raw put"), ("load", "raw get")):
        a, b = Sample(tuple(results[ours])), Sample(tuple(results[raw]))
        rows.append(f"{size:>8}  {ours:<6} {a.fmt('8.3f')} GB/s  {raw:<8} {b.fmt('8.3f')} GB/s  ratio {a.ratio(b).fmt('8.3f')}")
    return rows


def bench_lookup(store: MooncakeStore, blocks: int, reps: int) -> str:
    keys = StoreKeys.of("bench-lookup", 16, 64, 1)
    hashes = list(range(blocks))
    buf = np.zeros(64, dtype=np.uint8)
    store.register(buf.ctypes.data, buf.nbytes)
    names = keys.rank_keys(hashes, 0)
    store.put_from(names, [buf.ctypes.data] * blocks, [64] * blocks)
    tier = SharedStoreTier(MooncakeLoadStoreSpec, StoreLookups(store, keys, wait_s=1.0), 1 << 16)
    ours, raw = [], []
    for _ in range(reps):
        ours.append(timed(lambda: tier.lookup_run(hashes)) * 1e6)
        raw.append(timed(lambda: store.exists(names)) * 1e6)
    tier.lookups._pool.shutdown()
    store.remove(names)
    store.unregister(buf.ctypes.data)
    a, b = Sample(tuple(ours)), Sample(tuple(raw))
    return (f"lookup of a {blocks}-block request: ours {a.fmt('8.3f')} us   raw batch_is_exist {b.fmt('8.3f')} us   "
            f"ratio {a.ratio(b).fmt('8.3f')}")


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("remote", __doc__)
    parser.add_argument("--master", default=None, help="host:port of a running mooncake_master (default: start one)")
    parser.add_argument("--metadata-server", default=None, help="its metadata URL (with --master)")
    parser.add_argument("--total-mib", type=int, default=32, help="bytes per path per repetition")
    parser.add_argument("--batch", type=int, default=64, help="blocks per call (one transfer job)")
    parser.add_argument("--reps", type=positive_int, default=9, help="runs per figure (median ± half-range)")
    args = parser.parse_args(argv)
    master = None
    if args.master is None:
        master = MooncakeMaster().start()
        tier = master.tier()
    else:
        tier = {"master": args.master, "metadata_server": args.metadata_server or "http://127.0.0.1:8080/metadata"}
    opts = parse_options({**{k: v for k, v in tier.items() if k not in ("name", "medium")},
                          "segment": f"{3 * max(args.total_mib, args.batch) + 64}MiB"}, "bench")  # ours + raw, 1 MiB blocks
    store = MooncakeStore.connect(opts, "bench", lend_segment=True)
    try:
        print(f"kvoffload bench remote: Mooncake Store at {opts.master} over {opts.protocol}, {args.total_mib} MiB per path, "
              f"{args.batch} blocks per call; {preamble(args.reps)}")
        for block_bytes in (64 << 10, 1 << 20):
            for row in bench_paths(store, block_bytes, args.total_mib << 20, args.batch, args.reps):
                print(row)
        print(bench_lookup(store, 64, max(50, args.reps * 20)))
    finally:
        store.close()
        if master is not None:
            master.stop()


if __name__ == "__main__":
    main()
