"""Build configuration beyond pyproject.toml: the optional native ledger (kvoffload_ext.ledger._ledger).

``optional=True``: without a C compiler or Python headers the install still succeeds and
kvoffload uses its pure-Python ledger (logged once at start-up).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kvoffload_ext.ledger._ledger", ["kvoffload_ext/ledger/_ledger.c"], optional=True,
                             depends=["kvoffload_ext/ledger/ledger_containers.h", "kvoffload_ext/ledger/ledger_policy.h",
                                      "kvoffload_ext/ledger/ledger_prefix_value.h", "kvoffload_ext/ledger/ledger_keys.h",
                                      "kvoffload_ext/ledger/ledger_stores.h", "kvoffload_ext/ledger/ledger_lifecycle.h",
                                      "kvoffload_ext/ledger/ledger_pv_policy.h", "kvoffload_ext/ledger/ledger_state.h"],
                             extra_compile_args=["-O2", "-std=c11"])])
