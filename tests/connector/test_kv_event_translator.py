"""KVEventTranslator: tier events become vLLM-schema KV events a router can index (exact hashes,
parents, tokens, media), announced once per event medium and removed when no tier holds them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvoffload.connector.scheduler.kv_event_translator import EventTags, KVEventTranslator
from kvoffload.kv_events import BlockRemoved, BlockStored, external_block_hash
from kvoffload.offload.abstract import OffloadingEvent
from kvoffload.offload.mediums import DISK
from kvoffload.tiers.fs.spec import FS
from kvoffload.tiers.mooncake.spec import MOONCAKE

BS, F = 4, 2  # engine block size, engine blocks per offloaded block


@dataclass
class Req:
    all_token_ids: list[int]
    request_id: str = "r"
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.all_token_ids) // BS
        self.block_hashes = [bytes([i + 1]) * 16 for i in range(n)]

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    num_computed_tokens = 0


def ev(keys, medium="CPU", removed=False):
    return OffloadingEvent(list(keys), BS * F, medium, removed)


def book(**kw) -> KVEventTranslator:
    return KVEventTranslator(True, BS, F, **kw)


def ext(req: Req, *engine_blocks: int) -> list[int]:
    return [external_block_hash(req.block_hashes[i]) for i in engine_blocks]


def test_a_stored_block_carries_its_engine_hashes_parent_and_tokens():
    req = Req(list(range(100, 124)))  # 6 engine blocks, 3 offloaded blocks
    b = book(request_tags=lambda r: EventTags(lora_id=3, lora_name="ad", session_id="s1"))
    b.describe(req, 0, [(1, "k1"), (2, "k2")])
    b.absorb([ev(["k1", "k2"])], set)
    assert b.take() == [
        BlockStored(block_hashes=ext(req, 2, 3), parent_block_hash=ext(req, 1)[0], token_ids=list(range(108, 116)),
                    block_size=BS, lora_id=3, medium="CPU", lora_name="ad", group_idx=0, locality="LOCAL",
                    session_id="s1"),
        BlockStored(block_hashes=ext(req, 4, 5), parent_block_hash=ext(req, 3)[0], token_ids=list(range(116, 124)),
                    block_size=BS, lora_id=3, medium="CPU", lora_name="ad", group_idx=0, locality="LOCAL",
                    session_id="s1")]
    b.describe(req, 0, [(0, "k0")])
    b.absorb([ev(["k0"]), ev(["k0", "k1"], removed=True)], set)
    stored, removed = b.take()
    assert stored.parent_block_hash is None and stored.token_ids == list(range(100, 108))
    assert removed == BlockRemoved(block_hashes=ext(req, 0, 1, 2, 3), medium="CPU", group_idx=0, locality="LOCAL")
    assert external_block_hash(req.block_hashes[0]) == int.from_bytes(b"\x01" * 16, "big") & (2**64 - 1)


def test_a_demoted_block_moves_from_host_to_disk_and_its_description_goes_with_the_last_copy():
    req = Req(list(range(8)))
    b = book()
    b.describe(req, 0, [(0, "k")])
    b.absorb([ev(["k"]), ev(["k"], removed=True), ev(["k"], DISK)], set)  # CPU evicted, disk store lands
    assert [(type(e).__name__, e.medium) for e in b.take()] == [
        ("BlockStored", "CPU"), ("BlockRemoved", "CPU"), ("BlockStored", "DISK")]
    assert "k" in b._described
    b.absorb([ev(["k"], DISK, removed=True)], set)
    assert [(type(e).__name__, e.medium) for e in b.take()] == [("BlockRemoved", "DISK")]
    assert b._described == {}
    b.absorb([ev(["k"], DISK, removed=True)], set)  # a second removal: nothing to say
    assert b.take() == []


def test_two_tiers_of_one_event_medium_announce_once_and_remove_when_both_are_gone():
    """Routers do not count announcements: the first removal of a hash in a medium forgets it."""
    req = Req(list(range(8)))
    b = book()
    b.describe(req, 0, [(0, "k")])
    b.absorb([ev(["k"], FS), ev(["k"], MOONCAKE)], set)
    (stored,) = b.take()
    assert stored.medium == "SHARED" and stored.locality is None  # every replica reaches it
    b.absorb([ev(["k"], FS, removed=True)], set)
    assert b.take() == []
    b.absorb([ev(["k"], MOONCAKE, removed=True)], set)
    assert b.take() == [BlockRemoved(block_hashes=ext(req, 0, 1), medium="SHARED", group_idx=0, locality=None)]


def test_blocks_never_described_are_not_published_and_counted():
    b = book()
    b.absorb([ev(["stranger"]), ev(["stranger"], removed=True)], set)
    assert b.take() == [] and b.num_undescribed == 1


def test_a_description_lives_while_a_copy_moves_it_and_goes_when_none_holds_it():
    req = Req(list(range(8)))
    b = book()
    b.describe(req, 0, [(0, "k")])
    b.absorb([], lambda: {"k"})  # its store is in flight
    assert "k" in b._described
    b.absorb([], set)  # the store failed: no tier holds it, no copy moves it
    assert b._described == {} and b.take() == []


def test_a_reset_removes_every_announced_block_in_each_medium_and_forgets_the_old_keys():
    req = Req(list(range(16)))
    b = book()
    b.describe(req, 0, [(0, "a"), (1, "b")])
    b.describe(req, 1, [(0, "g1")])
    b.absorb([ev(["a", "b", "g1"]), ev(["a"], DISK)], set)
    b.take()
    b.reset()
    removed = b.take()
    assert sorted((e.medium, e.group_idx, tuple(e.block_hashes)) for e in removed) == sorted([
        ("CPU", 0, tuple(ext(req, 0, 1, 2, 3))), ("CPU", 1, tuple(ext(req, 0, 1))), ("DISK", 0, tuple(ext(req, 0, 1)))])
    b.absorb([ev(["a", "b"], removed=True), ev(["a"], DISK, removed=True)], set)  # old keys leave the tiers later
    assert b.take() == []


def test_a_disabled_book_describes_and_publishes_nothing():
    b = KVEventTranslator(False, BS, F)
    b.describe(Req(list(range(8))), 0, [(0, "k")])
    b.absorb([ev(["k"])], set)
    assert b.take() == [] and b._described == {}


def test_an_undrained_queue_stays_bounded(monkeypatch, caplog):
    import kvoffload.connector.scheduler.kv_event_translator as mod

    monkeypatch.setattr(mod, "MAX_QUEUED_KV_EVENTS", 3)
    req = Req(list(range(8)))
    b = book()
    b.describe(req, 0, [(0, "k")])
    for _ in range(3):
        b.absorb([ev(["k"]), ev(["k"], removed=True)], lambda: {"k"})
    assert len(b.take()) == 3 and b.num_events_dropped == 3
    assert sum("dropping the oldest" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("bad", [None, 1.5, "x"])
def test_an_engine_hash_is_bytes_or_an_int(bad):
    with pytest.raises(TypeError, match="block hash"):
        external_block_hash(bad)
