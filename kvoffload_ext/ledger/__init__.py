"""The block ledger in C (``_ledger``, built from ``_ledger.c`` and the ``ledger_*.h`` headers by
``pip install``; optional: without a compiler the install succeeds and the Python ledger runs).
The host and disk tiers' slot bookkeeping and the LRU, ARC, textbook-ARC and prefix-value orders,
one C call per run of hashes; ``kvoffload.offload.native_ledger`` binds it to a tier."""
