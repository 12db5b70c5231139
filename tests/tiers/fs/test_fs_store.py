"""FsStore, the files under the fs tier: records round-trip byte for byte, the directory stays
within its capacity whatever writes it, least recently used records go first, and whatever a
crash, a foreign file or a broken directory leaves is a miss, never a served value."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvoffload.errors import ConfigError
from kvoffload.tiers.fs import store as store_module
from kvoffload.tiers.fs.bucket import allocated
from kvoffload.tiers.fs.directory import META_NAME, FsDirectory, bucket_count
from kvoffload.tiers.fs.record_files import record_files
from kvoffload.tiers.fs.store import MISSING, NO_ROOM, FsStore
from kvoffload_ext.fs_records import fs_files

RECORD = 8192 - 64  # a record's bytes: allocated as 8 KiB


@pytest.fixture(autouse=True, params=["native", "python"])
def files_impl(request, monkeypatch) -> str:
    """Every test here runs on both record-file implementations (they must behave alike)."""
    if request.param == "native" and not fs_files.available():
        pytest.skip("no C compiler: the native record files cannot be built")
    wanted = request.param == "native"
    monkeypatch.setattr(store_module, "record_files", lambda native=None: record_files(wanted if native is None else native))
    return str(request.param)


def open_store(root: Path, capacity: int = 1 << 20, record: int = RECORD, dirs: int = 1,
               native: bool | None = None) -> FsStore:
    roots = [root] if dirs == 1 else [root / f"d{i}" for i in range(dirs)]
    return FsStore([FsDirectory(r, capacity // dirs, record, "tiers[1].path") for r in roots], native=native)


def value(i: int, n: int = RECORD) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def put(store: FsStore, keys: list[str], values: list[np.ndarray]) -> list[int]:
    return store.put_from(keys, [v.ctypes.data for v in values], [v.nbytes for v in values])


def get(store: FsStore, keys: list[str], n: int = RECORD) -> tuple[list[int], list[np.ndarray]]:
    out = [np.zeros(n, dtype=np.uint8) for _ in keys]
    return store.get_into(keys, [o.ctypes.data for o in out], [n] * len(keys)), out


def disk_bytes(root: Path) -> int:
    """What the records and temporaries hold, as the tier counts them."""
    return sum(allocated(p.stat().st_size) for p in root.rglob("*") if p.suffix in (".kv", ".tmp"))


def test_values_round_trip_byte_identical_in_parts_and_whole(tmp_path):
    store = open_store(tmp_path)
    keys = [f"ns/a/{i}" for i in range(10)]
    vals = [value(i) for i in range(10)]
    assert put(store, keys, vals) == [0] * 10
    status, out = get(store, keys)
    assert status == [RECORD] * 10 and all(np.array_equal(a, b) for a, b in zip(out, vals))
    assert store.exists(keys + ["ns/a/none"]) == [1] * 10 + [0]
    head, body = np.zeros(64, np.uint8), np.zeros(RECORD - 64, np.uint8)
    assert store.get_into_parts(keys[:1], [[head.ctypes.data, body.ctypes.data]], [[64, RECORD - 64]]) == [RECORD]
    assert np.array_equal(np.concatenate([head, body]), vals[0])
    assert get(store, ["ns/a/none"])[0] == [MISSING]


def test_a_record_in_many_odd_sized_parts_round_trips(tmp_path):
    """More parts than one readv/writev call takes (the native loop moves 16 at a time), of
    sizes that end mid-page: the file holds them back to back and reads split them again."""
    store = open_store(tmp_path)
    sizes = [1 + 97 * i for i in range(40)]
    whole = value(5, sum(sizes))
    cuts = np.cumsum([0, *sizes])
    parts = [whole[cuts[i]:cuts[i + 1]] for i in range(40)]
    assert store.put_from_parts(["many"], [[p.ctypes.data for p in parts]], [sizes]) == [0]
    back = [np.zeros(n, np.uint8) for n in reversed(sizes)]  # other boundaries on the way back
    assert store.get_into_parts(["many"], [[b.ctypes.data for b in back]], [[b.nbytes for b in back]]) == [sum(sizes)]
    assert np.array_equal(np.concatenate(back), whole)
    assert Path(store.place("many")[1]).read_bytes() == whole.tobytes()


def test_a_second_write_of_a_key_keeps_the_first_and_counts_it_once(tmp_path):
    store = open_store(tmp_path)
    assert put(store, ["k"], [value(1)]) == [0]
    assert put(store, ["k"], [value(2)]) == [0]  # another writer of the same block: harmless
    assert np.array_equal(get(store, ["k"])[1][0], value(1))
    assert store.usage()[0] == allocated(RECORD) == disk_bytes(tmp_path)


def test_capacity_is_never_exceeded_and_the_least_recently_used_records_go_first(tmp_path):
    capacity = 64 * 1024  # 8 records of 8 KiB, one bucket
    store = open_store(tmp_path, capacity)
    assert len(store.directories[0].buckets) == 1
    keys = [f"k{i}" for i in range(8)]
    assert put(store, keys, [value(i) for i in range(8)]) == [0] * 8
    os.utime(store.place("k0")[1], ns=(1, 1))  # k1 is the oldest, then k0 ...
    os.utime(store.place("k1")[1], ns=(0, 0))
    get(store, ["k0"])  # ... but a read makes k0 the newest
    assert put(store, ["k8"], [value(8)]) == [0]
    present = store.exists(keys + ["k8"])
    assert present[1] == 0 and present[0] == 1 and present[8] == 1
    assert disk_bytes(tmp_path) <= capacity
    for i in range(9, 60):
        assert put(store, [f"k{i}"], [value(i)]) == [0]
        assert disk_bytes(tmp_path) <= capacity and store.usage()[0] == disk_bytes(tmp_path)


def test_a_record_larger_than_a_bucket_is_refused_not_written(tmp_path):
    store = open_store(tmp_path, capacity=16 * 1024)
    big = value(0, 20000)
    assert put(store, ["big"], [big]) == [NO_ROOM]
    assert not store.unreachable(NO_ROOM) and store.exists(["big"]) == [0] and disk_bytes(tmp_path) == 0


def test_bucket_count_is_fixed_by_the_first_process_and_shared(tmp_path):
    assert bucket_count(1 << 30, RECORD) == 256 and bucket_count(64 * 8192, RECORD) == 1
    assert bucket_count(256 * 8192, RECORD) == 4
    first = open_store(tmp_path, capacity=1 << 30)
    second = open_store(tmp_path, capacity=8 << 20)  # would pick fewer buckets alone
    assert len(first.directories[0].buckets) == len(second.directories[0].buckets) == 256
    assert json.loads((tmp_path / META_NAME).read_text()) == {"format": 1, "buckets": 256, "capacity": 1 << 30}
    assert first.place("x")[0].path == second.place("x")[0].path and first.place("x")[1] == second.place("x")[1]
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.path: 1\.00 MiB over the 256 buckets of .* raise capacity"):
        open_store(tmp_path, capacity=1 << 20)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / META_NAME).write_text("{not json")
    with pytest.raises(ConfigError, match="not a kvoffload fs directory description"):
        open_store(tmp_path / "other")


def test_paths_spread_blocks_over_every_directory(tmp_path):
    store = open_store(tmp_path, capacity=4 << 20, dirs=2)
    keys = [f"k{i}" for i in range(64)]
    assert put(store, keys, [value(i) for i in range(64)]) == [0] * 64
    counts = [len(list((tmp_path / f"d{i}").rglob("*.kv"))) for i in range(2)]
    assert sum(counts) == 64 and min(counts) >= 20
    status, out = get(store, keys)
    assert status == [RECORD] * 64 and all(np.array_equal(o, value(i)) for i, o in enumerate(out))


def test_a_wrong_sized_record_is_a_miss_and_is_deleted(tmp_path):
    store = open_store(tmp_path)
    put(store, ["torn", "long"], [value(1), value(2)])
    path = Path(store.place("torn")[1])
    path.write_bytes(path.read_bytes()[:100])  # a copy torn by something other than us
    Path(store.place("long")[1]).write_bytes(b"x" * (RECORD + 1))
    status, _ = get(store, ["torn", "long"])
    assert status == [100, RECORD + 1]  # the record checker reports both as "format"
    assert store.exists(["torn", "long"]) == [0, 0]
    assert store.usage()[0] >= disk_bytes(tmp_path) == 0  # uncounted at their sizes now: high, never low
    store.sweep_all()
    assert store.usage()[0] == 0


def test_a_read_only_directory_fails_writes_as_io_errors_and_still_serves_reads(switchable_dir):
    store = open_store(switchable_dir.path)
    put(store, ["a"], [value(1)])
    switchable_dir.read_only()
    status = put(store, ["b"], [value(2)])
    assert status[0] < 0 and store.unreachable(status[0])
    assert np.array_equal(get(store, ["a"])[1][0], value(1))
    switchable_dir.writable()
    assert put(store, ["b"], [value(2)]) == [0]


def test_a_vanished_directory_is_all_misses_and_write_errors(tmp_path):
    store = open_store(tmp_path / "cache")
    put(store, ["a"], [value(1)])
    shutil.rmtree(tmp_path / "cache")  # (a rename is followed: the tier holds the directories open)
    assert store.exists(["a"]) == [0] and get(store, ["a"])[0] == [MISSING]
    status = put(store, ["b"], [value(2)])
    assert status == [-errno.ENODEV] and store.unreachable(status[0])
    assert not (tmp_path / "cache").exists()  # never recreated: it may be an unmounted volume


def test_a_file_system_without_posix_locks_is_refused_at_start(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fd, op, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    monkeypatch.setattr(fcntl, "fcntl", no_locks)
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.path: .* does not support POSIX locks \(No locks available\); "
                                          r"mount it with locking"):
        open_store(tmp_path)


def test_a_low_open_file_limit_is_raised_or_named(tmp_path, monkeypatch):
    """Buckets are held open: a soft limit too low for them is raised towards the hard one; a
    hard limit too low is a one-line error naming `ulimit -n`."""
    import resource

    limits = {"soft": 300, "hard": 100_000}
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda _, v: limits.update(soft=v[0]))
    FsDirectory(tmp_path / "a", 64 << 20, RECORD, "tiers[1].path").close()  # 128 buckets
    assert limits["soft"] > 300 + 128
    limits.update(soft=300, hard=300)
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.path: the fs tier holds its 128 bucket directories open .* "
                                          r"raise `ulimit -n` to at least"):
        FsDirectory(tmp_path / "b", 64 << 20, RECORD, "tiers[1].path")
