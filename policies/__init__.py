"""Research eviction policies, trace loaders and the trace-replay simulator.

Every policy here implements ``kvoffload.offload.CachePolicy`` at the hash level (plain
``hash -> BlockStatus`` maps) and is registered under the ``kvoffload.policies`` entry-point
group, so ``eviction_policy: s3fifo`` works in any config.
"""
