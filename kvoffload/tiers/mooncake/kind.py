"""The ``medium: mooncake`` tier kind: a Mooncake Store shared by every replica pointed at one
master, behind the CPU tier (and disk). Blocks are values under namespaced keys (StoreKeys);
the scheduler asks the store what it holds (StoreLookups, its own client lending no memory);
each worker stores and loads its shard through registered staging memory (StoreIO, a client
that lends ``segment`` bytes of DRAM to the store).

The tier is written through by default: a replica shares every block it computes, not only
its CPU victims, which is what makes the store useful to the other replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kvoffload.auth import RecordTagger
from kvoffload.config import TierConfig, format_bytes
from kvoffload.errors import ConfigError
from kvoffload.tiers.base import TierContext, TierKind
from kvoffload.tiers.mooncake.options import OPTION_KEYS, MooncakeOptions, parse_options
from kvoffload.tiers.mooncake.spec import MOONCAKE, MooncakeLoadStoreSpec
from kvoffload.tiers.mooncake.store import MooncakeStore
from kvoffload.tiers.store.io import StoreIO
from kvoffload.tiers.store.keys import StoreKeys
from kvoffload.tiers.store.lookups import StoreLookups
from kvoffload.tiers.store.record import HEADER_BYTES
from kvoffload.tiers.store.tier import SharedStoreTier

logger = logging.getLogger(__name__)


class MooncakeKind(TierKind):
    medium = MOONCAKE
    spec_type = MooncakeLoadStoreSpec
    option_keys = OPTION_KEYS
    last_in_chain = True
    default_write_through = True

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], key: str) -> MooncakeOptions:
        return parse_options(raw, key)

    @classmethod
    def default_capacity(cls, options: Any) -> int | None:
        """What this process tracks as being in the store: by default, the memory it lends."""
        capacity: int | None = options.segment or options.local_buffer
        return capacity

    @classmethod
    def check_environment(cls, tier: TierConfig, key: str) -> list[str]:
        MooncakeStore.connect(tier.options, key, lend_segment=False).close()
        return []

    @property
    def options(self) -> MooncakeOptions:
        options: MooncakeOptions = self.ctx.tier.options
        return options

    def __init__(self, ctx: TierContext) -> None:
        super().__init__(ctx)
        self._secret = ctx.auth.load_secret()
        self._tagger = RecordTagger(self._secret, "", ctx.auth.algorithm)  # the key name carries the namespace

    def keys(self) -> StoreKeys:
        return self.ctx.store_keys(self._tagger.key_id)

    def build_manager(self) -> SharedStoreTier:
        if not self._tagger.authenticated:
            logger.warning("kvoffload: %s (mooncake) has no auth secret: any client of the store can plant KV that "
                           "this engine serves; set auth.secret_file or auth.secret_env (see docs/production.md, "
                           "Security)", self.ctx.key)
        else:
            logger.info("kvoffload: %s (mooncake): records authenticated with %s, secret id %s", self.ctx.key,
                        self._tagger.algorithm, self._tagger.key_id)
        store = MooncakeStore.connect(self.options, self.ctx.key, lend_segment=False)
        lookups = StoreLookups(store, self.keys())
        return SharedStoreTier(self.spec_type, lookups, self.ctx.num_slots, self.options.retry_after_s,
                               name=f"mooncake tier ({store.name})", enable_events=self.ctx.events,
                               block_size=self.ctx.block_tokens)

    def build_io(self) -> StoreIO:
        opts = self.options
        record = HEADER_BYTES + self.ctx.block_bytes
        if opts.local_buffer < record:
            raise ConfigError(f"{self.ctx.key}.local_buffer: {format_bytes(opts.local_buffer)} holds no {record}-byte "
                              f"block record; raise it to at least {format_bytes(64 * record)}")
        store = MooncakeStore.connect(opts, self.ctx.key, lend_segment=True)
        try:
            return StoreIO(store, self.keys(), self.ctx.rank, self.ctx.block_bytes, opts.local_buffer, self._tagger,
                           unreachable_hold_s=opts.retry_after_s)
        except BaseException:
            store.close()
            raise
