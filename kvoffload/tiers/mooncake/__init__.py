"""The Mooncake Store tier kind, whole: ``kind`` (the two halves), ``options`` (its config keys
and environment checks), ``store`` (the client, behind the generic key-value store contract).
The store-backed machinery it shares with any key-value tier (``kvoffload.kv_store``, the
remote ledger and the store I/O) stays generic, below the tiers."""
