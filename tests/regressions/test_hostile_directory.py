"""A co-tenant who can write a shared cache directory plants symlinks, FIFOs, hard links and
foreign files at every name the fs and disk tiers open: no byte (and no time stamp) outside the
directory changes, nothing blocks, and what the tiers serve is still only their own records."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvoffload.engine.config import EngineConfig
from kvoffload.engine.llm import LLM
from kvoffload.engine.sampling_params import SamplingParams
from kvoffload.errors import ConfigError
from kvoffload.tiers.disk.tier import DiskTierError
from kvoffload.tiers.fs import store as store_module
from kvoffload.tiers.fs.bucket import COUNTER_NAME
from kvoffload.tiers.fs.directory import META_NAME, FsDirectory
from kvoffload.tiers.fs.record_files import record_files
from kvoffload.tiers.fs.store import MISSING, FsStore
from kvoffload_ext.fs_records import fs_files

RECORD = 8192 - 64
PROMPTS = [[(i * 37 + j) % 250 + 1 for j in range(160)] for i in range(4)]


@pytest.fixture(params=["native", "python"])
def impl(request, monkeypatch) -> bool:
    if request.param == "native" and not fs_files.available():
        pytest.skip("no C compiler: the native record files cannot be built")
    wanted = request.param == "native"
    monkeypatch.setattr(store_module, "record_files", lambda native=None: record_files(wanted if native is None else native))
    return wanted


def canary_tree(root: Path) -> Path:
    """Files a planted link could point at: one of a record's exact size (so a size check passes)."""
    root.mkdir()
    rng = np.random.default_rng(7)
    (root / "record_sized.bin").write_bytes(rng.integers(0, 256, RECORD, dtype=np.uint8).tobytes())
    (root / "small.txt").write_bytes(b"do not touch\n" * 3)
    (root / "big.bin").write_bytes(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    for p in root.iterdir():
        os.utime(p, ns=(10**18, 10**18))
    return root


def snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every file's checksum, size and mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[p.name] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns)
    return out


def value(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, RECORD, dtype=np.uint8)


def put(store: FsStore, keys: list[str], values: list[np.ndarray]) -> list[int]:
    return store.put_from(keys, [v.ctypes.data for v in values], [v.nbytes for v in values])


def get(store: FsStore, keys: list[str]) -> tuple[list[int], list[np.ndarray]]:
    out = [np.zeros(RECORD, dtype=np.uint8) for _ in keys]
    return store.get_into(keys, [o.ctypes.data for o in out], [RECORD] * len(keys)), out


def plant(at: Path, kind: str, target: Path) -> None:
    if at.is_dir() and not at.is_symlink():
        at.rmdir()
    else:
        at.unlink(missing_ok=True)
    if kind == "symlink":
        at.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, at)
    elif kind == "fifo":
        os.mkfifo(at)
    elif kind == "directory":
        at.mkdir()
    else:  # a foreign regular file of a record's size
        at.write_bytes(b"\x5a" * RECORD)


KINDS = ["symlink", "hardlink", "fifo", "directory", "foreign"]


def test_planted_names_in_an_fs_directory_change_nothing_outside_it(tmp_path, impl, caplog):
    canary = canary_tree(tmp_path / "canary")
    before = snapshot(canary)
    shared = tmp_path / "shared"
    store = FsStore([FsDirectory(shared, 1 << 20, RECORD, "tiers[1].path")], io_threads=2)
    buckets = store.directories[0].buckets
    keys = [f"k{i}" for i in range(40)]
    # Planted before any write: every bucket's counter, and the names of half the records.
    for i, b in enumerate(buckets):
        plant(b.path / COUNTER_NAME, KINDS[i % len(KINDS)], canary / "record_sized.bin")
    for i, key in enumerate(keys[:20]):
        plant(Path(store.place(key)[1]), KINDS[i % len(KINDS)], canary / "record_sized.bin")
    # Old-style temporaries (the pid was guessable): now only names a sweep removes.
    plant(buckets[0].path / "abc.123.tmp", "symlink", canary / "small.txt")
    # A foreign regular file is indistinguishable from another engine's record here (the record's
    # key and checksum reject it a layer up); every other planted kind is never a record.
    foreign = [KINDS[i % len(KINDS)] == "foreign" for i in range(20)]
    with caplog.at_level(logging.WARNING):
        assert store.exists(keys[:20]) == [int(f) for f in foreign]
        status, _ = get(store, keys[:20])
        assert status == [RECORD if f else MISSING for f in foreign]  # nothing read through a link or FIFO
        store.touch(keys[:20])
        status = put(store, keys, [value(i) for i in range(40)])
    assert status.count(0) >= 36, status  # a planted directory may hold its name; nothing else fails
    written = [k for i, (k, s) in enumerate(zip(keys, status)) if s == 0 and not (i < 20 and foreign[i])]
    got, out = get(store, written)
    assert got == [RECORD] * len(written)
    assert all(np.array_equal(o, value(keys.index(k))) for k, o in zip(written, out))
    store.touch(written)
    store.remove(written[:5])
    store.sweep_all()
    assert any("removed and not followed" in r.message for r in caplog.records)
    store.close()
    assert snapshot(canary) == before


@pytest.mark.parametrize("name", [META_NAME, "b00"])
def test_a_planted_description_or_bucket_link_refuses_the_directory(tmp_path, name):
    canary = canary_tree(tmp_path / "canary")
    before = snapshot(canary)
    shared = tmp_path / "shared"
    shared.mkdir()
    target = canary if name == "b00" else canary / "small.txt"
    (shared / name).symlink_to(target)
    with pytest.raises(ConfigError, match=rf"tiers\[1\]\.path: .*{name}"):
        FsDirectory(shared, 1 << 20, RECORD, "tiers[1].path")
    assert snapshot(canary) == before and sorted(os.listdir(canary)) == sorted(before)


def _disk_config(tmp_path: Path, cache: Path) -> Path:
    cfg = {"tiers": [{"medium": "cpu", "capacity": "1MiB"},
                     {"medium": "disk", "capacity": "4MiB", "path": str(cache), "write_through": True}]}
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(cfg: Path) -> list[list[int]]:
    llm = LLM(EngineConfig(num_gpu_blocks=48, kv_offload=str(cfg)))
    try:
        return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=4))]
    finally:
        llm.close()


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "directory"])
def test_a_planted_disk_tier_file_is_refused_and_its_target_untouched(tmp_path, kind):
    canary = canary_tree(tmp_path / "canary")
    cache = tmp_path / "cache"
    cfg = _disk_config(tmp_path, cache)
    _run(cfg)
    (tier,) = cache.glob("*.kvdata")
    before = snapshot(canary)
    plant(tier, kind, canary / "big.bin")
    with pytest.raises((DiskTierError, ConfigError), match=r"disk tier .*kvdata (is|cannot)"):
        LLM(EngineConfig(num_gpu_blocks=48, kv_offload=str(cfg)))
    assert snapshot(canary) == before


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_a_planted_namespace_file_is_replaced_not_written_through(tmp_path, kind):
    canary = canary_tree(tmp_path / "canary")
    cache = tmp_path / "cache"
    cfg = _disk_config(tmp_path, cache)
    first = _run(cfg)
    (side,) = cache.glob("*.namespace.json")
    before = snapshot(canary)
    plant(side, kind, canary / "small.txt")
    assert _run(cfg) == first
    assert side.is_file() and not side.is_symlink() and side.stat().st_nlink == 1
    assert snapshot(canary) == before


def test_an_engine_on_a_planted_fs_directory_serves_identical_tokens(tmp_path, impl):
    """Every record of a first run replaced by a link to a record-sized foreign file (a read
    would pass the size check): the second run recomputes, and nothing outside changes."""
    canary = canary_tree(tmp_path / "canary")
    shared = tmp_path / "shared"
    cfg = tmp_path / "fs.yaml"
    cfg.write_text(yaml.safe_dump({"tiers": [{"medium": "cpu", "capacity": "64KiB"},
                                             {"medium": "fs", "capacity": "8MiB", "path": str(shared)}]}))
    first = _run(cfg)
    records = sorted(shared.rglob("*.kv"))
    assert records
    sized = canary / "sized.bin"
    sized.write_bytes(b"\x11" * records[0].stat().st_size)
    os.utime(sized, ns=(10**18, 10**18))
    before = snapshot(canary)
    for i, r in enumerate(records):
        plant(r, ["symlink", "hardlink"][i % 2], sized)
    for counter in shared.rglob(COUNTER_NAME):
        plant(counter, "symlink", canary / "small.txt")
    assert _run(cfg) == first
    assert snapshot(canary) == before


def test_a_directory_others_can_write_is_warned_once(tmp_path, caplog):
    from kvoffload import safe_files

    shared = tmp_path / "world-writable"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with caplog.at_level(logging.WARNING):
        FsDirectory(shared, 1 << 20, RECORD, "tiers[1].path").close()
        FsDirectory(shared, 1 << 20, RECORD, "tiers[1].path").close()
    lines = [r.getMessage() for r in caplog.records if "can be written by" in r.getMessage()]
    assert len(lines) == 1 and "mode 0o777" in lines[0] and "chmod o-w" in lines[0]
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert not safe_files.warn_if_shared_with_others(private, "x")
