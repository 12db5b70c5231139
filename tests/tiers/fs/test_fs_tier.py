"""The fs tier under real engines: several processes on one directory share prefixes within
its capacity, writers killed at random instants never cause a wrong token, a directory that
turns read-only or vanishes mid-run takes the tier out of service while the engine keeps
serving, and two models on one directory never read each other's records."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kvoffload.auth import RecordTagger
from kvoffload.tiers.fs.bucket import allocated
from kvoffload.tiers.fs.directory import FsDirectory
from kvoffload.tiers.fs.store import FsStore
from kvoffload.tiers.store.io import StoreIO
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.transfer.result import BlockTransferError
from tests.tiers.fs.fs_job import fs_offload, run_rounds

JOB = Path(__file__).with_name("fs_job.py")
ROOT = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def baseline():
    """Tokens of each workload seed without offload (model seed 0)."""
    return {seed: run_rounds(None, [seed])[0][0] for seed in range(4)}


def directory_bytes(root: Path) -> int:
    """Records and temporaries, as the tier counts them (tolerates files vanishing mid-scan)."""
    total = 0
    for bucket in root.glob("b*"):
        try:
            entries = list(os.scandir(bucket))
        except FileNotFoundError:
            continue
        for e in entries:
            if e.name.endswith((".kv", ".tmp")):
                with contextlib.suppress(FileNotFoundError):
                    total += allocated(e.stat().st_size)
    return total


def start(spec: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(JOB), json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)


def result(proc: subprocess.Popen, timeout: float = 240) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_four_processes_share_one_directory_within_its_capacity(tmp_path, baseline):
    """Round 1: four processes write their own workloads at once, about 220 records into room
    for 128, so evictions run while they share the directory. Round 2: process 0 alone serves a
    fresh workload. Round 3: the other three serve it too, and find it on the fs tier: blocks
    another process wrote."""
    capacity = 128 * allocated(8192 + 64)
    root = tmp_path / "shared"
    (tmp_path / "barrier").mkdir()
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], directory_bytes(root))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # No backpressure here: four engines on two cores run every store late, and a skipped
    # store would be a block the others cannot find (backpressure has tests of its own).
    # Found records are loaded whatever auto would judge of them: four engines on two cores time
    # every load slow, and auto may give a load up and recompute the rest (CI failed once so:
    # round 3 loaded nothing); auto's choices have tests of their own.
    kv = fs_offload(str(root), str(capacity), max_store_ms_per_mib=60_000, load_mode="async")
    seeds = [[0, 9, None]] + [[i, None, 9] for i in range(1, 4)]
    try:
        procs = [start({"kv_offload": kv, "seeds": seeds[i],
                        "barrier": {"dir": str(tmp_path / "barrier"), "rank": i, "procs": 4}}) for i in range(4)]
        results = [result(p) for p in procs]
    finally:
        stop.set()
        watcher.join()
    fresh = run_rounds(None, [9])[0][0]
    for i, r in enumerate(results):
        expected = [baseline[i], fresh, None] if i == 0 else [baseline[i], None, fresh]
        assert r["tokens"] == expected, f"process {i}: tokens differ from no offload"
        assert r["connector"]["tier_io_errors"] == {"fs": 0}
    for r in results[1:]:
        assert r["fs_hits"][2] >= 128, (f"found only {r['fs_hits'][2]} tokens of process 0's workload; decisions "
                                        f"{r['connector'].get('load_decisions')}, cancelled "
                                        f"{r['connector'].get('cancelled_load_blocks')}")
    assert sum(r["connector"]["demoted_blocks"] for r in results) > 128  # more than the directory holds
    assert 0.9 * capacity <= peak[0] <= capacity, f"directory peaked at {peak[0]} bytes, capacity {capacity}"
    store = FsStore([FsDirectory(root, capacity, 8192 + 64, "fs")])
    store.sweep_all()
    assert store.usage()[0] == directory_bytes(root) <= capacity


def test_writers_killed_at_random_instants_never_cause_a_wrong_token(tmp_path, baseline):
    root = tmp_path / "shared"
    capacity = 48 * allocated(8192 + 64)  # small: writers evict too, so kills land mid-eviction as well
    rng = random.Random(7)
    for k in range(3):
        seed = k % 4
        writer = start({"kv_offload": fs_offload(str(root), str(capacity)), "seeds": [(seed + i) % 4 for i in range(4)],
                        "forever": True})
        assert writer.stdout.readline().startswith("ROUND 0")
        time.sleep(rng.uniform(0.0, 2.0))  # a round takes 0.5-2 s: anywhere in the first few
        writer.kill()
        assert writer.wait() == -9
        tokens, hits, stats = run_rounds(fs_offload(str(root), str(capacity)), [seed, (seed + 1) % 4])
        assert tokens == [baseline[seed], baseline[(seed + 1) % 4]], f"kill {k}: a wrong token after a kill -9"
        assert stats["tier_io_errors"] == {"fs": 0}
    store = FsStore([FsDirectory(root, capacity, 8192 + 64, "fs")])
    store.sweep_all()
    assert list(root.rglob("*.tmp")) == [] and store.usage()[0] == directory_bytes(root) <= capacity


def test_a_directory_turning_read_only_then_vanishing_takes_the_tier_out_while_the_engine_serves(
        switchable_dir, baseline, caplog):
    from kvoffload.engine import LLM
    from kvoffload.workload import run_chat_workload
    from tests.tiers.fs.fs_job import engine_config, workload

    kv = fs_offload(str(switchable_dir.path), "4MiB", cpu="128KiB")
    with LLM(engine_config(kv)) as llm:
        assert run_chat_workload(llm, workload(0)) == baseline[0]
        switchable_dir.read_only()
        assert run_chat_workload(llm, workload(1)) == baseline[1]
        stats = llm.stats()["connector"]
        assert stats["tier_outages"]["fs"] >= 1 and stats["tier_io_errors"]["fs"] >= 3
        switchable_dir.writable()
        if switchable_dir.mounted:
            subprocess.run(["umount", "-l", str(switchable_dir.path)], check=True)  # the volume goes away
        else:
            shutil.rmtree(switchable_dir.path)
        assert run_chat_workload(llm, workload(2)) == baseline[2]
        assert run_chat_workload(llm, workload(0)) == baseline[0]
    assert "out of service" in caplog.text


def test_two_models_on_one_directory_never_read_each_others_records(tmp_path, baseline):
    kv = fs_offload(str(tmp_path / "shared"), "8MiB")
    tokens0, hits0, _ = run_rounds(kv, [0], model_seed=0)
    assert tokens0 == [baseline[0]]
    other = run_rounds(None, [0], model_seed=1)[0]
    tokens1, hits1, stats1 = run_rounds(kv, [0], model_seed=1)  # same prompts and layout, other weights
    assert tokens1 == other and hits1 == [0] and stats1["tier_rejected_blocks"] == {}
    again, hits_again, _ = run_rounds(kv, [0], model_seed=0)
    assert again == [baseline[0]] and hits_again[0] > 0


def test_a_record_copied_under_another_namespace_s_name_is_rejected_and_deleted(tmp_path):
    store = FsStore([FsDirectory(tmp_path, 1 << 20, 4096 + 64, "fs")])
    a, b = StoreKeys.of("model-a", 16, 4096, 1), StoreKeys.of("model-b", 16, 4096, 1)
    io_a = StoreIO(store, a, 0, 4096, 64 * 4160, RecordTagger())
    io_b = StoreIO(store, b, 0, 4096, 64 * 4160, RecordTagger())
    block = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    io_a.write([block.data], [0], [b"h" * 32])
    shutil.copy(store.place(a.key(b"h" * 32, 0))[1], store.place(b.key(b"h" * 32, 0))[1])
    out = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(BlockTransferError) as err:
        io_b.read([0], [b"h" * 32], [out.data])
    assert err.value.reasons == {"key": 1} and not err.value.io
    assert store.exists([b.key(b"h" * 32, 0), a.key(b"h" * 32, 0)]) == [0, 1]
    io_a.read([0], [b"h" * 32], [out.data])
    assert np.array_equal(out, block)


def test_the_tier_reports_the_whole_directory_s_fill_not_only_its_own_writes(tmp_path, baseline):
    from kvoffload.engine import LLM
    from tests.tiers.fs.fs_job import engine_config

    kv = fs_offload(str(tmp_path / "shared"), "4MiB")
    run_rounds(kv, [0])  # another process's writes, as far as the next engine knows
    records = len(list((tmp_path / "shared").rglob("*.kv")))
    assert records > 0
    with LLM(engine_config(kv)) as llm:  # has written nothing yet
        used, capacity = llm.stats()["connector"]["tier_usage"]["fs"]
    assert used == records and capacity == (4 << 20) // allocated(8192 + 64)
