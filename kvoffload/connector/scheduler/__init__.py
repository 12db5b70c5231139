"""The scheduler half: one record per request, the planners of a step's loads, stores and
swaps, hints, KV events and counters. Tensor-free: it runs in the engine's scheduler process."""
