"""The weights component of the namespace covers every byte: an in-place edit of one tensor
anywhere in a multi-file checkpoint (first, middle or last tensor, the header alone, the same
size, even with the old mtime put back) starts a new namespace, so a restart with a disk tier
never serves the old weights' KV; unchanged files are not hashed again."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kvoffload import weight_digests  # noqa: E402
from kvoffload.weight_digests import weights_fingerprint  # noqa: E402
from tests.tiers.disk.test_namespace import generate  # noqa: E402

#: The sampled fingerprint this replaced: 64 windows of 64 KiB spread over a file (whole when
#: smaller than 4 MiB). The edits below fall between its windows, where it saw nothing.
_OLD_SAMPLES, _OLD_WINDOW = 64, 64 * 1024


def _old_windows(size: int) -> list[tuple[int, int]]:
    if size <= _OLD_SAMPLES * _OLD_WINDOW:
        return [(0, size)]
    step = (size - _OLD_WINDOW) / (_OLD_SAMPLES - 1)
    return [(int(i * step), int(i * step) + _OLD_WINDOW) for i in range(_OLD_SAMPLES)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """Two safetensors shards, each larger than the old fingerprint read whole."""
    path = tmp_path_factory.mktemp("ckpt") / "m"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=1536, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=298, eos_token_id=299)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, max_shard_size="7MB")
    shards = sorted(path.glob("*.safetensors"))
    assert len(shards) == 2 and all(s.stat().st_size > _OLD_SAMPLES * _OLD_WINDOW for s in shards)
    return path


def _tensors(shard: Path) -> tuple[int, dict[str, dict]]:
    """(header bytes, tensor name -> {"data_offsets": [begin, end], ...}) of a safetensors file."""
    with open(shard, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def _span(shard: Path, begin: int, end: int) -> tuple[int, int]:
    """(offset, length) of up to 2 KiB in [begin, end), where no old window looked if there is
    such a place (a small last tensor lies inside the file's tail window)."""
    length = min(2048, end - begin)
    windows = _old_windows(shard.stat().st_size)
    for start in range(begin, end - length + 1, 1024):
        if all(start + length <= a or start >= b for a, b in windows):
            return start, length
    return begin, length


def _edit_tensor(shard: Path, which: str) -> None:
    """Negate up to 512 floats of the shard's first, middle or last tensor (by position in the file),
    in place; then put the old mtime back (ctime still moves)."""
    base, tensors = _tensors(shard)
    ordered = sorted(tensors.values(), key=lambda t: t["data_offsets"][0])
    t = {"first": ordered[0], "middle": ordered[len(ordered) // 2], "last": ordered[-1]}[which]
    at, length = _span(shard, base + t["data_offsets"][0], base + t["data_offsets"][1])
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.seek(at)
        raw = bytearray(f.read(length))
        for i in range(3, len(raw), 4):
            raw[i] ^= 0x80  # float32 sign bits
        f.seek(at)
        f.write(raw)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def _swap_in_header(shard: Path) -> None:
    """A header-only edit: two same-shaped tensors trade places (their data offsets), the data
    bytes and the file's size unchanged (the header is padded with spaces, as the format allows)."""
    with open(shard, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    names = [k for k in header if k != "__metadata__"]
    a, b = next((a, b) for a in names for b in names if a < b and header[a]["shape"] == header[b]["shape"]
                and header[a]["dtype"] == header[b]["dtype"])
    header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n
    with open(shard, "r+b") as f:
        f.seek(8)
        f.write(raw.ljust(n, b" "))


@pytest.mark.parametrize("edit", ["first", "middle", "last", "header"])
@pytest.mark.parametrize("shard_index", [0, 1])
def test_an_edit_anywhere_in_a_checkpoint_never_serves_old_kv(checkpoint, tmp_path, edit, shard_index, monkeypatch):
    import shutil

    monkeypatch.setenv("KVOFFLOAD_CACHE_DIR", str(tmp_path / "user-cache"))  # the digests' cache too
    model = tmp_path / "m"
    shutil.copytree(checkpoint, model)
    generate(model, tmp_path / "cache")
    _, warm = generate(model, tmp_path / "cache")
    assert warm["prefix_hit_tokens"]["disk"] > 0  # the unchanged model reuses its cache
    before = weights_fingerprint(model, None)
    shard = sorted(model.glob("*.safetensors"))[shard_index]
    if edit == "header":
        _swap_in_header(shard)
    else:
        _edit_tensor(shard, edit)
    assert weights_fingerprint(model, None) != before
    expected, _ = generate(model)
    tokens, stats = generate(model, tmp_path / "cache")
    assert tokens == expected
    assert stats["prefix_hit_tokens"]["disk"] == 0  # a new namespace: nothing of the old weights served


def _files_are_old(monkeypatch) -> None:
    """The clock reads 10 s on: files written just now are past the racy window, cacheable."""
    real = weight_digests.time.time_ns
    monkeypatch.setattr(weight_digests, "_now_ns", lambda: real() + 10 * 10**9)


def test_digests_are_cached_by_file_identity(tmp_path, monkeypatch):
    _files_are_old(monkeypatch)
    hashed: list[str] = []
    real = weight_digests.hash_file
    monkeypatch.setattr(weight_digests, "hash_file", lambda p: hashed.append(p.name) or real(p))
    model = tmp_path / "m"
    model.mkdir()
    (model / "a.safetensors").write_bytes(b"a" * 100_000)
    (model / "b.safetensors").write_bytes(b"b" * 100_000)
    (model / "notes.txt").write_text("not weights")
    cache = tmp_path / "digests"
    first = weights_fingerprint(model, cache)
    assert sorted(hashed) == ["a.safetensors", "b.safetensors"]
    assert weights_fingerprint(model, cache) == first and len(hashed) == 2  # unchanged: only stat'ed
    st = (model / "b.safetensors").stat()
    with open(model / "b.safetensors", "r+b") as f:  # same size, one byte, mtime put back
        f.seek(77_777)
        f.write(b"c")
    os.utime(model / "b.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    second = weights_fingerprint(model, cache)
    assert second != first and hashed[2:] == ["b.safetensors"]
    (model / "b.safetensors").rename(model / "c.safetensors")  # a renamed file is another file
    assert weights_fingerprint(model, cache) not in (first, second)
    # A cache entry planted for the file (another digest, the right identity) is only as good as
    # the cache directory, which is the user's own (0700): a corrupt one is recomputed.
    for entry in cache.iterdir():
        entry.write_text("{not json")
    assert weights_fingerprint(model, None) == weights_fingerprint(model, cache)
    assert weights_fingerprint(tmp_path / "missing", cache) == ""


def test_processes_starting_together_hash_a_file_once(tmp_path, monkeypatch):
    """vLLM's scheduler and workers fingerprint the same checkpoint at once: one hashes, the
    others wait for its cached result (threads here: flock excludes each open file)."""
    import threading
    import time

    _files_are_old(monkeypatch)
    hashed: list[str] = []
    real = weight_digests.hash_file

    def slow(p):
        hashed.append(p.name)
        time.sleep(0.2)
        return real(p)

    monkeypatch.setattr(weight_digests, "hash_file", slow)
    model = tmp_path / "m"
    model.mkdir()
    (model / "w.safetensors").write_bytes(os.urandom(200_000))
    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(weights_fingerprint(model, tmp_path / "digests")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hashed == ["w.safetensors"] and len(set(out)) == 1 and len(out) == 3


def test_a_file_changed_within_its_timestamp_tick_is_never_cached(tmp_path, monkeypatch):
    """On a file system with one-second timestamps, a same-size rewrite within the second after
    hashing keeps size, mtime, ctime and inode: a digest cached then would be served for the
    new bytes. Faked here: identities truncated to whole seconds, a clock we move."""
    real_of = weight_digests.FileIdentity.of
    changed = 1_700_000_000 * 10**9  # the tick every write below falls in

    def coarse(path):
        ident = real_of(path)
        return weight_digests.FileIdentity(ident.path, ident.size, changed, changed, ident.inode, ident.device)

    monkeypatch.setattr(weight_digests.FileIdentity, "of", staticmethod(coarse))
    model = tmp_path / "m"
    model.mkdir()
    w = model / "w.safetensors"
    w.write_bytes(b"a" * 50_000)
    clock = [changed + 400_000_000]  # 0.4 s into the file's tick
    monkeypatch.setattr(weight_digests, "_now_ns", lambda: clock[0])
    cache = tmp_path / "digests"
    first = weights_fingerprint(model, cache)
    with open(w, "r+b") as f:  # the same size, within the same second: the same coarse identity
        f.seek(123)
        f.write(b"b")
    second = weights_fingerprint(model, cache)
    assert second != first  # hashed again, not served from a cache entry of the old bytes
    assert not list(cache.glob("*.json"))  # nothing cached while the file is that young
    clock[0] = changed + 5 * 10**9  # later: the file is settled, its digest is cached
    assert weights_fingerprint(model, cache) == second and len(list(cache.glob("*.json"))) == 1
