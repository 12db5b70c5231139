"""A tier's eviction policy is resolved once, by config, into a typed reference the tier
instantiates; whether it needs the trace's future is the policy contract's declared attribute."""

import pytest

from kvoffload.config import ConfigError, OffloadConfig
from kvoffload.offload.lru import LRUCachePolicy
from kvoffload.offload.policy import CachePolicy, OfflinePolicy
from kvoffload.offload.spec import EngineKVInfo, OffloadingSpecFactory
from kvoffload.registry import POLICIES, PolicyRef


class CountingLRU(LRUCachePolicy):
    made = 0

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        type(self).made += 1


class FutureNeedingLRU(LRUCachePolicy):
    needs_future = True  # declared by a plugin that is not an OfflinePolicy


def test_the_registry_is_asked_once_per_tier_and_the_tier_uses_the_resolved_class(monkeypatch, tmp_path):
    loads = []
    real_load = POLICIES.load
    monkeypatch.setattr(POLICIES, "load", lambda name: loads.append(name) or real_load(name))
    name = f"{__name__}:CountingLRU"
    cfg = OffloadConfig.from_dict({"tiers": [
        {"medium": "cpu", "capacity": 8 * 100, "eviction_policy": name},
        # 8 blocks of 100 bytes and the disk records' headers (64 bytes each, 4096 for the file)
        {"medium": "disk", "capacity": 4096 + 8 * (100 + 64), "path": str(tmp_path), "eviction_policy": "arc"}]})
    assert cfg.tiers[0].policy == PolicyRef(name, CountingLRU)
    assert cfg.tiers[0].cache_policy is cfg.tiers[0].policy
    made_at_config = CountingLRU.made  # config checks the class can be made
    manager = OffloadingSpecFactory.create_spec(cfg, EngineKVInfo(block_size=4, block_bytes=100,
                                                                  num_device_blocks=8)).get_manager()
    try:
        assert loads == [name, "arc"]  # config's lookups only: the tiers asked nothing more
        assert CountingLRU.made == made_at_config + 1
        assert isinstance(manager.primary.index.policy, CountingLRU)
    finally:
        manager.close()


@pytest.mark.parametrize("cls", ["FutureNeedingLRU", "OfflineOne"])
def test_a_policy_that_needs_the_future_is_refused_for_an_engine(cls):
    with pytest.raises(ConfigError, match=rf"tiers\[0\]\.eviction_policy: '.*:{cls}' needs the future of the trace"):
        OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB", "eviction_policy": f"{__name__}:{cls}"}]})


def test_the_contract_declares_needs_future():
    assert CachePolicy.needs_future is False and LRUCachePolicy.needs_future is False
    assert OfflinePolicy.needs_future is True and issubclass(OfflinePolicy, CachePolicy)


class OfflineOne(OfflinePolicy, LRUCachePolicy):
    def set_future(self, future):
        pass

    def advance(self, request_index):
        pass
