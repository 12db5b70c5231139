import subprocess
import sys

import pytest

from kvoffload.engine.hashing import hash_block_tokens, hash_request_blocks
from kvoffload.engine.request import Request
from kvoffload.engine.sampling_params import SamplingParams

SCRIPT = (
    "from kvoffload.engine.hashing import hash_request_blocks;"
    "print(','.join(h.hex() for h in hash_request_blocks(list(range(40)), 16, ('salt',))))"
)


def test_hashes_identical_across_processes():
    runs = {subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout for seed in (1, 2)}
    assert len(runs) == 1
    here = ",".join(h.hex() for h in hash_request_blocks(list(range(40)), 16, ("salt",)))
    assert runs.pop().strip() == here


def test_chain_depends_on_parent_tokens_and_extra_keys():
    base = hash_request_blocks(list(range(32)), 16)
    assert len(base) == 2
    assert hash_request_blocks(list(range(32)), 16) == base
    changed_first = hash_request_blocks([99] + list(range(1, 32)), 16)
    assert changed_first[0] != base[0] and changed_first[1] != base[1]  # parent changed → child changed
    salted = hash_request_blocks(list(range(32)), 16, ("tenant-a",))
    assert salted[0] != base[0] and salted[1] != base[1]
    assert hash_block_tokens(base[0], list(range(16, 32))) == base[1]


def test_partial_blocks_never_hashed_and_incremental_growth():
    req = Request("r", list(range(20)), SamplingParams(), block_size=16)
    assert len(req.block_hashes) == 1
    for t in range(11):
        req.append_output_token_ids(100 + t)
    assert req.num_tokens == 31 and len(req.block_hashes) == 1
    req.append_output_token_ids(7)
    assert len(req.block_hashes) == 2
    assert req.block_hashes == hash_request_blocks(req.all_token_ids, 16)


def test_cache_salt_only_in_first_block():
    a = Request("a", list(range(32)), SamplingParams(), block_size=16, cache_salt="s1")
    b = Request("b", list(range(32)), SamplingParams(), block_size=16, cache_salt="s2")
    assert a.block_hashes[0] != b.block_hashes[0]
    assert a.block_hashes[1] == hash_block_tokens(a.block_hashes[0], list(range(16, 32)))


def test_bad_extra_key_type():
    with pytest.raises(TypeError, match="float"):
        hash_block_tokens(None, [1, 2], (1.5,))
