"""The Mooncake Store tier kind, whole: ``kind`` (the two halves), ``options`` (its config keys
and environment checks), ``store`` (the client, behind the key-value store contract), ``spec``
(its medium). The store-backed machinery it shares with every shared tier (the store
contract, keys, lookups, the scheduler and worker halves) is ``kvoffload.tiers.store``."""
