"""Test support shipped with the package: fault-injecting handlers and the chaos harness.

Nothing in the serving path imports this package; faults enter only through the
``FaultyOffloadingSpec`` a test (or ``kvoffload bench chaos``) names in its config.
"""
