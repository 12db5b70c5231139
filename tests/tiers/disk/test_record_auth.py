"""Disk records with a shared secret: a record planted by someone without it (a valid header
and checksum over another block's bytes, under this block's key) is rejected as "auth" and
recomputed; without a secret the same plant is served (the negative control)."""

import os

import pytest

from kvoffload.auth import AuthConfig, RecordTagger, parse_auth
from kvoffload.engine import LLM, EngineConfig, SamplingParams
from kvoffload.errors import ConfigError
from kvoffload.tiers.disk.format import HEADER_BYTES, RECORD_HEADER, data_checksum, parse_record_header, record_header

PROMPTS = [[(i * 29 + j * 7) % 250 + 1 for j in range(96)] for i in range(3)]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
SECRET = "s3cret-s3cret-s3cret-s3cret-0001"
BLOCK_BYTES = 8192  # the tiny model at block size 16


def kv(path, secret_env=None):
    # never-recompute: every hit reads its records (auto would time the disk with one load at a
    # time and recompute the hits arriving meanwhile)
    cfg = {"tiers": [{"medium": "cpu", "capacity": "4MiB"},
                     {"medium": "disk", "path": str(path), "capacity": "16MiB", "write_through": True}],
           "load_mode": "never-recompute"}
    if secret_env:
        cfg["auth"] = {"secret_env": secret_env}
    return cfg


def run(path, secret_env=None):
    with LLM(EngineConfig(num_gpu_blocks=64, kv_offload=kv(path, secret_env))) as llm:
        tokens = [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]
        return tokens, llm.stats()


def plant(path):
    """Give every record the next record's payload under a fresh header: what anyone who can
    write the file can compute without the secret."""
    (f,) = [p for p in os.listdir(path) if p.endswith(".kvdata")]
    file = os.path.join(path, f)
    record_bytes = RECORD_HEADER + BLOCK_BYTES
    with open(file, "rb") as fh:
        data = bytearray(fh.read())
    records = []
    for off in range(HEADER_BYTES, len(data) - record_bytes + 1, record_bytes):
        parsed = parse_record_header(bytes(data[off : off + RECORD_HEADER]))
        if parsed is not None:
            records.append((off, parsed[0]))
    assert len(records) >= 6
    payloads = [bytes(data[o + RECORD_HEADER : o + record_bytes]) for o, _ in records]
    for i, (o, key) in enumerate(records):
        payload = payloads[(i + 1) % len(records)]
        data[o : o + RECORD_HEADER] = record_header(key, data_checksum(payload))
        data[o + RECORD_HEADER : o + record_bytes] = payload
    with open(file, "wb") as fh:
        fh.write(data)
    return len(records)


@pytest.mark.parametrize("secret", [True, False], ids=["with-secret", "no-secret"])
def test_planted_records_are_rejected_with_a_secret(tmp_path, monkeypatch, secret):
    expected, _ = run(tmp_path / "ref")
    env = None
    if secret:
        monkeypatch.setenv("KVO_SECRET", SECRET)
        env = "KVO_SECRET"
    (tmp_path / "c").mkdir()
    run(tmp_path / "c", env)
    planted = plant(tmp_path / "c")
    tokens, stats = run(tmp_path / "c", env)
    rejected = stats["connector"]["tier_rejected_blocks"]
    if secret:
        assert tokens == expected
        assert rejected == {"disk": {"auth": planted}}
        assert stats["prefix_hit_tokens"]["disk"] == 0
    else:
        assert tokens != expected and not rejected


def test_a_new_secret_starts_a_new_cache_instead_of_rejecting_the_old_one(tmp_path, monkeypatch):
    monkeypatch.setenv("KVO_A", SECRET)
    monkeypatch.setenv("KVO_B", SECRET[::-1])
    run(tmp_path, "KVO_A")
    _, stats = run(tmp_path, "KVO_B")
    assert stats["connector"]["tier_blocks_recovered"]["disk"] == 0 and not stats["connector"]["tier_rejected_blocks"]
    assert len([p for p in os.listdir(tmp_path) if p.endswith(".kvdata")]) == 2


def test_tagger_covers_namespace_key_and_payload():
    t = RecordTagger(SECRET.encode(), "ns", "hmac-sha256")
    tag = t.tag(b"k", b"payload")
    assert t.check(b"k", b"payload", tag)
    assert not t.check(b"k", b"payloaD", tag)
    assert not t.check(b"j", b"payload", tag)
    assert not RecordTagger(SECRET.encode(), "other", "hmac-sha256").check(b"k", b"payload", tag)
    assert not RecordTagger(SECRET[::-1].encode(), "ns").check(b"k", b"payload", tag)
    assert not RecordTagger().check(b"k", b"payload", tag)  # an unkeyed checksum is no MAC
    assert t.key_id != RecordTagger(SECRET[::-1].encode()).key_id and SECRET not in t.key_id


def test_auth_config_errors_name_the_key_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("KVO_UNSET", raising=False)
    with pytest.raises(ConfigError, match=r"auth.secret_env: environment variable KVO_UNSET is not set"):
        AuthConfig(secret_env="KVO_UNSET").load_secret()
    with pytest.raises(ConfigError, match=r"auth.secret_file: cannot read .*missing"):
        AuthConfig(secret_file=str(tmp_path / "missing")).load_secret()
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ConfigError, match=r"holds 3 bytes; a secret needs at least 16"):
        AuthConfig(secret_file=str(tmp_path / "short")).load_secret()
    with pytest.raises(ConfigError, match=r"auth.secret: unknown key \(the secret itself never goes in the config\)"):
        parse_auth({"secret": "hunter2"})
    with pytest.raises(ConfigError, match=r"auth: give secret_file or secret_env, not both"):
        parse_auth({"secret_file": "a", "secret_env": "B"})
    with pytest.raises(ConfigError, match=r"auth.algorithm: 'md5'"):
        parse_auth({"secret_env": "B", "algorithm": "md5"})
    with pytest.raises(ConfigError, match=r"auth.secret_env: environment variable KVO_UNSET is not set"):
        LLM(EngineConfig(kv_offload=kv(tmp_path, "KVO_UNSET")))
