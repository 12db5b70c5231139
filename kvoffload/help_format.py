"""How the command line's ``--help`` shows defaults: once, and only where there is one."""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says what the default is, or there is
    none (``None``: argparse's "(default: None)" told users nothing, twice where the help
    had said it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default" in text or action.default is None else super()._get_help_string(action) or ""
