"""zram_tier: a kvoffload tier kind written outside kvoffload, as docs/write-a-tier.md teaches.

Blocks evicted from the host tier are kept zlib-compressed in the worker's memory: KV caches
of a model with many repeated or zero rows compress, so the same RAM holds more blocks. Three
files: ``tier.py`` (the scheduler half: its medium, spec and ledger), ``io.py`` (the worker
half: keyed, checked records) and ``kind.py`` (the plugin that builds both), plus the entry
point in ``pyproject.toml``. Not for serving across processes: the records die with the worker.
"""
