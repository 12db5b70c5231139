"""The shared-store tier, whole: a tier whose index lives in a key-value store other replicas
write too (Mooncake Store, a shared fs directory). A tier author reads this package and the
``Tier`` contract (``kvoffload.offload.tier``), nothing else:

- ``kv_store``: the contract a store implements (batched exists / put / get / remove);
- ``keys``: each block's key (model, layout, block size, parallel layout, rank, hash);
- ``tier``: the scheduler half, ``SharedStoreTier`` (no slots of its own: what lookups found
  and its writes in flight), and ``lookups``, the background batched query it asks;
- ``io``: the worker half (``StoreIO``), ``record`` (the value: header + block, checked on
  read) and ``staging`` (host memory registered with the store once).

A kind built on it (``tiers/mooncake``, ``tiers/fs``) adds its store client and config keys.
"""
