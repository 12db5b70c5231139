"""The load-cost model: whether a hit is loaded (layer-wise, asynchronously, in part) or
recomputed, from measured tier throughputs, step times and queues. Tensor-free."""
