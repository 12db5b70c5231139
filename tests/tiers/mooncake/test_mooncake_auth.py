"""Forged values on a real mooncake_master: a bare store client with no model and no secret
re-stores other blocks' bytes under a replica's keys with freshly computed headers. With a
shared secret the replicas reject every one (counted as auth rejections) and serve the right
tokens; without one the forgery is served (the risk the start-up warning names)."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kvoffload.engine import LLM
from kvoffload.metrics import StatsCollector
from kvoffload.tiers.store.record import HEADER_BYTES, make_header
from kvoffload.workload import run_chat_workload
from tests.tiers.mooncake.conftest import needs_mooncake
from tests.tiers.mooncake.replica_job import WORKLOAD, engine_config
from tests.tiers.mooncake.test_mooncake_tier import _raw_client, offload, remote_tier, run

pytestmark = needs_mooncake
SECRET = "0123456789abcdef0123456789abcdef"


def forge(master, keys, hashes) -> int:
    """Each key gets the next block's payload under a valid unauthenticated header."""
    raw = _raw_client(master)
    size = raw.client.get_size(keys.key(hashes[0], 0))
    values = np.zeros((len(hashes), size), dtype=np.uint8)
    raw.register(values.ctypes.data, values.nbytes)
    try:
        names = [keys.key(h, 0) for h in hashes]
        assert raw.get_into(names, [values[i].ctypes.data for i in range(len(names))], [size] * len(names)) == [size] * len(names)
        forged = np.zeros_like(values)
        for i, name in enumerate(names):
            payload = values[(i + 1) % len(names), HEADER_BYTES:]
            forged[i, :HEADER_BYTES] = np.frombuffer(make_header(name, payload.data), dtype=np.uint8)
            forged[i, HEADER_BYTES:] = payload
            assert raw.client.remove(name, True) == 0
        raw.register(forged.ctypes.data, forged.nbytes)
        assert raw.put_from(names, [forged[i].ctypes.data for i in range(len(names))], [size] * len(names)) == [0] * len(names)
        raw.unregister(forged.ctypes.data)
    finally:
        raw.unregister(values.ctypes.data)
        raw.close()
    return len(names)


@pytest.mark.parametrize("secret", [True, False], ids=["with-secret", "no-secret"])
def test_forged_values_are_rejected_only_with_a_secret(master, monkeypatch, secret):
    baseline = run(None)[0]
    kv = offload(master)
    if secret:
        monkeypatch.setenv("KVOFFLOAD_TEST_SECRET", SECRET)
        kv["auth"] = {"secret_env": "KVOFFLOAD_TEST_SECRET"}
    with LLM(engine_config(kv)) as writer:
        assert run_chat_workload(writer, WORKLOAD) == baseline
        tier = remote_tier(writer)
        hashes, keys = list(tier._ready), tier.lookups.keys
    assert len(hashes) >= 8
    assert forge(master, keys, hashes) == len(hashes)
    with LLM(engine_config(kv)) as replica:
        tokens = run_chat_workload(replica, WORKLOAD)
        stats = replica.stats()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatsCollector(replica.stats))
        rejected = registry.get_sample_value("kvoffload_tier_rejected_blocks_total",
                                             {"tier": "mooncake", "reason": "auth"})
    if secret:
        assert tokens == baseline
        assert rejected and rejected > 0
        assert stats["connector"]["tier_rejected_blocks"]["mooncake"] == {"auth": rejected}
    else:  # the attack works on an unauthenticated store: what the README and the warning say
        assert tokens != baseline
        assert not stats["connector"]["tier_rejected_blocks"]


def test_replicas_with_different_secrets_use_disjoint_keys(master, monkeypatch):
    """A secret rotation under way: each secret's replicas miss the other's blocks, neither
    rejects nor deletes them."""
    kv_a, kv_b = offload(master), offload(master)
    monkeypatch.setenv("KVOFFLOAD_SECRET_A", SECRET)
    monkeypatch.setenv("KVOFFLOAD_SECRET_B", SECRET[::-1])
    kv_a["auth"], kv_b["auth"] = {"secret_env": "KVOFFLOAD_SECRET_A"}, {"secret_env": "KVOFFLOAD_SECRET_B"}
    run(kv_a)
    _, stats_b = run(kv_b)
    assert stats_b["prefix_hit_tokens"].get("mooncake", 0) == 0 and not stats_b["connector"]["tier_rejected_blocks"]
    _, stats_a = run(kv_a)
    assert stats_a["prefix_hit_tokens"]["mooncake"] > 0  # A's blocks survived B's replica
