"""What the whole-file weight fingerprint costs at start-up: hashing every byte of a checkpoint
from disk (the first start after the weights change), vs reading the same bytes without hashing
(what loading the weights costs anyway), and a later start, which only stats the files (their
digests are cached by identity). The files' pages are dropped from the page cache before each
cold run (posix_fadvise DONTNEED), so reads come from the disk as far as the OS allows."""

from __future__ import annotations

import os
import tempfile
from functools import partial
from pathlib import Path

from kvoffload.bench.measure import Sample, add_reps, bench_parser, preamble, timed
from kvoffload.config import parse_size
from kvoffload.weight_digests import weights_fingerprint

_CHUNK = 8 << 20


def _write_checkpoint(root: Path, total: int, shards: int) -> list[Path]:
    block = os.urandom(_CHUNK)
    files = []
    for i in range(shards):
        path = root / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        with open(path, "wb") as f:
            left = total // shards
            while left > 0:
                left -= f.write(block[: min(_CHUNK, left)])
            f.flush()
            os.fsync(f.fileno())
        files.append(path)
    return files


def _drop_cache(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_all(files: list[Path]) -> None:
    buf = bytearray(_CHUNK)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser("weights", __doc__)
    parser.add_argument("--size", default="16GiB", help="checkpoint size, written once as random bytes")
    parser.add_argument("--shards", type=int, default=4, help="weight files the checkpoint is split into")
    parser.add_argument("--dir", default=None, help="where to write it (default: a temp dir on the default disk)")
    add_reps(parser, default=3)
    args = parser.parse_args(argv)
    total = parse_size(args.size, "--size")
    print(preamble(args.reps))
    with tempfile.TemporaryDirectory(prefix="kvoffload-weights-bench-", dir=args.dir) as tmp:
        root = Path(tmp, "ckpt")
        root.mkdir()
        print(f"writing a {total / 1e9:.1f} GB checkpoint in {args.shards} files under {tmp} ...", flush=True)
        files = _write_checkpoint(root, total, args.shards)
        reads, hashes, cached = [], [], []
        for rep in range(args.reps):
            digests = Path(tmp, f"digests{rep}")
            _drop_cache(files)
            reads.append(timed(lambda: _read_all(files)))
            _drop_cache(files)
            fingerprint = partial(weights_fingerprint, root, digests)
            hashes.append(timed(fingerprint))
            cached.append(timed(fingerprint))
        read, hashed, warm = Sample(tuple(reads)), Sample(tuple(hashes)), Sample(tuple(cached))
        gb = total / 1e9
        print(f"plain read (baseline)     {read.fmt('.2f')} s  ({gb / read.median:.2f} GB/s)")
        print(f"full fingerprint, cold    {hashed.fmt('.2f')} s  ({gb / hashed.median:.2f} GB/s)  "
              f"ratio to the read {hashed.ratio(read).fmt('.2f')}x")
        print(f"later start (cached)      {warm.fmt('.4f')} s  (stat of {len(files)} files)")
