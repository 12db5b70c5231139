"""The mooncake tier's keys are validated like every other key (no master or package needed)."""

from __future__ import annotations

import sys

import pytest

from kvoffload.config import ConfigError, OffloadConfig
from kvoffload.tiers.mooncake.options import parse_options
from kvoffload.tiers.mooncake.store import MooncakeStore

GOOD = {"name": "shared", "medium": "mooncake", "master": "127.0.0.1:50051",
        "metadata_server": "http://127.0.0.1:8080/metadata"}


def _config(*tiers):
    return OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"}, *tiers]})


def test_defaults_and_sizes():
    tier = _config({**GOOD, "segment": "2GiB", "local_buffer": "64MiB"}).tiers[1]
    assert tier.write_through and tier.capacity_bytes == 2 << 30
    assert tier.options.segment == 2 << 30 and tier.options.local_buffer == 64 << 20 and tier.options.protocol == "tcp"
    assert _config({**GOOD, "segment": 0}).tiers[1].options.segment == 0
    assert _config({**GOOD, "write_through": False, "capacity": "1GiB"}).tiers[1].capacity_bytes == 1 << 30


@pytest.mark.parametrize("change, match", [
    ({"master": None}, r"tiers\[1\]\.master: required"),
    ({"master": "localhost"}, r"tiers\[1\]\.master: 'localhost' is not host:port"),
    ({"master": "h:99999"}, r"tiers\[1\]\.master: 'h:99999'"),
    ({"master": ["x"]}, r"tiers\[1\]\.master: "),
    ({"metadata_server": None}, r"tiers\[1\]\.metadata_server: required"),
    ({"metadata_server": "ftp://x"}, r"tiers\[1\]\.metadata_server: 'ftp://x'; use http://"),
    ({"protocol": "udp"}, r"tiers\[1\]\.protocol: 'udp'; use tcp or rdma"),
    ({"segment": "lots"}, r"tiers\[1\]\.segment: cannot parse size 'lots'"),
    ({"segment": False}, r"tiers\[1\]\.segment: False is not a size"),
    ({"local_buffer": -1}, r"tiers\[1\]\.local_buffer: size must be positive"),
    ({"device_name": 5}, r"tiers\[1\]\.device_name: '5'"),
    ({"local_hostname": "a b"}, r"tiers\[1\]\.local_hostname: 'a b'"),
    ({"retry_after_s": 0}, r"tiers\[1\]\.retry_after_s: 0"),
    ({"bucket": "x"}, r"tiers\[1\]\.bucket: unknown key; allowed keys here: .*master"),
    ({"path": None, "master_addr": 1}, r"tiers\[1\]\.master_addr: unknown key"),
])
def test_bad_values_are_one_line_errors_naming_the_key(change, match):
    tier = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=match) as err:
        _config(tier)
    assert "\n" not in str(err.value)


def test_mooncake_is_the_last_tier_and_disk_keys_stay_disk_only(tmp_path):
    with pytest.raises(ConfigError, match=r"tiers\[2\]: a tier after the mooncake tier; mooncake must be the last"):
        _config(GOOD, {"medium": "disk", "path": str(tmp_path), "capacity": "1MiB"})
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.master: unknown key"):
        _config({"medium": "disk", "path": str(tmp_path), "capacity": "1MiB", "master": "h:1"})
    cfg = _config({"medium": "disk", "path": str(tmp_path), "capacity": "1MiB"}, GOOD)
    assert [t.medium for t in cfg.tiers] == ["cpu", "disk", "mooncake"]


def test_a_missing_mooncake_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(ConfigError, match=r"medium mooncake: the Mooncake client is not importable .*"
                                          r"pip install 'kvoffload\[mooncake\]'.*libibverbs1"):
        MooncakeStore.connect(parse_options(GOOD, "tiers[1]"), "tiers[1]", lend_segment=False)
