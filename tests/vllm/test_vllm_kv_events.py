"""The KV events real vLLM publishes with kvoffload, decoded by a ZMQ subscriber with vLLM's own
msgspec schema (no decoder of ours): every tier block is announced with the integer hashes vLLM
announced for the same device blocks, their parent, tokens and block size, in a medium routers
place (CPU, DISK, SHARED); removals name hashes announced before. Both routes, TP=2 too."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kvoffload.testing.mooncake_master import MooncakeMaster, mooncake_binary
from tests.vllm.test_vllm_plugin import CPU, ktc, run_job, spec_route

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

ENGINE_BLOCK = 128  # vLLM's CPU backend
BLOCK_BYTES = 65536  # of the tiny Llama, per engine block


@contextmanager
def subscriber() -> Iterator[tuple[int, list[list[bytes]]]]:
    import zmq

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    frames: list[list[bytes]] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            if sub.poll(100):
                frames.append(sub.recv_multipart())

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        yield port, frames
    finally:
        stop.set()
        listener.join(timeout=5)
        sub.close(linger=0)
        ctx.term()


def published(spec: dict) -> list:
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch

    with subscriber() as (port, frames):
        rounds = run_job({**spec, "kv_events_config": {"enable_kv_cache_events": True, "publisher": "zmq",
                                                       "endpoint": f"tcp://*:{port}", "topic": ""}})
    assert all(c >= 256 for c in rounds[1]["cached"]), rounds  # the tiers served round 2
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    return [e for f in frames for e in decoder.decode(f[-1]).events]


def check_contract(events: list, factor: int, localities: dict[str, str | None]) -> dict[str, int]:
    """Every tier event against vLLM's own device events of the same run; returns blocks
    announced per medium."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    device: dict[int, tuple[int | None, list[int]]] = {}  # hash -> (parent, tokens), from vLLM's GPU events
    announced: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for e in events:
        if isinstance(e, BlockStored) and e.medium == "GPU":
            parent = e.parent_block_hash
            for i, h in enumerate(e.block_hashes):
                device[h] = (parent, e.token_ids[i * e.block_size : (i + 1) * e.block_size])
                parent = h
            continue
        if isinstance(e, BlockStored):
            assert e.medium in localities, e
            assert len(e.block_hashes) == factor and all(isinstance(h, int) for h in e.block_hashes), e
            assert all(h in device for h in e.block_hashes), "a tier block hash vLLM never announced"
            assert e.parent_block_hash == device[e.block_hashes[0]][0]
            for prev, h in zip(e.block_hashes, e.block_hashes[1:]):
                assert device[h][0] == prev
            assert e.token_ids == [t for h in e.block_hashes for t in device[h][1]]
            assert (e.block_size, e.lora_id, e.lora_name, e.group_idx) == (ENGINE_BLOCK, None, None, 0)
            assert e.locality == localities[e.medium] and e.ownership is None
            announced.setdefault(e.medium, set()).update(e.block_hashes)
            counts[e.medium] = counts.get(e.medium, 0) + 1
        elif isinstance(e, BlockRemoved) and e.medium != "GPU":
            assert set(e.block_hashes) <= announced.get(e.medium, set()), e
            assert e.locality == localities[e.medium]
            announced[e.medium] -= set(e.block_hashes)
    return counts


def test_host_and_disk_tiers_announce_demotions_with_vllms_hashes(model, tmp_path):
    """Offloaded blocks of two engine blocks; a host tier of two such blocks demotes to disk."""
    tiers = [{"medium": "cpu", "capacity": 4 * BLOCK_BYTES},
             {"medium": "disk", "path": str(tmp_path), "capacity": "64MiB"}]
    cfg = ktc(tiers)
    cfg["kv_connector_extra_config"]["config"]["offloaded_block_size"] = 256
    events = published({"model": model, "kv_transfer_config": cfg})
    counts = check_contract(events, 2, {"CPU": "LOCAL", "DISK": "LOCAL"})
    assert counts["CPU"] >= 3 and counts["DISK"] >= 1, counts


def test_a_shared_directory_is_announced_as_shared(model, tmp_path):
    tiers = [*CPU, {"medium": "fs", "path": str(tmp_path), "capacity": "64MiB"}]
    counts = check_contract(published({"model": model, "kv_transfer_config": ktc(tiers)}), 1,
                            {"CPU": "LOCAL", "SHARED": None})
    assert counts == {"CPU": 6, "SHARED": 6}  # 3 prompts x 2 full blocks, each announced once per medium


@pytest.mark.skipif(mooncake_binary("mooncake_master") is None, reason="mooncake_master not found")
def test_mooncake_under_tensor_parallelism(model, tmp_path):
    pytest.importorskip("mooncake.store", exc_type=ImportError)
    with MooncakeMaster(str(tmp_path)) as master:
        master.segment_holder("256MB")
        tiers = [*CPU, master.tier(segment=0, local_buffer="32MiB")]
        events = published({"model": model, "kv_transfer_config": ktc(tiers), "tp": 2})
    counts = check_contract(events, 1, {"CPU": "LOCAL", "SHARED": None})
    assert counts == {"CPU": 6, "SHARED": 6}  # the scheduler speaks for both ranks: once each


def test_vllms_own_connector_describes_kvoffload_tiers(model):
    """The spec route: vLLM's OffloadingConnector with self-describing events over kvoffload's
    manager, whose host tier is vLLM's CPU medium, local."""
    cfg = spec_route(CPU, self_describing_kv_events=True)
    counts = check_contract(published({"model": model, "kv_transfer_config": cfg}), 1, {"CPU": "LOCAL"})
    assert counts == {"CPU": 6}
