"""Start-up failures, restart cost, event queues and config fuzzing: one-line errors, no leaks."""

import errno
import os
import random

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.cli import main
from kvoffload.config import ConfigError, OffloadConfig
from kvoffload.engine import LLM, EngineConfig
from kvoffload.offload.cpu_tier import MAX_QUEUED_EVENTS, CPUOffloadingManager
from kvoffload.tiers.disk import format as disk_format
from kvoffload.tiers.disk.format import DiskLayout, data_checksum, record_header
from kvoffload.tiers.disk.tier import DiskTier, DiskTierError


def _disk_cfg(path, capacity="8MiB"):
    return {"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {"medium": "disk", "path": str(path), "capacity": capacity}]}


def test_disk_full_at_startup_is_one_line_and_a_retry_in_process_works(tmp_path, monkeypatch):
    real = os.ftruncate

    def full(fd, length):
        if length > 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, length)

    monkeypatch.setattr(os, "ftruncate", full)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(DiskTierError, match="No space left on device.*lower the tier's capacity") as info:
        LLM(EngineConfig(kv_offload=_disk_cfg(tmp_path)))
    assert "\n" not in str(info.value) and info.value.__cause__ is None
    assert len(os.listdir("/proc/self/fd")) == fds  # the locked fd was released
    monkeypatch.setattr(os, "ftruncate", real)
    with LLM(EngineConfig(kv_offload=_disk_cfg(tmp_path))) as llm:  # not "in use by another process"
        assert llm.generate([[1, 2, 3]])[0].token_ids


def test_unopenable_tier_file_and_a_second_owner_are_one_line_errors(tmp_path, monkeypatch, capsys):
    with LLM(EngineConfig(kv_offload=_disk_cfg(tmp_path))):
        cfg = tmp_path / "t.yaml"
        cfg.write_text(yaml.safe_dump(_disk_cfg(tmp_path)))
        assert main(["run", "--model", "tiny", "--config", str(cfg)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by process {os.getpid()} (" in err[0]
    real_open = os.open

    def denied(path, flags, mode=0o777, **kw):
        if str(path).endswith(".kvdata"):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(DiskTierError, match="cannot open \\(Operation not permitted\\)"):
        LLM(EngineConfig(kv_offload=_disk_cfg(tmp_path)))


def test_reopening_a_large_sparse_tier_reads_only_the_records_present(tmp_path, monkeypatch):
    block = 64 * 1024
    layout = DiskLayout("big", block, 16, (64 << 30) // (block + 64))  # a 64 GiB tier
    mgr = DiskTier(tmp_path, layout)
    data = memoryview(bytes(block))
    slots = sorted(random.Random(0).sample(range(layout.num_slots), 1000))
    for key, slot in enumerate(slots):
        os.pwritev(mgr._fds[0], [record_header(key, data_checksum(data)), data], layout.offset(slot))
    mgr.close()
    reads = []
    real = os.pread
    monkeypatch.setattr(disk_format.os, "pread", lambda fd, n, off: reads.append(off) or real(fd, n, off))
    again = DiskTier(tmp_path, layout)
    assert again.num_recovered == 1000
    assert len(reads) <= 4 * 1000  # a few reads per record (filesystem extents), never one per slot
    again.close()


def test_undrained_events_are_bounded():
    mgr = CPUOffloadingManager(4, enable_events=True)
    for i in range(MAX_QUEUED_EVENTS + 50):
        mgr.prepare_store([i])
        mgr.complete_store([i])
    events = mgr.take_events()
    assert len(events) == MAX_QUEUED_EVENTS and mgr.num_events_dropped > 0
    assert events[-1].block_hashes == [MAX_QUEUED_EVENTS + 49]


@pytest.mark.parametrize("raw, key", [
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], 1: 2, "zz": 3}, "1: unknown key"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB", "eviction_policy": ".foo:Bar"}]}, "relative module"),
    ({"tiers": [{"medium": "cpu", "capacity": "9" * 400}]}, "tiers[0].capacity"),
    ({"tiers": [{"medium": "cpu", "capacity": 10**400}]}, "too large"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {"medium": "disk", "capacity": "1GiB", "path": 123}]}, "tiers[1].path"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {"medium": "disk", "capacity": "1GiB", "path": "/tmp/a\0b"}]}, "tiers[1].path"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB", "eviction_policy": "kvoffload.offload.policy:CachePolicy"}]}, "abstract"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB", "eviction_policy": "belady"}]}, "needs the future"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "spec_name": "OffloadingSpec",
      "spec_module_path": "kvoffload.offload.spec"}, "abstract"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "hints": {"tool_call_token_ids": "151657"}},
     "hints.tool_call_token_ids: '151657' must be a list of token ids"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "hints": {"tool_call_token_ids": [1, -2]}},
     "hints.tool_call_token_ids: [1, -2]"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "hints": {"tool_return_s": 0}}, "hints.tool_return_s: 0"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "hints": {"clock_speed": True}}, "hints.clock_speed: True"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "hints": {"speed": 2}}, "hints.speed: unknown key"),
    ({"tiers": [{"medium": "cpu", "capacity": "1MiB"}], "hints": [1]}, "hints: [1] must be a mapping"),
])
def test_bad_configs_are_config_errors_naming_the_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace("[", "\\[").replace("]", "\\]")):
        OffloadConfig.from_dict(raw)


def test_bad_files_are_config_errors(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 5000 + "]" * 5000)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    for path in (deep, binary, tmp_path / ("x" * 5000)):
        with pytest.raises(ConfigError):
            OffloadConfig.from_yaml(path)


def test_config_check_catches_what_start_up_would(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_disk_cfg(tmp_path / "missing" / "deeper")))
    assert main(["config", "check", str(cfg)]) == 2
    assert "does not exist and neither does its parent" in capsys.readouterr().err
    cfg.write_text(yaml.safe_dump(_disk_cfg(tmp_path, capacity="1000TiB")))
    assert main(["config", "check", str(cfg)]) == 0  # as the engine: it starts, and warns the same
    err = capsys.readouterr().err
    assert "warning: tiers[1].capacity: capacity 1000.00 TiB exceeds the" in err and "free on its file system" in err
    cfg.write_text(yaml.safe_dump({"tiers": [{"medium": "cpu", "capacity": "1000TiB"}]}))
    assert main(["config", "check", str(cfg)]) == 0
    assert "more than this machine's memory" in capsys.readouterr().err


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                  st.text(max_size=12), st.sampled_from(["cpu", "disk", "mooncake", "8GiB", "lru", "arc", "/tmp", "x:Y", ".a:B",
                                                   "127.0.0.1:1", "http://h:1/metadata", "tcp", "rdma", "0"]))
_keys = st.one_of(st.sampled_from(["tiers", "medium", "capacity", "path", "eviction_policy", "write_through",
                                   "store_threshold", "transfer", "metrics", "backend", "spec_name", "master",
                                   "metadata_server", "protocol", "segment", "local_buffer", "local_hostname",
                                   "retry_after_s", "device_name"]),
                  st.integers(), st.text(max_size=5))
_values = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_keys, kids, max_size=4),
                       max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.dictionaries(_keys, _values, max_size=5), tier=st.dictionaries(_keys, _values, max_size=6))
def test_fuzzed_configs_raise_only_config_errors(raw, tier):
    for candidate in (raw, {**raw, "tiers": [tier]}, {"tiers": [{"medium": "cpu", "capacity": "1MiB"}, tier]}):
        try:
            OffloadConfig.from_dict(candidate)
        except ConfigError as exc:
            assert "\n" not in str(exc)


class BrokenPolicy:  # named by module:Class below; its constructor fails like a buggy plugin's
    pass


def test_a_policy_whose_constructor_fails_is_refused_by_name(monkeypatch):
    from kvoffload.offload.lru import LRUCachePolicy

    class Exploding(LRUCachePolicy):
        def __init__(self, capacity):
            raise RuntimeError("needs a GPU")

    import sys
    monkeypatch.setattr(sys.modules[__name__], "BrokenPolicy", Exploding)
    with pytest.raises(ConfigError, match=r"tiers\[0\].eviction_policy: .* cannot be created \(RuntimeError: needs a GPU\)"):
        OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB",
                                            "eviction_policy": f"{__name__}:BrokenPolicy"}]})


def test_log_level_from_the_environment_and_the_cli(monkeypatch, capsys):
    import logging

    from kvoffload.logs import apply_env_level

    logger = logging.getLogger("kvoffload")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setenv("KVOFFLOAD_LOG_LEVEL", "error")
    apply_env_level()
    assert logger.level == logging.ERROR
    monkeypatch.setenv("KVOFFLOAD_LOG_LEVEL", "loud")
    apply_env_level()
    assert logger.level == logging.ERROR  # a bad value keeps the level
    with pytest.raises(SystemExit):
        main(["--log-level", "loud", "config", "check", "x.yaml"])
    assert "invalid choice: 'loud'" in capsys.readouterr().err


def test_debug_lines_asked_for_in_the_environment_reach_stderr_where_nobody_configured_logging():
    """In ``vllm serve`` nobody configures kvoffload's loggers: KVOFFLOAD_LOG_LEVEL=debug must
    still print (Python's last resort prints warnings only), once per line."""
    import subprocess
    import sys

    code = ("import logging, kvoffload; logging.getLogger('kvoffload.x').debug('the debug line'); "
            "logging.getLogger('kvoffload.x').warning('the warning')")
    for level, want in (("debug", ["the debug line", "the warning"]), ("warning", ["the warning"]), ("", ["the warning"])):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "KVOFFLOAD_LOG_LEVEL": level}, check=True)
        assert [w for w in ("the debug line", "the warning") if out.stderr.count(w) == 1] == want, out.stderr
        assert ("the debug line" in out.stderr) == (level == "debug")


def test_a_cpu_tier_beyond_this_machine_is_a_config_error_at_start():
    with pytest.raises(ConfigError, match="tiers"):
        LLM(EngineConfig(kv_offload={"tiers": [{"medium": "cpu", "capacity": "64TiB"}]}))


def test_version_and_module_entry_point():
    import subprocess
    import sys

    import kvoffload

    out = subprocess.run([sys.executable, "-m", "kvoffload", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"kvoffload {kvoffload.__version__}"


_MOONCAKE_KEYS = st.sampled_from(["master", "metadata_server", "protocol", "segment", "local_buffer", "local_hostname",
                                  "retry_after_s", "device_name", "capacity", "write_through", "path"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=st.dictionaries(_MOONCAKE_KEYS, _values, max_size=8))
def test_fuzzed_mooncake_tiers_raise_only_config_errors(options):
    base = {"medium": "mooncake", "master": "127.0.0.1:50051", "metadata_server": "http://127.0.0.1:8080/metadata"}
    try:
        OffloadConfig.from_dict({"tiers": [{"medium": "cpu", "capacity": "1MiB"}, {**base, **options}]})
    except ConfigError as exc:
        assert "\n" not in str(exc) and "tiers[1]" in str(exc)


def test_config_check_describes_the_hints_section_when_set():
    from kvoffload.config import describe

    tiers = [{"medium": "cpu", "capacity": "1MiB", "eviction_policy": "hinted"}]
    plain = describe(OffloadConfig.from_dict({"tiers": tiers}))
    assert "hints:" not in plain
    text = describe(OffloadConfig.from_dict({"tiers": tiers, "hints": {"tool_call_token_ids": [151657],
                                                                        "tool_return_s": 7, "clock_speed": 20}}))
    assert "hints: an output holding token 151657 ended in a tool call, back within 7 s; hint clock 20x wall time" \
        in text and "policy hinted" in text


def test_start_up_builds_the_host_copy_loop_before_the_first_store(tmp_path):
    # On a fresh machine the copy loop was compiled by the first store (0.8 s inside a step): a
    # tiny CPU tier filled with blocks still in flight and dropped the stores after them, so a
    # second vLLM process found nothing on disk. A new process (its own library cache) now has
    # the library built once the engine is up, before any request.
    import subprocess
    import sys

    code = ("from kvoffload.engine import LLM, EngineConfig\n"
            "llm = LLM(EngineConfig(kv_offload={'tiers': [{'medium': 'cpu', 'capacity': '1MiB'}]}))\n"
            "import kvoffload_ext.build as b; print(sorted(b._libs))\n")
    env = {**os.environ, "KVOFFLOAD_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "['kvo_copy']"
    assert [p.name.split("_")[:2] for p in tmp_path.glob("*.so")] == [["kvo", "copy"]]


@pytest.mark.parametrize("flags, words", [
    (["--num-gpu-blocks", "2000000"], "the device KV cache of 2000000 blocks x 16 tokens needs"),
    (["--block-size", "100000"], "block_size=100000: a block holds more tokens than the longest request"),
])
def test_a_device_cache_past_the_machine_is_one_line_before_it_is_allocated(flags, words, capsys, monkeypatch):
    """Round 7: `run --num-gpu-blocks 2000000` asked for 32.8 GB at start (the kernel's OOM killer
    took the process at 18.8 GB); `--block-size 100000` for 6.5 GB. Refused before any tensor,
    whatever this machine has free (told here as 1 GiB)."""
    from kvoffload.engine import device_memory

    monkeypatch.setattr(device_memory, "available_bytes", lambda device: 1 << 30)
    allocated: list[int] = []
    import torch

    real_zeros = torch.zeros

    def zeros(*shape, **kw):  # type: ignore[no-untyped-def]
        t = real_zeros(*shape, **kw)
        allocated.append(t.numel())
        return t

    monkeypatch.setattr(torch, "zeros", zeros)
    assert main(["run", "--model", "tiny", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err
    assert not [n for n in allocated if n > 1 << 24]  # no device cache tensor was made
