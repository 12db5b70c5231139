"""``kvoffload plan``: size the tiers before buying them, by replaying a request log through the
device cache and a tier chain with measured speeds (see docs/plan.md)."""
