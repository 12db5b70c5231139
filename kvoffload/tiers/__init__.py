"""Tier wiring: the built-in spec (a CPU tier, then any chain of secondary tiers) and the tier
kinds, each a plugin naming a medium's scheduler-side manager and worker-side handlers.

This layer sits above ``offload/`` (ledgers) and ``transfer/`` (copies), the only place both
meet.
"""
