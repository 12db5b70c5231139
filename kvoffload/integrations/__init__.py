"""Adapters for other engines (imported only when that engine is installed)."""
