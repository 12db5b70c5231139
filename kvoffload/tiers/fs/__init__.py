"""The ``medium: fs`` tier kind, whole: a cache directory (or several, one per drive) shared by
any number of engine processes on one host or many, with no coordinator. ``kind`` (the two
halves), ``options`` (its config keys and environment checks), ``directory`` (the on-disk
layout and its shared metadata), ``bucket`` (a locked, size-bounded slice of a directory),
``store`` (the key-value store contract over files). Lookups, records, health and
backpressure are the store-backed machinery every shared tier uses (``kvoffload.tiers.store``)."""
